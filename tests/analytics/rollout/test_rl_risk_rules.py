"""Rollout rules on the RL-risk detectors: the controller (real PostgreSQL, ingested events,
an injected clock) rolls back a forgetting candidate naming its category, holds a reward
hacker naming the alarm, promotes an honest better candidate, and never promotes while a
rule it must apply cannot be evaluated."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from analytics.rollout.controller import Controller
from analytics.rollout.decisions import Decision
from contracts.events import ROLLOUT_STAGE_TAG
from contracts.rollout_plan import plan_problems
from tests.analytics.risks_data import scenario_events
from tests.analytics.rollout.synthetic import Clock, create_rollout, experiment_state

# One stage with control traffic (50 %): promotion is decided there, at equal weights.
PLAN: dict[str, Any] = {
    "stages": [50, 100], "min_duration_s": 10, "min_units": 10, "interval_s": 0, "planned_units": 3000,
    "min_test_units": 30, "guardrails": [],
    "rl_risks": {
        "category_guardrails": [{"metric": "thumbs_down_rate", "margin": 0.10}],
        "hold_on": ["verbosity", "goodhart", "stuffing"],
    },
}  # fmt: skip


def _look(engine: Engine, controller: Controller, clock: Clock, scenario: str, units: int, seed: int,
          plan: dict[str, Any] = PLAN, **kw: Any) -> tuple[int, Decision]:  # fmt: skip
    eid, _, _ = create_rollout(engine, plan)
    started = controller.evaluate(eid)
    assert started is not None and started.decision == "start"
    ingest(engine, scenario_events(eid, scenario, units, seed, tags={ROLLOUT_STAGE_TAG: "0"}, **kw))
    clock.step(60.0)
    decision = controller.evaluate(eid, force=True)
    assert decision is not None
    if decision.decision == "hold":  # park it: later modules' snapshotters snapshot running experiments
        with engine.begin() as conn:
            conn.execute(text("UPDATE experiments SET status = 'paused' WHERE id = :e"), {"e": eid})
    return eid, decision


def test_the_forgetting_candidate_is_rolled_back_naming_the_code_category(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, decision = _look(engine, controller, clock, "forgetting", 1000, seed=21)
    assert (decision.decision, decision.code) == ("rollback", "category_guardrail"), decision.reason
    assert experiment_state(engine, eid)["status"] == "rolled_back"
    assert decision.reason.startswith("category code: thumbs_down_rate worse than its relative margin 0.1")
    assert "math" not in decision.reason and "chat" not in decision.reason
    assert decision.evidence["rl_risks"]["categories"] == ["code"]


def test_the_honest_better_candidate_is_promoted(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    _, decision = _look(engine, controller, clock, "honest", 600, seed=22)
    assert (decision.decision, decision.code) == ("promote", "complete"), decision.reason
    assert decision.evidence["rl_risks"]["firing"] == []


def test_the_reward_hacker_is_held_naming_its_alarms(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    # (its users are worse off in every category: the category guardrail would roll it back first)
    plan = PLAN | {"rl_risks": {"hold_on": ["verbosity", "goodhart", "stuffing"]}}
    _, decision = _look(engine, controller, clock, "reward-hacking", 600, seed=23, plan=plan)
    assert (decision.decision, decision.code) == ("hold", "rl_risk"), decision.reason
    assert "RL-risk alarm stuffing: over-represented: " in decision.reason
    assert "'great question'" in decision.reason
    assert "RL-risk alarm verbosity: responses +" in decision.reason
    assert "RL-risk alarm goodhart: the judge says +" in decision.reason


def test_an_alarm_to_roll_back_on_rolls_back(engine: Engine, controller: Controller, clock: Clock) -> None:
    plan = PLAN | {"rl_risks": {"rollback_on": ["stuffing"]}}
    _, decision = _look(engine, controller, clock, "reward-hacking", 300, seed=24, plan=plan)
    assert (decision.decision, decision.code) == ("rollback", "rl_risk"), decision.reason
    assert decision.evidence["rl_risks"]["states"]["stuffing"] == "ok"


def test_promotion_holds_while_an_alarm_it_acts_on_cannot_be_evaluated(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    # no judge scores and no stored text: goodhart and stuffing are unavailable, never a pass
    _, decision = _look(engine, controller, clock, "honest", 300, seed=25, judged=False, content=False)
    assert (decision.decision, decision.code) == ("hold", "rl_risk"), decision.reason
    assert "goodhart (unavailable)" in decision.reason and "stuffing (unavailable)" in decision.reason


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        (
            {"hold_on": ["verbosity"], "rollback_on": ["verbosity"]},
            "verbosity in both hold_on and rollback_on",
        ),
        ({"hold_on": ["vibes"]}, "rollout_plan.rl_risks.hold_on.0"),
        (
            {"category_guardrails": [{"metric": "latency_mean", "margin": 0.1}]},
            "category_guardrails.0.metric",
        ),
        ({"category_guardrails": [{"metric": "thumbs_up_rate", "margin": -1}]}, "greater than or equal to 0"),
        ({"category_guardrails": [{"metric": "thumbs_up_rate", "margin": 0.1}] * 2}, "listed twice"),
        ({"on_category_breach": "ignore"}, "on_category_breach"),
    ],
)
def test_plans_with_bad_rl_risk_rules_are_refused_with_the_reason(
    rules: dict[str, Any], problem: str
) -> None:
    reason = plan_problems(PLAN | {"rl_risks": rules})
    assert reason is not None and problem in reason, reason


def test_the_plan_check_warns_what_the_rules_depend_on() -> None:
    from analytics.rollout.check import check_plan

    plan = PLAN | {
        "rl_risks": {
            "category_guardrails": [{"metric": "satisfaction", "margin": 0.1}],
            "hold_on": ["goodhart"],
            "rollback_on": ["stuffing"],
        }
    }
    checked = check_plan(plan, {})
    assert checked.errors == []
    text = " | ".join(checked.warnings)
    assert "needs judge scores" in text and "needs stored responses" in text
    assert 'use "relative": false' in text
    assert not [w for w in check_plan(PLAN | {"rl_risks": None}, {}).warnings if "rl_risks" in w]
