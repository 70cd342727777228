"""A failing offline gate decision takes the candidate away from users: a running A/B test that
shows it is paused in the decision's transaction, audited, with the reason (real PostgreSQL;
decisions saved through the one writer, ``control.gates.save_decision``, as the gate saves them)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from control import gates
from tests.evals.conftest import Arm, make_experiment

DECLARATION: dict[str, Any] = {"suites": ["demo"], "margins": {"code": 0.05}}


def _experiment(
    engine: Engine, *, status: str, mode: str = "ab", weight: float = 50, coverage: float = 1
) -> int:
    name = make_experiment(engine, [Arm("control", "base", "http://127.0.0.1:9/v1", True),
                                    Arm("candidate", "cand", "http://127.0.0.1:9/v1")])  # fmt: skip
    with engine.begin() as conn:
        eid = int(conn.execute(text("SELECT id FROM experiments WHERE name = :n"), {"n": name}).scalar_one())
        conn.execute(text("UPDATE experiments SET status = :s, mode = :m, coverage = :c, status_reason = 'start by t'"
                          " WHERE id = :e"), {"s": status, "m": mode, "c": coverage, "e": eid})  # fmt: skip
        conn.execute(text("UPDATE variants SET weight = :w WHERE experiment_id = :e AND name = 'candidate'"),
                     {"w": weight, "e": eid})  # fmt: skip
    return eid


def _save(engine: Engine, eid: int, passed: bool) -> gates.SavedDecision:
    with engine.begin() as conn:
        return gates.save_decision(conn, {
            "experiment_id": eid, "variant": "candidate", "baseline_variant": "control",
            "candidate_fingerprint": "c" * 64, "baseline_fingerprint": "b" * 64, "upstream": "u", "model": "cand",
            "params": {}, "passed": passed, "verdict": "pass" if passed else "fail",
            "reasons": [] if passed else ["forgetting: code −28.3 pts"], "suites": [], "evidence": [],
            "declaration": DECLARATION, "actor": "cli:tester",
        })  # fmt: skip


def _status(engine: Engine, eid: int) -> tuple[str, str | None]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, status_reason FROM experiments WHERE id = :e"), {"e": eid}
        ).one()
    return str(row[0]), row[1]


def test_a_failing_decision_pauses_a_running_ab_test_that_shows_the_candidate(engine: Engine) -> None:
    eid = _experiment(engine, status="running")
    saved = _save(engine, eid, passed=False)
    did = saved.id
    status, reason = _status(engine, eid)
    assert status == "paused" and saved.paused == reason
    assert reason == (
        f"paused by the offline gate: variant 'candidate' failed (decision {did}): forgetting: code −28.3 pts"
    )
    with engine.connect() as conn:
        audit = conn.execute(text("SELECT actor, before, after FROM audit_log WHERE entity = 'experiment'"
                                  " AND entity_id = :e AND action = 'pause'"), {"e": str(eid)}).one()  # fmt: skip
    assert audit[0] == "cli:tester"
    assert audit[1] == {"status": "running", "status_reason": "start by t"}
    assert audit[2] == {"status": "paused", "status_reason": reason}


@pytest.mark.parametrize(
    ("status", "mode", "weight", "coverage", "passed"),
    [
        ("running", "ab", 50, 1, True),  # the gate passed
        ("running", "ab", 0, 1, False),  # no user sees the candidate
        ("running", "ab", 50, 0, False),  # no user is in the experiment
        ("draft", "ab", 50, 1, False),  # not started: the start checks the gate
        ("paused", "ab", 50, 1, False),
        ("running", "rollout", 50, 1, False),  # its controller rolls it back on its next look
        ("running", "shadow", 50, 1, False),  # a shadow candidate answers no user
    ],
)
def test_a_decision_leaves_alone_an_experiment_whose_users_do_not_see_a_failed_candidate(
    engine: Engine, status: str, mode: str, weight: float, coverage: float, passed: bool
) -> None:
    eid = _experiment(engine, status=status, mode=mode, weight=weight, coverage=coverage)
    assert _save(engine, eid, passed=passed).paused is None
    assert _status(engine, eid) == (status, "start by t")
    with engine.connect() as conn:
        paused = conn.execute(text("SELECT count(*) FROM audit_log WHERE entity = 'experiment' AND entity_id = :e"
                                   " AND action = 'pause'"), {"e": str(eid)}).scalar_one()  # fmt: skip
    assert paused == 0
