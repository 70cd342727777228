"""Instruction-following constraints (IFEval's instruction ids and keyword arguments).

Every check runs on the NFKC-normalised output without zero-width characters, so they
cannot split words or hide letters. Where IFEval's own check can be satisfied by a
degenerate reply, this one is stricter, and says so here:

* ``detectable_format:constrained_response`` — exactly one of the allowed answers (IFEval
  accepts a reply that lists all three);
* placeholders, highlights, titles and bullets count only when they hold text;
* ``punctuation:no_comma`` also refuses the full-width, ideographic and low-9 commas;
* ``combination:two_responses`` needs two different, non-empty replies;
* ``keywords:*`` match whole words, case-insensitively.

An unknown instruction id, or a language that cannot be checked offline, fails (fail closed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from evals.items import Constraint, ConstraintsSpec
from evals.scorers.base import Score, clean, too_long
from evals.scorers.language import is_language

_WORDS = re.compile(r"\w+(?:['’-]\w+)*")
_SENTENCE_END = re.compile(r"[.!?]+[\"'’”)\]*_]*(?=\s|$)")
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "st", "vs", "etc", "e.g", "i.e", "no", "fig", "p.s", "p.p.s"}
)
_COMMAS = ",，、‚﹐﹑､٬"
CONSTRAINED = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
Check = Callable[[str, dict[str, Any]], tuple[bool, str]]


def _relation(count: int, kw: dict[str, Any], value_key: str, rel_key: str) -> tuple[bool, str]:
    target = int(kw[value_key])
    relation = kw.get(rel_key, "at least")
    if relation == "less than":
        return count < target, f"{count} (needs < {target})"
    if relation == "at least":
        return count >= target, f"{count} (needs >= {target})"
    raise ValueError(f"unknown relation {relation!r}")


def _word(word: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + re.escape(word) + r"(?!\w)", re.IGNORECASE)


def words(text: str) -> list[str]:
    return _WORDS.findall(text)


def sentences(text: str) -> int:
    """Sentences end at . ! ? before a space or the end, except after an abbreviation or a
    single capital (an initial)."""
    count, start = 0, 0
    for m in _SENTENCE_END.finditer(text):
        before = text[start : m.start()].split()
        last = before[-1].lower() if before else ""
        if (
            m.group(0).startswith(".")
            and m.group(0).rstrip("\"'’”)]*_") == "."
            and (last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()))
        ):
            continue
        if _WORDS.search(text[start : m.start()]):
            count += 1
        start = m.end()
    return count + (1 if _WORDS.search(text[start:]) else 0)


def _existence(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    missing = [k for k in kw["keywords"] if not _word(k).search(text)]
    return not missing, f"missing {missing}" if missing else "all keywords present"


def _frequency(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    return _relation(len(_word(kw["keyword"]).findall(text)), kw, "frequency", "relation")


def _forbidden(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    found = [k for k in kw["forbidden_words"] if _word(k).search(text)]
    return not found, f"forbidden {found}" if found else "no forbidden word"


def _letters(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    return _relation(text.lower().count(str(kw["letter"]).lower()), kw, "let_frequency", "let_relation")


def _language(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    return is_language(text, str(kw["language"]))


def _sentences(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    return _relation(sentences(text), kw, "num_sentences", "relation")


def _paragraphs_stars(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    parts = [p.strip() for p in re.split(r"\s?\*\*\*\s?", text)]
    if any(not p for p in parts[1:-1]) or not words(text):
        return False, "an empty paragraph"
    count = len([p for p in parts if p])
    return count == int(kw["num_paragraphs"]), f"{count} paragraphs"


def _words(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    return _relation(len(words(text)), kw, "num_words", "relation")


def _nth_first_word(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    if len(paragraphs) != int(kw["num_paragraphs"]):
        return False, f"{len(paragraphs)} paragraphs"
    nth = int(kw["nth_paragraph"])
    first = words(paragraphs[nth - 1])[:1] if 0 < nth <= len(paragraphs) else []
    ok = bool(first) and first[0].lower() == str(kw["first_word"]).lower()
    return ok, f"paragraph {nth} starts with {first[0] if first else None!r}"


def _count(pattern: str, key: str, exact: bool = False) -> Check:
    compiled = re.compile(pattern, re.MULTILINE)

    def check(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
        n = len(compiled.findall(text))
        want = int(kw[key])
        return (n == want if exact else n >= want), f"{n} found (needs {'' if exact else '>= '}{want})"

    return check


def _postscript(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    marker = re.escape(str(kw.get("postscript_marker", "P.S.")).strip())
    ok = re.search(r"(?im)^\s*" + marker + r"\s*\w", text) is not None
    return ok, "postscript found" if ok else "no postscript"


def _constrained(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    present = [c for c in CONSTRAINED if c in text]
    return len(present) == 1, f"{len(present)} of the allowed answers present"


def _sections(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    splitter = re.escape(str(kw["section_spliter"]).strip())
    parts = re.split(r"\s?" + splitter + r"\s?\d+\s?", text)
    filled = [p for p in parts[1:] if words(p)]
    return len(filled) >= int(kw["num_sections"]), f"{len(filled)} non-empty sections"


def _json(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    body = re.sub(r"^```(?:json|JSON)?\s*|\s*```$", "", text.strip())
    try:
        json.loads(body)
    except ValueError:
        return False, "not JSON"
    return True, "JSON"


def _two_responses(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    parts = [p.strip() for p in text.split("******")]
    ok = len(parts) == 2 and all(words(p) for p in parts) and parts[0] != parts[1]
    return ok, f"{len(parts)} parts" + ("" if ok else " (needs two different, non-empty)")


def _repeat_prompt(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    ok = text.strip().lower().startswith(clean(str(kw["prompt_to_repeat"])).strip().lower())
    return ok, "starts with the prompt" if ok else "does not start with the prompt"


def _end(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    ok = text.strip().lower().endswith(clean(str(kw["end_phrase"])).strip().lower())
    return ok, "ends with the phrase" if ok else "does not end with the phrase"


def _quotation(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    t = text.strip()
    ok = len(t) > 2 and t[0] == '"' and t[-1] == '"' and bool(words(t))
    return ok, "wrapped in double quotes" if ok else "not wrapped in double quotes"


def _capital_words(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    caps = [w for w in words(text) if w.isupper()]
    return _relation(len(caps), kw, "capital_frequency", "capital_relation")


def _case(upper: bool) -> Check:
    def check(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
        letters = [c for c in text if c.isalpha()]
        ok = bool(letters) and all(
            c.isupper() if upper else c.islower() for c in letters if c.upper() != c.lower()
        )
        return ok, ("all upper case" if upper else "all lower case") if ok else "mixed case"

    return check


def _no_comma(text: str, kw: dict[str, Any]) -> tuple[bool, str]:
    found = [c for c in text if c in _COMMAS]
    return not found, f"{len(found)} commas" if found else "no comma"


CHECKS: dict[str, Check] = {
    "keywords:existence": _existence,
    "keywords:frequency": _frequency,
    "keywords:forbidden_words": _forbidden,
    "keywords:letter_frequency": _letters,
    "language:response_language": _language,
    "length_constraints:number_sentences": _sentences,
    "length_constraints:number_paragraphs": _paragraphs_stars,
    "length_constraints:number_words": _words,
    "length_constraints:nth_paragraph_first_word": _nth_first_word,
    "detectable_content:number_placeholders": _count(r"\[[^\[\]\n]*\w[^\[\]\n]*\]", "num_placeholders"),
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _count(r"^[ \t]*(?:\*|-)[ \t]+\S.*$", "num_bullets", exact=True),
    "detectable_format:constrained_response": _constrained,
    "detectable_format:number_highlighted_sections": _count(
        r"(?<!\*)(\*\*|\*)(?!\s)[^\n*]*\w[^\n*]*(?<!\s)\1(?!\*)", "num_highlights"
    ),
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": _json,
    "detectable_format:title": _count(r"<<[^\n<>]*\w[^\n<>]*>>", "_one"),
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": _repeat_prompt,
    "startend:end_checker": _end,
    "startend:quotation": _quotation,
    "change_case:capital_word_frequency": _capital_words,
    "change_case:english_capital": _case(upper=True),
    "change_case:english_lowercase": _case(upper=False),
    "punctuation:no_comma": _no_comma,
}


def check_constraint(constraint: Constraint, text: str) -> tuple[bool, str]:
    check = CHECKS.get(constraint.kind)
    if check is None:
        return False, f"unknown constraint {constraint.kind!r}"
    kwargs = {"_one": 1, **(constraint.model_extra or {})}
    try:
        return check(text, kwargs)
    except (KeyError, ValueError, TypeError) as exc:
        return False, f"bad arguments for {constraint.kind}: {exc!r}"


def score_constraints(spec: ConstraintsSpec, output: str) -> Score:
    if (long := too_long(output)) is not None:
        return long
    text = clean(output)
    results = [(c.kind, *check_constraint(c, text)) for c in spec.constraints]
    failed = [f"{kind}: {why}" for kind, ok, why in results if not ok]
    share = (len(results) - len(failed)) / len(results)
    if failed:
        return Score.fail("; ".join(failed)[:500], share)
    return Score.ok(f"{len(results)} constraints met")
