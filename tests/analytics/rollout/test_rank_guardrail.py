"""Percentile guardrails by rank test: a candidate whose p95 latency is 30% worse while its
mean is not is rolled back; an equal one is not (real PostgreSQL and ingest, injected clock)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import Engine

from analytics.report.catalogue import BUILTINS
from analytics.rollout.check import check_plan
from analytics.rollout.controller import Controller
from analytics.rollout.plan import PlanError, parse_plan
from tests.analytics.rollout.synthetic import (
    Clock,
    Profile,
    create_rollout,
    decisions,
    drive,
    make_traffic,
)

PLAN: dict[str, Any] = {
    "stages": [25, 50, 100],
    "min_duration_s": 60,
    "min_units": 50,
    "interval_s": 0,
    "planned_units": 4000,
    "guardrails": [
        {"metric": "latency_p95", "method": "mann_whitney", "margin": 0.10},
        {"metric": "latency_mean", "margin": 0.10},
    ],
}
#: p95 1.3× the control's with the same mean: log-sd 0.4 → 0.6325, median 400 → 400·e^−0.12.
SIGMA_T = 0.6325
TAIL_HEAVY = Profile(error_p=0.0, latency_ms=400.0 * math.exp(-0.12), latency_sigma=SIGMA_T)
CONTROL = Profile(error_p=0.0)


def _guardrail(decision: dict[str, Any], metric: str) -> dict[str, Any]:
    return next(g for g in decision["evidence"]["guardrails"] if g["metric"] == metric)


def test_the_profiles_differ_in_p95_by_30_percent_with_equal_means() -> None:
    z95 = 1.6448536
    p95 = lambda median, sigma: median * math.exp(z95 * sigma)  # noqa: E731
    mean = lambda median, sigma: median * math.exp(sigma * sigma / 2)  # noqa: E731
    ratio = p95(TAIL_HEAVY.latency_ms, SIGMA_T) / p95(CONTROL.latency_ms, CONTROL.latency_sigma)
    assert ratio == pytest.approx(1.30, abs=0.005)
    assert mean(TAIL_HEAVY.latency_ms, SIGMA_T) == pytest.approx(mean(400.0, 0.4), rel=1e-3)


def test_a_candidate_with_a_30_percent_worse_p95_and_the_same_mean_is_rolled_back(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, _, salt = create_rollout(engine, PLAN)
    traffic = make_traffic(engine, eid, salt, TAIL_HEAVY, control=CONTROL, units=2000, seed=71)
    controller.evaluate(eid)
    assert drive(controller, clock, traffic, steps=60, requests=400) == "rolled_back"
    rows = decisions(engine, eid)
    rollback = rows[-1]
    assert rollback["decision"] == "rollback" and rollback["stage"] == 0, rollback["reason"]
    assert "latency_p95" in rollback["reason"]
    g = _guardrail(rollback, "latency_p95")
    assert g["outcome"] == "harm" and g["test"] == "mann_whitney" and g["harm_scale"] == "relative"
    assert g["lower"] > 0.10 and g["harm"] == pytest.approx(0.30, abs=0.12)
    mean = _guardrail(rollback, "latency_mean")
    assert mean["outcome"] != "harm" and abs(mean["harm"]) < 0.05  # the mean alone would not catch it
    # judged once, when the stage was due (fixed horizon): earlier looks report it untested
    early = [d for d in rows if d["decision"] == "hold"]
    assert early and all(not _guardrail(d, "latency_p95")["tested"] for d in early)


def test_an_equal_candidate_passes_the_rank_guardrail_and_advances(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, _, salt = create_rollout(engine, PLAN)
    traffic = make_traffic(engine, eid, salt, CONTROL, control=CONTROL, units=2000, seed=72)
    controller.evaluate(eid)
    drive(controller, clock, traffic, steps=16, requests=400)
    rows = decisions(engine, eid)
    advanced = [d for d in rows if d["decision"] == "advance"]
    assert advanced, rows[-1]["reason"]
    g = _guardrail(advanced[0], "latency_p95")
    assert g["tested"] and g["outcome"] != "harm" and g["upper"] is not None
    assert not [d for d in rows if d["decision"] == "rollback"]


def test_plans_state_the_rank_test_or_are_refused_with_a_reason() -> None:
    catalogue = dict(BUILTINS)
    ok = check_plan({"guardrails": [{"metric": "latency_p95", "method": "mann_whitney"}]}, catalogue)
    assert not ok.errors
    plain = check_plan({"guardrails": ["latency_p95"]}, catalogue)
    assert plain.errors and "method: mann_whitney" in plain.errors[0]
    wrong = check_plan({"guardrails": [{"metric": "latency_mean", "method": "mann_whitney"}]}, catalogue)
    assert wrong.errors and "quantile metric" in wrong.errors[0]
    with pytest.raises(PlanError, match="relative margin only"):
        parse_plan(
            {"guardrails": [{"metric": "latency_p95", "method": "mann_whitney", "absolute_margin": 50}]}
        )
    with pytest.raises(PlanError):
        parse_plan({"guardrails": [{"metric": "latency_p95", "method": "t_test"}]})
