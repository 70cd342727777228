"""Regular-expression answers (multiple choice, formats).

``fullmatch`` (default) needs the whole final answer to match, so listing options ("A or
B") fails; ``search`` needs exactly one distinct match (``unique``), so a list of every
option fails too; any ``forbid`` pattern found anywhere in the output fails. Patterns come
from the dataset (trusted); the output is capped at MAX_OUTPUT_CHARS.
"""

from __future__ import annotations

import re

from evals.items import RegexSpec
from evals.scorers.base import Score, clean, final_answers, too_long


def score_regex(spec: RegexSpec, output: str) -> Score:
    if (long := too_long(output)) is not None:
        return long
    text = clean(output)
    flags = re.IGNORECASE if spec.ignore_case else 0
    for bad in spec.forbid:
        if re.search(bad, text, flags):
            return Score.fail(f"forbidden pattern {bad!r} found")
    if spec.target == "final_answer":
        marked = final_answers(text)
        if len({m.strip() for m in marked}) > 1:
            return Score.fail(f"{len(set(marked))} different final answers")
        target = marked[0].strip().rstrip(".") if marked else text.strip()
    else:
        target = text
    pattern = re.compile(spec.pattern, flags)
    if spec.mode == "fullmatch":
        if pattern.fullmatch(target):
            return Score.ok("matches")
        return Score.fail(f"{target[:80]!r} does not match {spec.pattern!r}")
    found = {m.group(0) for m in pattern.finditer(target)}
    if not found:
        return Score.fail(f"no match for {spec.pattern!r}")
    if spec.unique and len(found) > 1:
        return Score.fail(f"{len(found)} different matches: {sorted(found)[:5]}")
    return Score.ok(f"matches {sorted(found)[0][:80]!r}")
