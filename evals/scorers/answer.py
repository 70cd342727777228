"""Numeric and exact final answers (math).

Gaming this scorer means offering several answers and hoping one is read. So:

* the answer is the text after an explicit marker (``#### 42``, ``\\boxed{42}``, "The answer
  is 42", "Answer: 42"); every marker of that kind must agree;
* that text must hold exactly one number ("18 or 19", "18-19", "between 18 and 19" fail);
* without any marker, the whole output must hold exactly one number;
* numbers are compared as exact fractions after normalisation (``1,000`` = ``1000``,
  ``0.50`` = ``.5``, ``3/4`` = ``0.75``, ``$5`` = ``5``, ``50%`` = ``50``), or within a
  relative ``tolerance`` when the item gives one.
"""

from __future__ import annotations

import re
from fractions import Fraction

from evals.items import AnswerSpec
from evals.scorers.base import Score, clean, final_answers, too_long

# A number: optional sign, digits with optional thousands groups or a bare decimal part,
# optional fraction "/d" or exponent. Thousands groups need exactly three digits each, so
# "1,2" is two numbers, not twelve.
NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-−+]?)\$?(?P<int>\d{1,3}(?:,\d{3})+|\d+)?(?P<frac>\.\d+)?"
    r"(?:\s*/\s*(?P<den>\d+))?(?:[eE](?P<exp>[-+]?\d{1,3}))?(?![\w])"
)


def numbers(text: str) -> list[Fraction]:
    found: list[Fraction] = []
    for m in NUMBER.finditer(text):
        if not m.group("int") and not m.group("frac"):
            continue
        value = Fraction((m.group("int") or "0").replace(",", "") + (m.group("frac") or ""))
        if m.group("den") is not None:
            den = int(m.group("den"))
            if den == 0:
                continue
            value /= den
        if m.group("exp") is not None:
            value *= Fraction(10) ** int(m.group("exp"))
        found.append(-value if m.group("sign") in ("-", "−") else value)
    return found


def parse_number(text: str) -> Fraction | None:
    found = numbers(clean(text))
    return found[0] if len(found) == 1 else None


def _close(got: Fraction, want: Fraction, tolerance: float) -> bool:
    if tolerance == 0:
        return got == want
    return abs(got - want) <= Fraction(tolerance) * max(abs(want), Fraction(1, 10**12))


def _normal_text(text: str) -> str:
    return " ".join(text.casefold().split()).strip(" .!?;:\"'`*")


def score_answer(spec: AnswerSpec, output: str) -> Score:
    if (long := too_long(output)) is not None:
        return long
    text = clean(output)
    marked = final_answers(text)
    if spec.mode == "exact":
        candidates = {_normal_text(a) for a in marked} if marked else {_normal_text(text)}
        if len(candidates) != 1:
            return Score.fail(f"{len(candidates)} different final answers")
        got = candidates.pop()
        want = _normal_text(spec.answer)
        return (
            Score.ok(f"answer {got!r}") if got == want else Score.fail(f"answer {got!r}, expected {want!r}")
        )
    want_n = parse_number(spec.answer)
    if want_n is None:
        return Score.fail(f"the reference answer {spec.answer!r} is not one number")
    if marked:
        values = [numbers(a) for a in marked]
        if any(len(v) != 1 for v in values):
            bad = next(a for a, v in zip(marked, values, strict=True) if len(v) != 1)
            return Score.fail(f"the final answer {bad[:80]!r} does not hold exactly one number")
        distinct = {v[0] for v in values}
        if len(distinct) != 1:
            return Score.fail(f"{len(distinct)} different final answers")
        value = distinct.pop()
    else:
        found = set(numbers(text))
        if len(found) != 1:
            return Score.fail(f"no marked final answer and {len(found)} different numbers in the output")
        value = found.pop()
    shown = f"{float(value):g}" if value.denominator != 1 else str(value.numerator)
    if _close(value, want_n, spec.tolerance):
        return Score.ok(f"answer {shown}")
    return Score.fail(f"answer {shown}, expected {spec.answer}")
