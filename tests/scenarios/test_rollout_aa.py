"""A/A calibration of the rollout controller: a candidate identical to the control is (almost)
never rolled back, no stage of its ramp flags a sample ratio mismatch, and it is promoted.

Run at the controller level to stay fast: 24 seeded rollouts, each with its own units
(heavy-tailed activity), identical behaviour in both variants, events written through the
real ingest function into the real database, the controller looking every simulated 2 s
with an injected clock. Theory: each of the k = 4 guardrails is tested at alpha/(k·S) in
each of the S = 2 evaluated stages with an always-valid one-sided bound, so P(any false
rollback in one rollout) ≤ alpha = 0.05 even when the true harm sits exactly at the margin
(union bound over guardrails and stages, Ville's inequality over looks); in an A/A the true
harm is 0, well inside the margins, so the real rate is far lower. Over 24 rollouts the
bound allows 1.2 expected false rollbacks; 5 or more would happen with probability < 1%
if it held.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from analytics.rollout.controller import Controller
from analytics.rollout.telemetry import for_registry
from tests.analytics.rollout.synthetic import (
    FAST_PLAN,
    Clock,
    Profile,
    create_rollout,
    decisions,
    experiment_state,
    make_traffic,
)

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)

ROLLOUTS = 24
MAX_STEPS = 40
MAX_FALSE_ROLLBACKS = 4
# Short stages (3 looks each) keep the batch fast; promotion from 50% needs every guardrail
# shown non-inferior, which low event rates reach sooner (the rate test's calibration at
# higher rates is simulated in tests/analytics/stats/test_rate.py).
PLAN = {**FAST_PLAN, "stages": [10, 50, 100], "min_duration_s": 6}
SAME = Profile(error_p=0.02, thumbs_down_p=0.02)


def test_identical_candidates_are_never_rolled_back_for_a_guardrail(engine: Engine) -> None:
    started = time.monotonic()
    outcomes: dict[str, int] = {}
    guardrail_rollbacks = []
    srm_flags = []
    min_p: dict[str, float] = {}
    for seed in range(ROLLOUTS):
        clock = Clock()
        controller = Controller(engine, for_registry(CollectorRegistry()), clock=clock)
        eid, _, salt = create_rollout(engine, PLAN, salt=f"aa-{seed}")
        traffic = make_traffic(engine, eid, salt, SAME, control=SAME, units=1000, seed=100 + seed)
        controller.evaluate(eid)
        for _ in range(MAX_STEPS):
            clock.step(2.0)
            traffic.step(clock.now, 500)
            controller.evaluate(eid)
            if experiment_state(engine, eid)["status"] != "running":
                break
        status = experiment_state(engine, eid)["status"]
        outcomes[status] = outcomes.get(status, 0) + 1
        for d in decisions(engine, eid):
            if d["decision"] == "rollback" and d["evidence"]["code"] == "guardrail":
                guardrail_rollbacks.append((seed, d["reason"]))
            if d["evidence"].get("srm", {}).get("flagged"):
                srm_flags.append((seed, d["stage"], d["evidence"]["srm"]))
            for g in d["evidence"].get("guardrails", []):
                if g["p_value"] is not None:
                    min_p[g["metric"]] = min(min_p.get(g["metric"], 1.0), g["p_value"])
    elapsed = time.monotonic() - started
    summary = (
        f"A/A: {len(guardrail_rollbacks)}/{ROLLOUTS} rolled back for a guardrail "
        f"(bound: alpha 0.05 family-wise per rollout); {len(srm_flags)} SRM flags; outcomes {outcomes}; "
        f"smallest always-valid harm p per guardrail {min_p}; {elapsed:.1f}s"
    )
    print(summary)
    assert len(guardrail_rollbacks) <= MAX_FALSE_ROLLBACKS, summary
    assert srm_flags == [], summary
    # the batch really exercised the ramp: most rollouts showed non-inferiority and were promoted
    assert outcomes.get("completed", 0) >= ROLLOUTS * 3 // 4, summary
