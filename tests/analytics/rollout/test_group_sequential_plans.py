"""Rollout plans in group-sequential mode (``sequential: {mode: group, …}``): the plan's rules,
the look bookkeeping of :func:`check_group_guardrail`, and the controller's decision rule
simulated under the null (false rollbacks and promotions at alpha) and under alternatives (power)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from analytics.report.catalogue import BUILTINS
from analytics.rollout.check import check_plan
from analytics.rollout.decisions import Look, decide
from analytics.rollout.evidence import GuardrailCheck, SrmLook, check_group_guardrail, look_bin
from analytics.rollout.margins import resolve_margin
from analytics.rollout.plan import GuardrailSpec, PlanError, RolloutPlan, parse_plan
from analytics.stats import SampleStats, group_sequential_design
from contracts.rollout_plan import plan_problems

GROUP = {"mode": "group", "spending": "obrien_fleming", "looks": 5}


def test_a_group_plan_parses_with_its_spending_and_looks_and_defaults_to_obrien_fleming() -> None:
    plan = parse_plan({"sequential": GROUP, "planned_units": 2000})
    assert (plan.sequential.mode, plan.sequential.spending_function, plan.sequential.looks) == (
        "group", "obrien_fleming", 5,
    )  # fmt: skip
    pocock = parse_plan({"sequential": {"mode": "group", "looks": 3}, "planned_units": 900})
    assert pocock.sequential.spending_function == "obrien_fleming"
    assert parse_plan(None).sequential.mode == "always_valid"
    assert parse_plan({"sequential": {"mode": "group", "spending": "pocock", "looks": 1},
                       "planned_units": 10}).sequential.looks == 1  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"sequential": GROUP}, "sequential mode group needs planned_units"),
        ({"sequential": {**GROUP, "looks": 0}, "planned_units": 100}, "sequential.looks: Input should be greater"),
        ({"sequential": {"mode": "group"}, "planned_units": 100}, "mode group needs looks"),
        ({"sequential": {**GROUP, "spending": "haybittle"}, "planned_units": 100},
         "sequential.spending: Input should be 'obrien_fleming' or 'pocock'"),
        ({"sequential": {"looks": 3}}, "spending and looks apply to mode group only"),
        ({"sequential": {**GROUP, "mode": "bayes"}}, "sequential.mode: Input should be"),
        ({"sequential": GROUP, "planned_units": 100, "guardrail_window": "cumulative"},
         "needs guardrail_window stage"),
        ({"sequential": {**GROUP, "looks": 51}, "planned_units": 100}, "less than or equal to 50"),
    ],
)  # fmt: skip
def test_an_invalid_group_plan_is_refused_by_the_schema_and_the_plan_check(
    raw: dict[str, Any], reason: str
) -> None:
    problems = plan_problems(raw)
    assert problems is not None and reason in problems
    with pytest.raises(PlanError, match="sequential"):
        parse_plan(raw)
    checked = check_plan(raw, BUILTINS)
    assert not checked.ok and any(reason in e for e in checked.errors)


def test_the_plan_check_describes_the_group_design_per_stage() -> None:
    raw = {"sequential": GROUP, "planned_units": 2000, "stages": [10, 50, 100], "guardrails": ["error_rate"]}
    checked = check_plan(raw, BUILTINS)
    assert checked.ok, checked.errors
    seq = checked.public()["sequential"]
    assert seq["mode"] == "group" and seq["looks"] == 5 and seq["spending"] == "obrien_fleming"
    # one guardrail, two evaluated stages: each stage's family at 0.05 / 2
    assert seq["alpha_per_stage"] == pytest.approx(0.025)
    planned = group_sequential_design((0.2, 0.4, 0.6, 0.8, 1.0), 0.025, "obrien_fleming", two_sided=False)
    assert seq["planned_looks"][0]["units"] == 400 and seq["planned_looks"][-1]["units"] == 2000
    assert [r["adjusted_alpha"] for r in seq["planned_looks"]] == pytest.approx(list(planned.nominal_alpha))
    # the adjusted levels grow towards the last look, which is near the fixed-horizon one (OBF)
    assert (
        seq["planned_looks"][0]["adjusted_alpha"] < 1e-4 < seq["planned_looks"][-1]["adjusted_alpha"] < 0.025
    )


LATENCY = BUILTINS["latency_mean"]
MARGIN = resolve_margin(GuardrailSpec(metric="latency_mean", margin=0.1), LATENCY)
ERRORS = BUILTINS["error_rate"]


def _stats(rng: np.random.Generator, n: int, mean: float, sd: float = 50.0) -> SampleStats:
    """A ratio metric's sums (latency_mean: latency over requests) for units of one request each."""
    x = rng.normal(mean, sd, n)
    return SampleStats(n, float(x.sum()), float((x * x).sum()), float(n), float(n), float(x.sum()))


def _group(control: SampleStats | None, candidate: SampleStats | None, previous: dict[str, Any] | None,
           planned: int = 1000, looks: int = 5, spending: str = "obrien_fleming") -> GuardrailCheck:  # fmt: skip
    return check_group_guardrail(
        LATENCY, MARGIN, control, candidate, previous=previous, spending=spending, looks=looks, alpha=0.05,
        alpha_noninferiority=0.05, planned_units=planned, min_test_units=30,
    )  # fmt: skip


def test_a_group_guardrail_is_untested_before_the_first_look_and_says_when_it_comes() -> None:
    rng = np.random.default_rng(1)
    check = _group(_stats(rng, 90, 100.0), _stats(rng, 90, 100.0), None)
    assert check.outcome == "insufficient_data" and not check.tested
    assert check.lacking == "first group look at 200 units in the stage window (now 180)"
    assert check.sequential is not None and check.sequential["fractions"] == []


def test_group_looks_are_taken_at_the_planned_fractions_and_their_outcome_stands_between_looks() -> None:
    rng = np.random.default_rng(2)
    c, t = _stats(rng, 110, 100.0), _stats(rng, 110, 100.0)
    first = _group(c, t, None)  # t = 0.22: look 1
    assert first.tested and first.sequential is not None
    assert first.sequential["look"] == 1 and first.sequential["fractions"] == [pytest.approx(0.22)]
    assert not first.sequential["carried"] and first.sequential["adjusted_alpha"] < 1e-4
    c2, t2 = c + _stats(rng, 60, 100.0), t + _stats(rng, 60, 100.0)  # t = 0.34: same bin, no look
    between = _group(c2, t2, first.evidence())
    assert between.sequential is not None and between.sequential["carried"]
    assert between.outcome == first.outcome and between.harm == first.harm and between.n_control == 110
    assert between.sequential["next_look_units"] == 400 and "next look at 400 units" in (
        between.message or ""
    )
    c3, t3 = c2 + _stats(rng, 300, 100.0), t2 + _stats(rng, 300, 100.0)  # t = 0.94: one look, late
    late = _group(c3, t3, between.evidence())
    assert late.sequential is not None and late.sequential["look"] == 2 and not late.sequential["carried"]
    assert late.sequential["fractions"] == [pytest.approx(0.22), pytest.approx(0.94)]
    # Lan–DeMets: the boundary at the actual fractions, not the planned ones
    actual = group_sequential_design((0.22, 0.94), 0.05, "obrien_fleming", two_sided=False)
    assert late.sequential["z_bound"] == pytest.approx(actual.z_bounds[-1])
    c4, t4 = c3 + _stats(rng, 100, 100.0), t3 + _stats(rng, 100, 100.0)  # t = 1.14: the last look, at t = 1
    last = _group(c4, t4, late.evidence())
    assert last.sequential is not None and last.sequential["fractions"][-1] == 1.0
    assert last.sequential["look"] == 3
    after = _group(c4 + _stats(rng, 500, 100.0), t4 + _stats(rng, 500, 100.0), last.evidence())
    assert after.sequential is not None and after.sequential["carried"]
    assert after.sequential["next_look_units"] is None and "the test is over" in (after.message or "")


def test_a_changed_design_starts_its_looks_again_rather_than_reusing_another_designs_fractions() -> None:
    rng = np.random.default_rng(3)
    c, t = _stats(rng, 150, 100.0), _stats(rng, 150, 100.0)
    first = _group(c, t, None, looks=5)
    again = _group(c, t, first.evidence(), looks=3)  # t = 0.3 < 1/3: no look yet under 3 looks
    assert again.outcome == "insufficient_data" and again.sequential is not None
    assert again.sequential["fractions"] == []


def test_a_group_rate_guardrail_is_tested_at_a_control_rate_of_zero() -> None:
    zero = SampleStats(600, 0.0, 0.0, 600.0, 600.0, 600.0)  # ratio: 0 errors in 600 requests per arm
    margin = resolve_margin(GuardrailSpec(metric="error_rate", absolute_margin=0.01), ERRORS)
    check = check_group_guardrail(
        ERRORS, margin, zero, zero, previous=None, spending="pocock", looks=2, alpha=0.05,
        alpha_noninferiority=0.05, planned_units=1000, min_test_units=30,
    )  # fmt: skip
    assert check.test == "rate_score" and check.tested, check.message
    assert check.outcome == "noninferior" and check.upper is not None and check.upper < 0.01
    assert check.sequential is not None and check.sequential["spending"] == "pocock"


def test_a_look_whose_test_cannot_run_spends_nothing() -> None:
    flat = SampleStats(
        300, 300 * 100.0, 300 * 100.0**2, 300.0, 300.0, 300 * 100.0
    )  # every unit the same: no variance
    check = _group(flat, flat, None)
    assert check.outcome == "error" and check.sequential is not None and check.sequential["fractions"] == []
    assert (
        look_bin(0.6, 5) == 3 and look_bin(0.2, 5) == 1 and look_bin(0.1999, 5) == 0 and look_bin(7.0, 5) == 5
    )


# --- the decision rule, simulated -------------------------------------------------------------

PLAN = RolloutPlan.model_validate(
    {"stages": [50, 100], "min_duration_s": 0, "min_units": 0, "planned_units": 1000, "alpha": 0.05,
     "noninferiority_alpha": 0.05, "guardrails": [{"metric": "latency_mean", "margin": 0.1}],
     "sequential": GROUP}
)  # fmt: skip
#: Controller looks at these totals (both arms): more looks than planned, some bins skipped
#: (0.25 → 0.5 → 0.625 → 0.875 → 1.0 are taken), past the planned sample.
TICKS = tuple(int(1000 * j / 8) for j in range(1, 11))


def _simulate(sims: int, harm: float, spending: str, seed: int) -> dict[str, float]:
    """Run the controller's rule (check_group_guardrail → decide) on one 50% stage; the
    candidate's mean is ``harm`` (relative) worse than the control's 100 (sd 50)."""
    rng = np.random.default_rng(seed)
    outcomes = {"rollback": 0, "promote": 0, "hold": 0}
    plan = PLAN.model_copy(update={"sequential": PLAN.sequential.model_copy(update={"spending": spending})})
    for _ in range(sims):
        c = t = SampleStats(0, 0.0, 0.0)
        previous: dict[str, Any] | None = None
        prev_n = 0
        decision = "hold"
        for total in TICKS:
            add = (total - prev_n) // 2
            c, t = c + _stats(rng, add, 100.0), t + _stats(rng, add, 100.0 * (1 + harm))
            prev_n = total
            check = check_group_guardrail(
                LATENCY, MARGIN, c, t, previous=previous, spending=spending, looks=5, alpha=0.05,
                alpha_noninferiority=0.05, planned_units=1000, min_test_units=30,
            )  # fmt: skip
            previous = check.evidence()
            srm = SrmLook(False, 0.5, {}, {})
            look = Look(plan.stage(0), 1e6, t.n, c.n, t.n, (check,), srm, sequential="group")
            decision = decide(plan, look).decision
            if decision != "hold":
                break
        outcomes[decision] += 1
    return {k: v / sims for k, v in outcomes.items()}


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
@pytest.mark.parametrize("spending", ["obrien_fleming", "pocock"])
def test_group_mode_rolls_back_and_promotes_a_candidate_at_the_margin_at_alpha(spending: str) -> None:
    start = time.monotonic()
    rates = _simulate(2000, 0.1, spending, seed=11 if spending == "pocock" else 12)
    print(f"group {spending} at the margin: {rates} in {time.monotonic() - start:.1f} s")
    assert abs(rates["rollback"] - 0.05) <= 0.015  # false rollback (harm = margin is not > margin)
    assert abs(rates["promote"] - 0.05) <= 0.015  # false promotion (harm = margin is not < margin)


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_group_mode_promotes_an_equal_candidate_and_rolls_back_a_harmful_one_with_power() -> None:
    # Fixed-horizon power at 1000 units (500/arm, sd 50, margin 10 on a mean of 100):
    # Φ(10/√(50²/500·(1 + 1.1²)) − 1.645) ≈ 0.91 for both questions; O'Brien–Fleming's last
    # boundary costs a point or two.
    equal = _simulate(1000, 0.0, "obrien_fleming", seed=13)
    harmful = _simulate(1000, 0.2, "obrien_fleming", seed=14)
    print(f"group OBF power: equal {equal}, harm 20% {harmful}")
    assert equal["promote"] >= 0.85 and equal["rollback"] <= 0.005
    assert harmful["rollback"] >= 0.85 and harmful["promote"] <= 0.005
