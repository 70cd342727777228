"""The controller against real PostgreSQL and the real ingest path, with an injected clock."""

from __future__ import annotations

import itertools
import threading

from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

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


def _run(controller: Controller, clock: Clock, traffic: object, steps: int, requests: int = 250) -> None:
    from tests.analytics.rollout.synthetic import SyntheticTraffic

    assert isinstance(traffic, SyntheticTraffic)
    for _ in range(steps):
        clock.step(2.0)
        traffic.step(clock.now, requests)
        controller.evaluate(traffic.experiment_id)
        status = experiment_state(traffic.engine, traffic.experiment_id)["status"]
        if status != "running":
            return


def test_a_new_rollout_starts_at_its_first_stage(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    decision = controller.evaluate(eid)
    assert decision is not None and decision.decision == "start"
    state = experiment_state(engine, eid)
    assert state["stage"] == 0 and state["weights"] == {"control": 95.0, "candidate": 5.0}
    assert state["stage_started_at"] == clock.now


def test_a_healthy_candidate_ramps_through_every_stage_and_becomes_the_baseline(
    engine: Engine, controller: Controller, clock: Clock, registry: CollectorRegistry
) -> None:
    eid, name, salt = create_rollout(engine, FAST_PLAN)
    # 2,000 units: the 5% stage needs 30 candidate units before its guardrails are tested
    traffic = make_traffic(engine, eid, salt, Profile(), units=2000, seed=1)
    controller.evaluate(eid)
    _run(controller, clock, traffic, steps=150, requests=600)
    state = experiment_state(engine, eid)
    assert state["status"] == "completed", decisions(engine, eid)[-1]
    assert state["controls"] == ["control"]  # the report keeps reading candidate vs control
    assert state["weights"] == {"control": 0.0, "candidate": 100.0}
    kinds = [d["decision"] for d in decisions(engine, eid)]
    moves = [k for k in kinds if k != "hold"]
    # 5 → 10 → 25 → 50%, promoted from 50% (the 100% step is the promotion)
    assert moves == ["start", "advance", "advance", "advance", "promote"]
    # repeated identical holds are recorded once
    rows = decisions(engine, eid)
    for a, b in itertools.pairwise(rows):
        assert not (a["decision"] == b["decision"] == "hold" and a["stage"] == b["stage"]
                    and a["evidence"]["code"] == b["evidence"]["code"])  # fmt: skip
    advance = next(d for d in rows if d["decision"] == "advance")
    assert advance["evidence"]["units"]["candidate_in_stage"] >= FAST_PLAN["min_units"]
    assert advance["evidence"]["elapsed_s"] >= FAST_PLAN["min_duration_s"]
    assert {g["metric"] for g in advance["evidence"]["guardrails"]} == {
        "error_rate", "latency_mean", "thumbs_down_rate", "completion_tokens_per_response",
    }  # fmt: skip
    assert registry.get_sample_value("liftgate_rollout_decisions_total", {"decision": "promote"}) == 1.0
    route = f"route-{name.removeprefix('rollout-')}"
    assert (
        registry.get_sample_value("liftgate_rollout_stage_percent", {"route": route, "experiment": name})
        == 100.0
    )
    with engine.connect() as conn:
        audits = (
            conn.execute(
                text(
                    "SELECT action FROM audit_log WHERE entity = 'experiment' AND entity_id = :e ORDER BY id"
                ),
                {"e": str(eid)},
            )
            .scalars()
            .all()
        )
    assert audits[0] == "rollout.start" and audits[-1] == "rollout.promote"


def test_a_candidate_with_three_times_the_error_rate_is_rolled_back_before_25_percent(
    engine: Engine, controller: Controller, clock: Clock
) -> None:
    eid, _, salt = create_rollout(engine, FAST_PLAN)
    traffic = make_traffic(engine, eid, salt, Profile(error_p=0.15), units=2000, seed=2)
    controller.evaluate(eid)
    # 1,200 requests per 2 s step: at 600 the 5% and 10% stages saw too few candidate
    # errors for the alpha/(k·stages) test about one run in ten (random salt per run).
    _run(controller, clock, traffic, steps=80, requests=1200)
    state = experiment_state(engine, eid)
    assert state["status"] == "rolled_back"
    assert state["weights"] == {"control": 100.0, "candidate": 0.0}
    rows = decisions(engine, eid)
    rollback = rows[-1]
    assert rollback["decision"] == "rollback" and rollback["stage"] < 2  # stages 5%, 10% only
    assert "error_rate" in rollback["reason"]
    g = next(g for g in rollback["evidence"]["guardrails"] if g["metric"] == "error_rate")
    assert g["outcome"] == "harm" and g["lower"] > g["margin"]
    assert g["n_control"] > 0 and g["n_candidate"] > 0


def test_a_broken_split_holds_the_rollout(engine: Engine, controller: Controller, clock: Clock) -> None:
    plan = {**FAST_PLAN, "stages": [20, 50, 100]}
    eid, _, salt = create_rollout(engine, plan)
    traffic = make_traffic(engine, eid, salt, Profile(), units=1500, seed=3)
    traffic.drop_candidate_units = 0.5  # half the candidate's units never reach the database
    controller.evaluate(eid)
    _run(controller, clock, traffic, steps=15, requests=500)
    state = experiment_state(engine, eid)
    assert state["status"] == "running" and state["stage"] == 0
    last = decisions(engine, eid)[-1]
    assert last["decision"] == "hold" and last["evidence"]["code"] == "srm"
    assert last["evidence"]["srm"]["p_value"] < 0.001


def test_a_paused_rollout_is_never_advanced(engine: Engine, controller: Controller, clock: Clock) -> None:
    eid, _, salt = create_rollout(engine, FAST_PLAN)
    traffic = make_traffic(engine, eid, salt, Profile(), seed=4)
    controller.evaluate(eid)
    with engine.begin() as conn:
        conn.execute(text("UPDATE experiments SET status = 'paused' WHERE id = :e"), {"e": eid})
    for _ in range(10):
        clock.step(5.0)
        traffic.step(clock.now, 200)
        assert controller.evaluate(eid) is None
    state = experiment_state(engine, eid)
    assert state["status"] == "paused" and state["stage"] == 0
    assert [d["decision"] for d in decisions(engine, eid)] == ["start"]


def test_two_controllers_looking_at_once_advance_a_stage_only_once(engine: Engine, clock: Clock) -> None:
    eid, _, salt = create_rollout(engine, FAST_PLAN)
    first = Controller(engine, for_registry(CollectorRegistry()), clock=clock)
    second = Controller(engine, for_registry(CollectorRegistry()), clock=clock)
    traffic = make_traffic(engine, eid, salt, Profile(), units=2000, seed=5)
    first.evaluate(eid)
    for _ in range(8):  # meet stage 0's minimums, with 30 candidate units to test
        clock.step(2.0)
        traffic.step(clock.now, 600)
    barrier = threading.Barrier(8)

    def look(c: Controller) -> None:
        barrier.wait()
        c.evaluate(eid, force=True)

    threads = [threading.Thread(target=look, args=(c,)) for c in (first, second) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [d["decision"] for d in decisions(engine, eid) if d["decision"] == "advance"] == ["advance"]
    assert experiment_state(engine, eid)["stage"] == 1


def test_an_invalid_plan_holds_with_its_reasons(engine: Engine, controller: Controller) -> None:
    eid, _, _ = create_rollout(engine, {"stages": [50, 10], "guardrails": ["latency_p95"]})
    decision = controller.evaluate(eid)
    assert decision is not None and decision.decision == "hold" and decision.code == "plan_invalid"
    assert "strictly increasing" in decision.reason
    assert experiment_state(engine, eid)["stage"] is None
    assert controller.evaluate(eid) is not None
    assert len(decisions(engine, eid)) == 1  # the identical hold is not recorded twice


def test_a_quantile_guardrail_is_refused_with_a_reason(engine: Engine, controller: Controller) -> None:
    eid, _, _ = create_rollout(engine, {**FAST_PLAN, "guardrails": ["latency_p95"]})
    controller.evaluate(eid)  # start
    decision = controller.evaluate(eid)
    assert decision is not None and decision.code == "plan_invalid"
    assert "latency_mean" in decision.reason
