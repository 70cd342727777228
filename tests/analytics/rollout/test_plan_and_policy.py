"""The plan's validation and the decision policy (pure logic, no I/O)."""

from __future__ import annotations

import pytest

from analytics.metrics import BUILTINS
from analytics.rollout.decisions import Look, decide
from analytics.rollout.evidence import (
    GuardrailCheck,
    Outcome,
    SrmLook,
    check_guardrail,
    guardrail_alpha,
    look_srm,
)
from analytics.rollout.plan import DEFAULT_STAGES, PlanError, RolloutPlan, parse_plan
from analytics.stats import SampleStats


def test_an_empty_plan_gets_every_default() -> None:
    plan = parse_plan(None)
    assert plan.stages == DEFAULT_STAGES
    assert [g.metric for g in plan.guardrail_specs()] == [
        "error_rate", "latency_mean", "thumbs_down_rate", "completion_tokens_per_response",
    ]  # fmt: skip
    assert plan.on_srm == "hold" and plan.on_complete == "promote"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"stages": [10, 5]}, "strictly increasing"),
        ({"stages": [0, 50]}, "(0, 100]"),
        ({"stages": []}, "at least one stage"),
        ({"on_srm": "explode"}, "on_srm"),
        ({"min_units": -1}, "min_units"),
        ({"guardrails": ["error_rate", "error_rate"]}, "listed twice"),
        ({"stage_overrides": {"7": {"min_units": 5}}}, "not one of the stages"),
        ({"surprise": 1}, "surprise"),
        ([1, 2], "JSON object"),
    ],
)
def test_an_invalid_plan_is_refused_with_a_reason(raw: object, reason: str) -> None:
    with pytest.raises(PlanError, match=None) as err:
        parse_plan(raw)
    assert reason in str(err.value)


def test_stage_overrides_replace_the_global_minimums_for_their_stage_only() -> None:
    plan = parse_plan({"stages": [5, 50, 100], "min_duration_s": 60, "min_units": 10,
                       "stage_overrides": {"50": {"min_units": 500}}})  # fmt: skip
    assert (plan.stage(0).min_units, plan.stage(1).min_units, plan.stage(1).min_duration_s) == (10, 500, 60)
    assert plan.stage(2).last and not plan.stage(1).last


def _look(plan: RolloutPlan, stage: int = 0, *, elapsed: float = 100.0, units: int = 1000,
          outcomes: tuple[Outcome, ...] = ("inconclusive",), srm: bool = False) -> Look:  # fmt: skip
    checks = tuple(
        GuardrailCheck(f"m{i}", o, 0.1, 0.05, "decrease", units, units, harm=0.5, lower=0.2)
        for i, o in enumerate(outcomes)
    )
    split = SrmLook(
        srm, 1e-6 if srm else 0.5, {"control": 900, "candidate": 100}, {"control": 95, "candidate": 5}
    )
    return Look(plan.stage(stage), elapsed, units, units, units, checks, split)


PLAN = RolloutPlan(min_duration_s=60, min_units=100)


def test_harm_rolls_back_even_when_the_split_is_broken() -> None:
    d = decide(PLAN, _look(PLAN, outcomes=("noninferior", "harm"), srm=True))
    assert d.decision == "rollback" and d.code == "guardrail" and "m1" in d.reason


@pytest.mark.parametrize(
    ("on_srm", "expected"), [("hold", "hold"), ("rollback", "rollback"), ("warn", "advance")]
)
def test_srm_does_what_the_plan_says(on_srm: str, expected: str) -> None:
    plan = RolloutPlan.model_validate({"on_srm": on_srm})
    d = decide(plan, _look(plan, elapsed=10_000, srm=True))
    assert d.decision == expected
    assert d.evidence["srm"]["flagged"]


def test_a_stage_holds_until_both_minimums_are_met() -> None:
    assert decide(PLAN, _look(PLAN, elapsed=59)).code == "minimums"
    assert decide(PLAN, _look(PLAN, units=99)).code == "minimums"
    d = decide(PLAN, _look(PLAN))
    assert (d.decision, d.stage, d.to_stage) == ("advance", 0, 1)


def test_require_noninferiority_waits_for_every_guardrail() -> None:
    plan = RolloutPlan(min_duration_s=0, min_units=0, require_noninferiority=True)
    assert decide(plan, _look(plan, outcomes=("noninferior", "inconclusive"))).code == "noninferiority"
    assert decide(plan, _look(plan, outcomes=("noninferior", "noninferior"))).decision == "advance"


def test_the_last_stage_promotes_or_holds_as_configured() -> None:
    last = len(PLAN.stages) - 1
    assert decide(PLAN, _look(PLAN, last)).decision == "promote"
    hold = RolloutPlan(min_duration_s=60, min_units=100, on_complete="hold")
    assert decide(hold, _look(hold, last)).code == "final"


def test_a_guardrail_is_not_tested_before_the_minimum_units() -> None:
    few = SampleStats.from_values([0, 1, 0], [1, 1, 1])
    check = check_guardrail(
        BUILTINS["error_rate"], 0.25, few, few, alpha=0.05, planned_units=100, min_test_units=30
    )
    assert check.outcome == "no_data" and "30" in (check.message or "")


def test_a_far_worse_error_rate_is_harm_and_an_equal_one_is_not() -> None:
    n = 400
    control = SampleStats.from_values([1.0 if i % 20 == 0 else 0.0 for i in range(n)], [1.0] * n)
    worse = SampleStats.from_values([1.0 if i % 5 == 0 else 0.0 for i in range(n)], [1.0] * n)
    metric = BUILTINS["error_rate"]
    harm = check_guardrail(metric, 0.25, control, worse, alpha=0.0125, planned_units=800, min_test_units=30)
    same = check_guardrail(metric, 0.25, control, control, alpha=0.0125, planned_units=800, min_test_units=30)
    assert harm.outcome == "harm" and harm.lower is not None and harm.lower > 0.25
    assert same.outcome != "harm" and same.harm == pytest.approx(0.0)


def test_alpha_is_split_across_guardrails_and_srm_uses_the_weights() -> None:
    assert guardrail_alpha(0.05, [1, 2, 3, 4]) == pytest.approx(0.0125)
    assert look_srm({"control": 950, "candidate": 50}, {"control": 95.0, "candidate": 5.0}).flagged is False
    assert look_srm({"control": 990, "candidate": 10}, {"control": 95.0, "candidate": 5.0}).flagged is True
    assert look_srm({"control": 10, "other": 3}, {"control": 95.0, "candidate": 5.0}).flagged is True
