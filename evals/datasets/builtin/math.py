"""Procedural grade-school math with exact answers (seeded: the same items every time).

Twelve templates × five draws. Answers are integers or terminating decimals, several in
the thousands (so "1,234" must equal "1234"). Each item's reference shows its working and
ends with "The answer is N."; its wrong outputs are an off-by-one answer, a hedged pair
("N or N+1") and a reply without any final answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

from evals.datasets.builtin.common import BuiltinItem, make_item

SEED = 20261
INSTRUCTION = "Solve the problem. Finish with a last line of the form 'The answer is N'."
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jon")
Template = Callable[[random.Random], tuple[str, Fraction, str]]


def _change(r: random.Random) -> tuple[str, Fraction, str]:
    price, count = r.randint(3, 19), r.randint(2, 9)
    paid = (price * count // 50 + 1) * 50
    return (f"{r.choice(NAMES)} buys {count} notebooks at ${price} each and pays with ${paid}. "
            "How many dollars of change does the shop give back?",
            Fraction(paid - price * count), f"{count} × {price} = {price * count}; {paid} − {price * count}")  # fmt: skip


def _trip(r: random.Random) -> tuple[str, Fraction, str]:
    v1, t1, v2, t2 = r.randint(40, 120), r.randint(2, 9), r.randint(30, 110), r.randint(2, 9)
    return (f"A truck drives {v1} km/h for {t1} hours, then {v2} km/h for {t2} hours. How many km does it drive?",
            Fraction(v1 * t1 + v2 * t2), f"{v1}·{t1} + {v2}·{t2}")  # fmt: skip


def _percent(r: random.Random) -> tuple[str, Fraction, str]:
    pct, base = r.choice((5, 10, 15, 20, 25, 40, 60, 75)), r.randint(4, 90) * 100
    return (f"A town of {base:,} people grows by {pct}% this year. How many people live there at the end of the year?",
            Fraction(base * (100 + pct), 100), f"{base} · (1 + {pct}/100)")  # fmt: skip


def _linear(r: random.Random) -> tuple[str, Fraction, str]:
    a, x, b = r.randint(2, 12), r.randint(-20, 40), r.randint(-50, 50)
    return f"Solve for x: {a}x + ({b}) = {a * x + b}.", Fraction(x), f"x = ({a * x + b} − ({b}))/{a}"


def _odd_sum(r: random.Random) -> tuple[str, Fraction, str]:
    n = r.randint(20, 90)
    return f"What is the sum of the first {n} odd numbers (1 + 3 + 5 + …)?", Fraction(n * n), f"{n}²"


def _rectangle(r: random.Random) -> tuple[str, Fraction, str]:
    w, h = r.randint(3, 60), r.randint(3, 60)
    return (f"A rectangle has a perimeter of {2 * (w + h)} m and a width of {w} m. What is its area in m²?",
            Fraction(w * h), f"length = {w + h} − {w} = {h}; {w}·{h}")  # fmt: skip


def _fractions(r: random.Random) -> tuple[str, Fraction, str]:
    a, b = r.randint(1, 7), r.choice((2, 4, 5, 8))
    c, d = r.randint(1, 7), r.choice((2, 4, 5, 8))
    value = Fraction(a, b) + Fraction(c, d)
    return f"What is {a}/{b} + {c}/{d}, written as a decimal?", value, f"{a}/{b} + {c}/{d} = {value}"


def _salary(r: random.Random) -> tuple[str, Fraction, str]:
    hourly, hours, weeks = r.randint(15, 45), r.randint(20, 40), r.randint(4, 12)
    return (f"{r.choice(NAMES)} earns ${hourly} an hour and works {hours} hours a week. "
            f"How many dollars does she earn in {weeks} weeks?",
            Fraction(hourly * hours * weeks), f"{hourly}·{hours}·{weeks}")  # fmt: skip


def _ages(r: random.Random) -> tuple[str, Fraction, str]:
    child, gap, years = r.randint(3, 15), r.randint(20, 40), r.randint(2, 20)
    return (f"A mother is {gap} years older than her son, who is {child}. "
            f"How old will the mother be in {years} years?",
            Fraction(child + gap + years), f"{child} + {gap} + {years}")  # fmt: skip


def _boxes(r: random.Random) -> tuple[str, Fraction, str]:
    per_box, items = r.randint(6, 24), r.randint(100, 2000)
    boxes = -(-items // per_box)
    return (f"Each box holds {per_box} jars. What is the smallest number of boxes needed for {items:,} jars?",
            Fraction(boxes), f"ceil({items}/{per_box})")  # fmt: skip


def _average(r: random.Random) -> tuple[str, Fraction, str]:
    scores = [r.randint(50, 100) for _ in range(4)]
    total = sum(scores) + (-sum(scores)) % 5
    last = total - sum(scores)
    values = [*scores, last] if 0 <= last <= 100 else scores
    value = Fraction(sum(values), len(values))
    return (f"A student scores {', '.join(map(str, values))} on {len(values)} tests. What is the mean score?",
            value, f"{sum(values)}/{len(values)}")  # fmt: skip


def _discount(r: random.Random) -> tuple[str, Fraction, str]:
    price, pct, qty = r.randint(20, 400), r.choice((10, 20, 25, 50)), r.randint(2, 30)
    value = Fraction(price * qty * (100 - pct), 100)
    return (f"A lamp costs ${price}. A shop orders {qty} lamps with a {pct}% discount on the whole order. "
            "How many dollars does it pay?", value, f"{price}·{qty}·(1 − {pct}/100)")  # fmt: skip


TEMPLATES: tuple[Template, ...] = (_change, _trip, _percent, _linear, _odd_sum, _rectangle, _fractions,
                                   _salary, _ages, _boxes, _average, _discount)  # fmt: skip


def show(value: Fraction) -> str:
    if value.denominator == 1:
        n = value.numerator
        return f"{n:,}" if abs(n) >= 1000 else str(n)
    return format(float(value), "g")


def items(per_template: int = 5) -> list[BuiltinItem]:
    rng = random.Random(SEED)
    out: list[BuiltinItem] = []
    for round_ in range(per_template):
        for template in TEMPLATES:
            question, answer, working = template(rng)
            index = len(out) + 1
            right, wrong = show(answer), show(answer + 1)
            reference = f"{working} = {right}.\nThe answer is {right}."
            wrongs = (f"{working} = {wrong}.\nThe answer is {wrong}.",
                      f"It is either {right} or {wrong}.\nThe answer is {right} or {wrong}.",
                      "I am not sure how to solve this one.")  # fmt: skip
            out.append(make_item(
                f"math-{index:03d}", "math", f"{question}\n{INSTRUCTION}",
                {"type": "answer", "answer": str(answer) if answer.denominator == 1 else right},
                reference, wrongs, {"template": template.__name__.strip("_"), "round": round_},
            ))  # fmt: skip
    return out
