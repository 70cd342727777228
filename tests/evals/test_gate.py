"""The gate decision (pure): verdicts with reasons, fail-closed edges, calibration and power."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from evals.gate import CategoryResults, OfflineGate, category_results, decide

GATE = OfflineGate(suites=("demo",), min_items=20)


def results(category: str, base: list[int], cand: list[int]) -> CategoryResults:
    return CategoryResults(category, tuple(map(float, base)), tuple(map(float, cand)))


def paired(n: int, base_pass: int, cand_pass: int) -> tuple[list[int], list[int]]:
    """n items; the first ``base_pass`` pass for the baseline, the first ``cand_pass`` for the candidate."""
    return [1] * base_pass + [0] * (n - base_pass), [1] * cand_pass + [0] * (n - cand_pass)


def test_a_clear_regression_beyond_the_margin_is_forgetting_named_with_its_points() -> None:
    code = results("code", *paired(60, 48, 33))
    math_ = results("math", *paired(60, 42, 54))
    d = decide(GATE, [code, math_])
    assert not d.passed
    assert d.reasons == ("forgetting: code −25.0 pts (p=6.1e-05, margin 5.0 pts)",)
    assert [v.verdict for v in d.categories] == ["forgetting", "pass"]


def test_a_small_drop_within_the_margin_passes() -> None:
    d = decide(GATE, [results("code", *paired(100, 80, 77))])
    assert d.passed, d.reasons


def test_a_drop_beyond_the_margin_that_is_not_significant_passes_unless_noninferiority_is_required() -> None:
    small = results("code", *paired(20, 12, 10))
    assert decide(GATE, [small]).passed
    strict = GATE.model_copy(update={"require_noninferiority": True})
    d = decide(strict, [small])
    assert not d.passed and d.categories[0].verdict == "not_noninferior"


def test_too_few_items_or_no_items_fail_closed() -> None:
    d = decide(GATE, [results("code", *paired(10, 5, 5))])
    assert not d.passed and d.categories[0].verdict == "insufficient"
    assert not decide(GATE, []).passed
    assert decide(GATE, []).reasons == ("no category to compare",)


def test_a_category_without_a_margin_fails_when_there_is_no_default() -> None:
    gate = OfflineGate(suites=("demo",), default_margin=None, margins={"math": 0.05})
    d = decide(gate, [results("math", *paired(30, 20, 20)), results("code", *paired(30, 20, 20))])
    assert not d.passed
    assert d.reasons == ("no margin declared for code",)


def test_minimum_pass_rates_and_required_improvements() -> None:
    gate = OfflineGate(suites=("demo",), min_pass_rates={"json": 0.9}, required_improvements={"math": 0.05})
    d = decide(gate, [results("json", *paired(50, 40, 40)), results("math", *paired(50, 30, 31))])
    assert [v.verdict for v in d.categories] == ["below_minimum", "no_improvement"]
    d = decide(gate, [results("json", *paired(50, 46, 46)), results("math", *paired(50, 25, 40))])
    assert d.passed, d.reasons


def test_problems_fail_the_gate_whatever_the_statistics() -> None:
    d = decide(GATE, [results("code", *paired(60, 40, 40))], ["no completed run of demo for candidate"])
    assert not d.passed and d.reasons[0].startswith("no completed run")


def test_pairing_reports_items_present_in_only_one_run() -> None:
    cats, problems = category_results({"a": ("math", 1.0), "b": ("math", 0.0)}, {"a": ("math", 1.0)})
    assert problems == ["1 items are in only one run (e.g. 'b')"]
    assert cats[0].baseline == (1.0,)


def test_several_samples_per_item_use_the_paired_t_test() -> None:
    base = [0.8] * 15 + [0.6] * 15
    cand = [0.2] * 15 + [0.4] * 15
    d = decide(GATE, [CategoryResults("code", tuple(base), tuple(cand))])
    assert d.categories[0].comparison.test == "paired_t"
    assert d.categories[0].verdict == "forgetting"


def test_declarations_are_validated() -> None:
    with pytest.raises(ValidationError):
        OfflineGate(suites=())
    with pytest.raises(ValidationError):
        OfflineGate(suites=("demo",), margins={"code": 5})  # 5 is not a share of items
    with pytest.raises(ValidationError):
        OfflineGate.model_validate({"suites": ["demo"], "margin": 0.1})  # a typo is an error


def _simulate(rng: random.Random, shifts: dict[str, float], n: int, gate: OfflineGate) -> bool:
    cats = []
    for category, shift in shifts.items():
        difficulty = [rng.random() for _ in range(n)]
        base = [float(rng.random() < d) for d in difficulty]
        cand = [float(rng.random() < min(1.0, max(0.0, d + shift))) for d in difficulty]
        cats.append(CategoryResults(category, tuple(base), tuple(cand)))
    return decide(gate, cats).passed


CATEGORIES = ("math", "code", "json", "instruction_following")


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_identical_models_fail_the_gate_at_most_alpha_of_the_time(margin: float) -> None:
    """A/A calibration: 1,500 gates over 4 categories × 60 items, both models drawing each
    item's pass from the same probability. The failure rate must be ≤ alpha = 5%."""
    rng = random.Random(2026)
    gate = OfflineGate(suites=("demo",), default_margin=margin, alpha=0.05)
    shifts = dict.fromkeys(CATEGORIES, 0.0)
    failures = sum(not _simulate(rng, shifts, 60, gate) for _ in range(1500))
    assert failures / 1500 <= 0.05, failures


def test_a_25_point_code_regression_is_caught_at_120_items_at_least_90_percent_of_the_time() -> None:
    """Power with 4 categories (Holm), default margin 5 pts, items of varying difficulty:
    measured 96% at 120 items (72% at the built-in suite's 60; 87% for −30 pts at 60)."""
    rng = random.Random(7)
    shifts = {**dict.fromkeys(CATEGORIES, 0.0), "code": -0.25}
    blocked = sum(not _simulate(rng, shifts, 120, GATE) for _ in range(400))
    assert blocked / 400 >= 0.90, blocked
