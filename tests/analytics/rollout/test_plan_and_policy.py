"""The plan's validation and the decision policy (pure logic, no I/O)."""

from __future__ import annotations

import pytest

from analytics.report.catalogue import BUILTINS
from analytics.rollout.decisions import Look, decide
from analytics.rollout.evidence import (
    GuardrailCheck,
    Outcome,
    SrmLook,
    check_guardrail,
    guardrail_alpha,
    look_srm,
)
from analytics.rollout.margins import Margin, resolve_margin
from analytics.rollout.plan import DEFAULT_STAGES, GuardrailSpec, PlanError, RolloutPlan, parse_plan
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
        ({"stages": [100]}, "no stage keeps control traffic"),
        ({"stages": [50, 96, 100], "control_holdback": 5}, "caps the final stage at 95%"),
        ({"guardrails": [{"metric": "error_rate", "absolute_margin": float("nan")}]}, "finite"),
        ({"stages": list(range(1, 30))}, "at most 20"),
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


def _check(name: str, outcome: Outcome, units: int = 1000, **kw: object) -> GuardrailCheck:
    fields: dict[str, object] = {"harm": 0.5, "lower": 0.2, "upper": 0.9, "harm_scale": "relative",
                                 "margin_text": "10% of the control", "alpha_noninferiority": 0.05}  # fmt: skip
    fields.update(kw)
    return GuardrailCheck(name, outcome, 0.1, 0.05, "decrease", units, units, **fields)  # type: ignore[arg-type]


def _look(plan: RolloutPlan, stage: int = 0, *, elapsed: float = 100.0, units: int = 1000,
          outcomes: tuple[Outcome, ...] = ("inconclusive",), srm: bool = False,
          checks: tuple[GuardrailCheck, ...] | None = None) -> Look:  # fmt: skip
    if checks is None:
        checks = tuple(_check(f"m{i}", o, units) for i, o in enumerate(outcomes))
    split = SrmLook(
        srm, 1e-6 if srm else 0.5, {"control": 900, "candidate": 100}, {"control": 95, "candidate": 5}
    )
    return Look(plan.stage(stage), elapsed, units, units, units, checks, split)


PLAN = RolloutPlan(min_duration_s=60, min_units=100)
PROMOTION = PLAN.promotion_stage()


def test_harm_rolls_back_even_when_the_split_is_broken() -> None:
    d = decide(PLAN, _look(PLAN, outcomes=("noninferior", "harm"), srm=True))
    assert d.decision == "rollback" and d.code == "guardrail" and "m1" in d.reason
    assert "n/a" not in d.reason and "lower bound +20.0% > +10.0%" in d.reason


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


@pytest.mark.parametrize("outcome", ["no_data", "insufficient_data", "error"])
def test_an_untested_guardrail_is_never_a_pass(outcome: Outcome) -> None:
    checks = (
        _check("error_rate", "inconclusive"),
        _check("latency_mean", outcome, lacking="12/30 control units"),
    )
    for stage in (0, PROMOTION):
        d = decide(PLAN, _look(PLAN, stage, checks=checks))
        assert (d.decision, d.code) == ("hold", "untested")
        assert d.reason == "guardrails not tested yet: latency_mean: 12/30 control units"


def test_require_noninferiority_waits_for_every_guardrail() -> None:
    plan = RolloutPlan(min_duration_s=0, min_units=0, require_noninferiority=True)
    assert decide(plan, _look(plan, outcomes=("noninferior", "inconclusive"))).code == "noninferiority"
    assert decide(plan, _look(plan, outcomes=("noninferior", "noninferior"))).decision == "advance"


def test_promotion_is_decided_at_the_last_stage_with_control_and_needs_non_inferiority() -> None:
    assert PLAN.stages == DEFAULT_STAGES and PLAN.stage(PROMOTION).percent == 50
    held = decide(PLAN, _look(PLAN, PROMOTION, outcomes=("noninferior", "inconclusive")))
    assert (held.decision, held.code) == ("hold", "noninferiority")
    assert "m1 upper bound +90.0% not below its margin +10.0%" in held.reason
    assert held.evidence["promotion_stage"] is True
    promoted = decide(PLAN, _look(PLAN, PROMOTION, outcomes=("noninferior", "noninferior")))
    assert promoted.decision == "promote" and promoted.stage == PROMOTION
    hold = RolloutPlan(min_duration_s=60, min_units=100, on_complete="hold")
    assert decide(hold, _look(hold, PROMOTION, outcomes=("noninferior",))).code == "final"
    # an earlier stage advances on "not harmed" (inconclusive) evidence
    assert decide(PLAN, _look(PLAN, PROMOTION - 1)).decision == "advance"


def test_a_stage_without_control_traffic_never_passes() -> None:
    last = len(PLAN.stages) - 1
    d = decide(PLAN, _look(PLAN, last, outcomes=("no_data", "no_data")))
    assert (d.decision, d.code) == ("hold", "no_control")
    assert decide(PLAN, _look(PLAN, last, outcomes=("noninferior",))).decision == "hold"


def test_a_control_holdback_makes_the_final_stage_the_promotion_stage() -> None:
    plan = RolloutPlan(stages=(10, 50, 100), control_holdback=5, min_duration_s=0, min_units=0)
    assert plan.percents() == (10, 50, 95) and plan.promotion_stage() == 2
    final = plan.stage(2)
    assert final.percent == 95 and final.promotion and final.last
    assert decide(plan, _look(plan, 2, outcomes=("noninferior",))).decision == "promote"
    assert decide(plan, _look(plan, 1, outcomes=("noninferior",))).decision == "advance"


def test_a_guardrail_is_not_tested_before_the_minimum_units() -> None:
    few = SampleStats.from_values([0, 1, 0], [1, 1, 1])
    check = check_guardrail(
        BUILTINS["error_rate"],
        Margin(None, 0.01, True),
        few,
        few,
        alpha=0.05,
        planned_units=100,
        min_test_units=30,
    )
    assert check.outcome == "insufficient_data" and not check.tested
    assert check.lacking == "3/30 control units, 3/30 candidate units"
    none = check_guardrail(
        BUILTINS["error_rate"],
        Margin(None, 0.01, True),
        None,
        few,
        alpha=0.05,
        planned_units=100,
        min_test_units=30,
    )
    assert none.outcome == "no_data" and none.lacking == "no control units"


def test_a_far_worse_error_rate_is_harm_and_an_equal_one_is_not() -> None:
    n = 400
    control = SampleStats.from_values([1.0 if i % 20 == 0 else 0.0 for i in range(n)], [1.0] * n)
    worse = SampleStats.from_values([1.0 if i % 5 == 0 else 0.0 for i in range(n)], [1.0] * n)
    metric = BUILTINS["error_rate"]
    margin = resolve_margin(GuardrailSpec(metric="error_rate"), metric)
    assert margin == Margin(None, 0.01, True)
    harm = check_guardrail(metric, margin, control, worse, alpha=0.0125, planned_units=800, min_test_units=30)
    same = check_guardrail(
        metric, margin, control, control, alpha=0.0125, planned_units=800, min_test_units=30
    )
    assert (
        harm.outcome == "harm" and harm.lower is not None and harm.lower > 0.01 and harm.test == "rate_score"
    )
    assert harm.harm == pytest.approx(0.15) and harm.harm_scale == "absolute"
    assert same.outcome != "harm" and same.harm == pytest.approx(0.0)


def test_margins_default_to_absolute_for_rates_and_relative_for_means() -> None:
    rate = resolve_margin(GuardrailSpec(metric="thumbs_down_rate"), BUILTINS["thumbs_down_rate"])
    assert (rate.kind, rate.absolute, rate.rate) == ("absolute", 0.01, True)
    mean = resolve_margin(GuardrailSpec(metric="latency_mean"), BUILTINS["latency_mean"])
    assert (mean.kind, mean.relative, mean.rate) == ("relative", 0.10, False)
    tokens = resolve_margin(GuardrailSpec(metric="completion_tokens_per_response"),
                            BUILTINS["completion_tokens_per_response"])  # fmt: skip
    assert tokens.relative == 0.25  # the catalogue's guardrail margin
    both = resolve_margin(
        GuardrailSpec(metric="error_rate", margin=0.25, absolute_margin=0.01), BUILTINS["error_rate"]
    )
    assert both.kind == "max" and both.effective(0.1) == pytest.approx(0.025) and both.effective(0.0) == 0.01
    assert both.describe(0.1) == "max(25% × 0.1, 0.01) = +0.025"
    rel = Margin(0.1, None, False)
    assert rel.effective(0.0) is None and "undefined" in rel.describe(0.0)


def test_a_max_margin_needs_harm_beyond_both_and_is_absolute_at_a_zero_control_rate() -> None:
    metric, n = BUILTINS["error_rate"], 2000
    zero = SampleStats.from_values([0.0] * n, [1.0] * n)
    bad = SampleStats.from_values([1.0 if i % 10 == 0 else 0.0 for i in range(n)], [1.0] * n)
    margin = Margin(0.25, 0.01, True)
    at_zero = check_guardrail(metric, margin, zero, bad, alpha=0.01, planned_units=4000, min_test_units=30)
    assert at_zero.outcome == "harm" and at_zero.margin == pytest.approx(0.01)
    # 10% vs 8.5%: +1.5 points is beyond 0.01 but within 25% × 8.5% = 2.1 points: never harm
    base = SampleStats.from_values([1.0 if i % 200 < 17 else 0.0 for i in range(n * 10)], [1.0] * (n * 10))
    within = check_guardrail(metric, margin, base, SampleStats.from_values(
        [1.0 if i % 10 == 0 else 0.0 for i in range(n * 10)], [1.0] * (n * 10)),
        alpha=0.01, planned_units=40000, min_test_units=30)  # fmt: skip
    assert within.outcome != "harm" and within.margin == pytest.approx(0.25 * 0.085)
    assert within.relative is not None and within.relative["harm"] == pytest.approx(0.015 / 0.085)


def test_alpha_is_split_across_guardrails_and_stages_and_srm_uses_the_weights() -> None:
    assert guardrail_alpha(0.05, [1, 2, 3, 4]) == pytest.approx(0.0125)
    assert guardrail_alpha(0.05, [1, 2, 3, 4], families=5) == pytest.approx(0.0025)
    assert look_srm({"control": 950, "candidate": 50}, {"control": 95.0, "candidate": 5.0}).flagged is False
    assert look_srm({"control": 990, "candidate": 10}, {"control": 95.0, "candidate": 5.0}).flagged is True
    assert look_srm({"control": 10, "other": 3}, {"control": 95.0, "candidate": 5.0}).flagged is True
