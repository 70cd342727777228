"""The controller on a group-sequential plan (real PostgreSQL and ingest, injected clock): looks
are taken at the planned units, recorded with their fractions, their outcome stands between
looks, an equal candidate is promoted and a 30% slower one rolled back at a group look."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from analytics.rollout.controller import Controller
from tests.analytics.rollout.synthetic import (
    Clock,
    Profile,
    create_rollout,
    decisions,
    drive,
    make_traffic,
)

PLAN: dict[str, Any] = {
    "stages": [50, 100],
    "min_duration_s": 0,
    "min_units": 0,
    "interval_s": 0,
    "planned_units": 600,
    "guardrails": [{"metric": "latency_mean", "margin": 0.10}],
    "sequential": {"mode": "group", "spending": "obrien_fleming", "looks": 3},
}
SAME = Profile(error_p=0.0)
SLOWER = Profile(error_p=0.0, latency_ms=400.0 * 1.3)


def _latency(decision: dict[str, Any]) -> dict[str, Any]:
    return next(g for g in decision["evidence"]["guardrails"] if g["metric"] == "latency_mean")


def test_an_equal_candidate_is_promoted_at_a_group_look_whose_looks_are_recorded(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, _, salt = create_rollout(engine, PLAN)
    traffic = make_traffic(engine, eid, salt, SAME, control=SAME, units=3000, seed=81)
    controller.evaluate(eid)  # start
    assert drive(controller, clock, traffic, steps=40, requests=150) == "completed"
    rows = decisions(engine, eid)
    looks = [r["evidence"]["group_looks"]["latency_mean"] for r in rows if "group_looks" in r["evidence"]]
    assert looks == sorted(looks) and looks[-1] >= 2, looks  # look 1 inconclusive, then shown
    # before the first look (200 units in the stage window) the guardrail is untested: a hold
    first = next(r for r in rows if "group_looks" in r["evidence"])
    assert (
        looks[0] == 0 and first["decision"] == "hold" and "first group look at 200 units" in first["reason"]
    )
    promote = rows[-1]
    assert promote["decision"] == "promote", promote["reason"]
    g = _latency(promote)
    seq = g["sequential"]
    assert g["outcome"] == "noninferior" and seq["mode"] == "group" and seq["spending"] == "obrien_fleming"
    assert len(seq["fractions"]) == seq["look"] >= 1 and seq["fractions"] == sorted(seq["fractions"])
    assert seq["fractions"][-1] <= 1.0 and seq["adjusted_alpha_noninferiority"] < 0.05
    assert promote["evidence"]["sequential_mode"] == "group"


def test_a_30_percent_slower_candidate_is_rolled_back_at_a_group_look(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, _, salt = create_rollout(engine, PLAN)
    traffic = make_traffic(engine, eid, salt, SLOWER, control=SAME, units=3000, seed=82)
    controller.evaluate(eid)
    assert drive(controller, clock, traffic, steps=40, requests=150) == "rolled_back"
    rollback = decisions(engine, eid)[-1]
    assert rollback["decision"] == "rollback" and rollback["stage"] == 0
    assert "group look" in rollback["reason"] and "adjusted to" in rollback["reason"], rollback["reason"]
    g = _latency(rollback)
    assert g["outcome"] == "harm" and g["lower"] > 0.10 and not g["sequential"]["carried"]
    assert g["sequential"]["adjusted_alpha"] < g["alpha"]
