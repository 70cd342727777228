"""An operator's PATCH racing the rollout controller's advance, against real PostgreSQL.

The controller (in this process, the real :class:`Controller`) and an operator (a real
HTTP PATCH to the analytics service's ``/admin``) act on the same rollout at the same
moment, many times. Both go through the control plane's one lock discipline, so every
round must end in a state one of them alone would have produced:

- the operator first: the PATCH (same weights, a new description) commits, then the
  controller advances — stage 1, its weights, both audited in that order;
- the controller first: it advances, and the PATCH, which still names stage 0's weights,
  is refused (409) — stage 1, its weights, only the advance audited;
- the controller finds the experiment locked by the PATCH and skips this look — stage 0,
  its weights, the PATCH audited.

Never stage 1 with stage 0's weights (the torn state an unlocked read-modify-write of the
variants produces), never a 500.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from analytics.rollout.controller import Controller
from analytics.rollout.telemetry import for_registry
from tests.analytics.report_data import insert_units, simulate_units
from tests.analytics.rollout.synthetic import create_rollout, experiment_state
from tests.control.conftest import AdminService

PLAN: dict[str, Any] = {
    "stages": [5, 50, 100],
    "min_duration_s": 0,
    "min_units": 0,
    "interval_s": 0,
    "guardrails": [],
    "planned_units": 1000,
}
PERCENT = {0: 5.0, 1: 50.0}
ROUNDS = 40
BUDGET_S = 60.0


def _prepared(engine: Engine, controller: Controller, rng: np.random.Generator) -> tuple[int, str, str]:
    """A running rollout at stage 0 (5%) with a few units per arm, so its next look advances."""
    eid, name, _ = create_rollout(engine, PLAN)
    with engine.begin() as conn:
        for variant in ("control", "candidate"):
            insert_units(conn, eid, variant, simulate_units(rng, 5, thumbs_p=0.5, tokens=10, error_p=0.0),
                         prefix=f"{name}-{variant}")  # fmt: skip
        upstream = conn.execute(
            text(
                "SELECT DISTINCT u.name FROM upstreams u JOIN variants v ON v.upstream_id = u.id WHERE v.experiment_id = :e"
            ),
            {"e": eid},
        ).scalar_one()
    started = controller.evaluate(eid, force=True)
    assert started is not None and started.decision == "start", started
    return eid, name, str(upstream)


def _audit(engine: Engine, eid: int) -> list[tuple[str, str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT action, actor, after FROM audit_log WHERE entity = 'experiment' AND entity_id = :e ORDER BY id"
            ),
            {"e": str(eid)},
        )
        return [(str(a), str(b), c) for a, b, c in rows]


def _race(
    controller: Controller, admin_service: AdminService, eid: int, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    """The controller's look and the operator's PATCH, released at the same instant."""
    barrier = threading.Barrier(2, timeout=30)
    results: dict[str, Any] = {}

    def look() -> None:
        barrier.wait()
        results["controller"] = controller.evaluate(eid, force=True)

    def patch() -> None:
        barrier.wait()
        results["patch"] = admin_service.call("PATCH", path, body, actor="race")

    threads = [threading.Thread(target=look), threading.Thread(target=patch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


def test_a_patch_racing_a_controller_advance_ends_in_a_state_one_of_them_alone_would_produce(
    engine: Engine, admin_service: AdminService
) -> None:
    controller = Controller(engine, for_registry(CollectorRegistry()), srm_grace_s=3600)
    rng = np.random.default_rng(14)
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + BUDGET_S
    for round_ in range(ROUNDS):
        if time.monotonic() > deadline:
            break
        eid, name, upstream = _prepared(engine, controller, rng)
        body = {
            "description": f"edited in round {round_}",
            "variants": [
                {"name": "control", "upstream": upstream, "model": "m", "weight": 95.0, "is_control": True},
                {"name": "candidate", "upstream": upstream, "model": "m", "weight": 5.0, "is_control": False},
            ],
        }
        results = _race(controller, admin_service, eid, f"/admin/experiments/{name}", body)

        state = experiment_state(engine, eid)
        decision = results["controller"]
        status, answer = results["patch"]
        audit = _audit(engine, eid)
        actions = [a for a, _, _ in audit if a != "rollout.start"]
        # Stage and weights always come from one decision.
        stage = state["stage"]
        assert state["weights"] == {"control": 100.0 - PERCENT[stage], "candidate": PERCENT[stage]}, (
            state,
            results,
        )
        if decision is not None:
            assert decision.decision == "advance" and stage == 1, (decision, state)
            if status == 200:  # the operator first, then the advance
                assert actions == ["update", "rollout.advance"], audit
                outcomes["patch then advance"] += 1
            else:  # the advance first: the PATCH names stale weights and is refused whole
                assert status == 409 and "rollout actions" in answer["detail"], (status, answer)
                assert actions == ["rollout.advance"], audit
                outcomes["advance then refused patch"] += 1
        else:  # the controller met the PATCH's lock and left this look for later
            assert status == 200 and stage == 0, (status, answer, state)
            assert actions == ["update"], audit
            outcomes["patch, controller skipped"] += 1
        if status == 200:
            update = next(after for action, _, after in audit if action == "update")
            assert update["description"] == body["description"]
            assert next(actor for action, actor, _ in audit if action == "update") == "admin:race"
    assert sum(outcomes.values()) >= 5, outcomes  # enough rounds ran to mean something
