"""The rollout controller sends a candidate no traffic until the offline gate vouches for
exactly that candidate (real PostgreSQL; gate decisions written as the gate writes them)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, text

from analytics.rollout import manual
from analytics.rollout.controller import Controller
from contracts.offline_gate import candidate_fingerprint
from tests.analytics.rollout.synthetic import FAST_PLAN, create_rollout, decisions, experiment_state

DECLARATION: dict[str, Any] = {"suites": ["demo"], "margins": {"code": 0.05}}
PARAMS = {"temperature": 0, "seed": 0}


def _declare(engine: Engine, eid: int, declaration: dict[str, Any] = DECLARATION) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO offline_gates (experiment_id, declaration, updated_by) VALUES (:e, CAST(:d AS jsonb), 't')"
                " ON CONFLICT (experiment_id) DO UPDATE SET declaration = EXCLUDED.declaration"
            ),
            {"e": eid, "d": orjson.dumps(declaration).decode()},
        )


def _targets(engine: Engine, eid: int) -> dict[str, tuple[str, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT v.name, u.name, u.base_url, v.model FROM variants v JOIN upstreams u ON u.id = v.upstream_id"
                " WHERE v.experiment_id = :e"
            ),
            {"e": eid},
        )
        return {str(r[0]): (str(r[1]), str(r[2]), str(r[3])) for r in rows}


def _decide(engine: Engine, eid: int, passed: bool, declaration: dict[str, Any] = DECLARATION) -> int:
    """A gate decision for the candidate as configured now (as ``evals.gatekeeper`` records it)."""
    t = _targets(engine, eid)
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO gate_decisions (experiment_id, variant, baseline_variant, candidate_fingerprint,"
                    " baseline_fingerprint, upstream, model, params, passed, verdict, reasons, declaration, actor)"
                    " VALUES (:e, 'candidate', 'control', :fc, :fb, :u, :m, CAST(:p AS jsonb), :ok, :v,"
                    " CAST(:r AS jsonb), CAST(:d AS jsonb), 'cli:test') RETURNING id"
                ),
                {
                    "e": eid,
                    "fc": candidate_fingerprint(*t["candidate"], PARAMS),
                    "fb": candidate_fingerprint(*t["control"], PARAMS),
                    "u": t["candidate"][0],
                    "m": t["candidate"][2],
                    "p": orjson.dumps(PARAMS).decode(),
                    "ok": passed,
                    "v": "pass" if passed else "forgetting",
                    "r": orjson.dumps([] if passed else ["forgetting: code -20.0 pts"]).decode(),
                    "d": orjson.dumps(declaration).decode(),
                },
            ).scalar_one()
        )


def _repoint(engine: Engine, eid: int, model: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE variants SET model = :m WHERE experiment_id = :e AND name = 'candidate'"),
            {"m": model, "e": eid},
        )


def test_a_rollout_with_a_declared_gate_and_no_decision_holds_at_zero_traffic(
    engine: Engine, controller: Controller
) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    _declare(engine, eid)
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "hold" and decision.code == "offline_gate"
    assert "no decision for 'candidate'" in decision.reason and "liftgate eval gate" in decision.reason
    state = experiment_state(engine, eid)
    assert state["stage"] is None and state["weights"]["candidate"] == 0.0


def test_a_failing_gate_decision_keeps_the_candidate_out_with_its_reason(
    engine: Engine, controller: Controller
) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    _declare(engine, eid)
    did = _decide(engine, eid, passed=False)
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "hold"
    assert f"offline gate failed (decision {did})" in decision.reason and "code -20.0 pts" in decision.reason
    assert experiment_state(engine, eid)["weights"]["candidate"] == 0.0


def test_a_passing_decision_for_the_current_candidate_starts_the_rollout(
    engine: Engine, controller: Controller
) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    _declare(engine, eid)
    _decide(engine, eid, passed=False)
    _decide(engine, eid, passed=True)  # the newest matching decision counts
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "start", decision
    assert experiment_state(engine, eid)["weights"]["candidate"] == 5.0


def test_a_pass_for_another_model_or_another_declaration_does_not_count(
    engine: Engine, controller: Controller
) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    _declare(engine, eid)
    _decide(engine, eid, passed=True)
    _repoint(engine, eid, "candidate-v2")  # the decision vouched for model 'm'
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "hold" and "model 'candidate-v2'" in decision.reason
    _decide(engine, eid, passed=True)
    _declare(engine, eid, {**DECLARATION, "margins": {"code": 0.01}})  # stricter since
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "hold", decision
    assert experiment_state(engine, eid)["weights"]["candidate"] == 0.0


def test_a_candidate_repointed_mid_rollout_is_rolled_back(engine: Engine, controller: Controller) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    _declare(engine, eid)
    _decide(engine, eid, passed=True)
    started = controller.evaluate(eid, force=True)
    assert started is not None and started.decision == "start"
    _repoint(engine, eid, "unvetted")
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "rollback"
    assert "no longer vouches" in decision.reason
    state = experiment_state(engine, eid)
    assert state["status"] == "rolled_back" and state["weights"]["candidate"] == 0.0


def test_a_plan_that_requires_a_gate_holds_an_experiment_that_declares_none(
    engine: Engine, controller: Controller
) -> None:
    eid, _, _ = create_rollout(engine, {**FAST_PLAN, "offline_gate": "required"})
    decision = controller.evaluate(eid, force=True)
    assert decision is not None and decision.decision == "hold" and "declares none" in decision.reason
    # Without a declaration and without the requirement, rollouts start as before.
    other, _, _ = create_rollout(engine, FAST_PLAN)
    started = controller.evaluate(other, force=True)
    assert started is not None and started.decision == "start"


def test_an_operator_cannot_start_an_ungated_candidate_by_hand(engine: Engine) -> None:
    eid, _, _ = create_rollout(engine, FAST_PLAN)
    _declare(engine, eid)
    with pytest.raises(manual.RolloutActionError) as refused:
        manual.act(engine, str(eid), "advance", "admin:alice")
    assert refused.value.status == 409 and "offline gate" in refused.value.detail
    assert experiment_state(engine, eid)["weights"]["candidate"] == 0.0
    assert decisions(engine, eid) == []
    _decide(engine, eid, passed=True)
    out = manual.act(engine, str(eid), "advance", "admin:alice")
    assert out["decision"]["decision"] == "start"
    assert out["offline_gate"]["passed"] is True and out["offline_gate"]["required"] is True
