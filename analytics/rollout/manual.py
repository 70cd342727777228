"""Operator control of a rollout (admin API and CLI): status, advance, pause, resume, rollback.

Each action takes the experiment's advisory lock (blocking: the controller's look is a
short transaction), re-reads the row ``FOR UPDATE``, checks the transition, applies it
and records a decision with the operator as actor — written to ``rollout_decisions`` and
``audit_log`` in the same transaction.

Semantics:

- ``advance``: the next stage now, ignoring minimums and evidence; from the promotion stage
  (the last one with control traffic) it promotes, since serving everyone *is* the promotion.
- ``pause``: status ``paused``. The controller never looks at a paused rollout; the
  gateway serves a paused experiment's control to everyone, so the candidate gets no
  traffic while paused. The stage is kept.
- ``resume``: back to ``running`` at the same stage; the stage clock restarts (time in
  pause does not count toward ``min_duration_s``, and the SRM window starts afresh).
- ``rollback``: candidate 0%, status ``rolled_back`` (from running or paused).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from analytics.rollout.baseline import EvidenceSource, fresh_evidence
from analytics.rollout.check import PlanCheck, check_plan, plan_metric_names
from analytics.rollout.controller import apply_decision, load_catalogue, observe_stage
from analytics.rollout.decisions import Decision
from analytics.rollout.plan import PlanError, parse_plan
from analytics.rollout.telemetry import RolloutMetrics
from contracts import offline_gate
from control import locking, rollout
from control.errors import ControlError

ACTIONS = ("advance", "pause", "resume", "rollback")


class RolloutActionError(ControlError):
    """An action that cannot be done; ``status`` is the HTTP status to answer with."""


def _resolve(conn: Connection, id_or_name: str) -> int | None:
    """An experiment's id from its id or its name (None: no such experiment)."""
    col = "id" if id_or_name.isdigit() else "name"
    value: Any = int(id_or_name) if id_or_name.isdigit() else id_or_name
    row = conn.execute(text(f"SELECT id FROM experiments WHERE {col} = :v"), {"v": value}).first()
    return None if row is None else int(row[0])


def _row(conn: Connection, id_or_name: str, *, for_update: bool) -> rollout.RolloutRow:
    eid = _resolve(conn, id_or_name)
    if eid is None:
        raise RolloutActionError(404, f"experiment {id_or_name!r} not found")
    if for_update:
        locking.lock(conn, eid)
    row = rollout.load(conn, eid, for_update=for_update)
    if row is None:
        raise RolloutActionError(404, f"experiment {id_or_name!r} not found")
    if row.mode != "rollout":
        raise RolloutActionError(409, f"experiment {row.name!r} is not a rollout (mode {row.mode!r})")
    return row


def plan_check(
    conn: Connection,
    raw: Any,
    route: str | None,
    prefer: int | None = None,
    evidence: EvidenceSource = fresh_evidence,
) -> PlanCheck:
    """The plan check with the route's recent traffic and baselines when it has any."""
    catalogue, errors = load_catalogue(conn, plan_metric_names(raw))
    traffic, baselines = (
        (None, {}) if route is None else evidence(conn, route, list(catalogue.values()), prefer)
    )
    return check_plan(raw, catalogue, traffic=traffic, baselines=baselines, catalogue_errors=errors)


def status(
    conn: Connection, id_or_name: str, limit: int = 500, evidence: EvidenceSource = fresh_evidence
) -> dict[str, Any]:
    """Current stage, plan (defaults filled in), weights, the plan check and the decision timeline."""
    row = _row(conn, id_or_name, for_update=False)
    out: dict[str, Any] = {
        "experiment_id": row.id,
        "name": row.name,
        "route": row.route,
        "status": row.status,
        "status_reason": row.status_reason,
        "stage": row.stage,
        "stage_started_at": row.stage_started_at.isoformat() if row.stage_started_at else None,
        "variants": [{"name": v.name, "weight": v.weight, "is_control": v.is_control} for v in row.variants],
        "stage_percent": row.candidate.weight if row.candidate and row.status == "running" else None,
        "plan": None,
        "plan_error": None,
        "stages": [],
    }
    checked = plan_check(conn, row.plan, row.route, prefer=row.id, evidence=evidence)
    out["plan_check"] = checked.public()
    try:
        plan = parse_plan(row.plan)
    except PlanError as exc:
        out["plan_error"] = str(exc)
    else:
        if checked.errors:
            out["plan_error"] = "; ".join(checked.errors)
        out["plan"] = plan.public()
        out["stages"] = [
            {
                "index": s.index,
                "percent": s.percent,
                "min_duration_s": s.min_duration_s,
                "min_units": s.min_units,
                "promotion": s.promotion,
                "evaluated": s.evaluated,
            }
            for s in (plan.stage(i) for i in range(len(plan.stages)))
        ]
        if row.stage is not None and row.stage < len(plan.stages):
            out["stage_percent"] = plan.stage(row.stage).percent
    gate = _gate(conn, row)
    out["offline_gate"] = None if gate is None else gate.public()
    out["decisions"] = [d.public() for d in rollout.decisions(conn, row.id, limit)]
    return out


def _decision_for(row: rollout.RolloutRow, action: str, actor: str) -> Decision:
    by = f"by {actor}"
    if action == "advance":
        if row.status != "running":
            raise RolloutActionError(409, f"cannot advance a rollout that is {row.status}")
        try:
            plan = parse_plan(row.plan)
        except PlanError as exc:
            raise RolloutActionError(422, f"invalid rollout plan: {exc}") from None
        if row.control is None or row.candidate is None:
            raise RolloutActionError(422, "a rollout needs exactly one control and one candidate variant")
        if row.stage is None or row.stage_started_at is None:
            first = plan.stage(0).percent
            return Decision("start", f"started {by}", "manual", None, 0, {"stage_percent": first})
        if row.stage >= plan.promotion_stage():
            return Decision("promote", f"promoted {by}", "manual", row.stage, row.stage)
        nxt = plan.stage(row.stage + 1).percent
        return Decision("advance", f"advanced to {nxt:g}% {by}", "manual", row.stage, row.stage + 1)
    if action == "pause":
        if row.status != "running":
            raise RolloutActionError(409, f"cannot pause a rollout that is {row.status}")
        return Decision("pause", f"paused {by}", "manual", row.stage, row.stage)
    if action == "resume":
        if row.status != "paused":
            raise RolloutActionError(409, f"cannot resume a rollout that is {row.status}")
        return Decision("resume", f"resumed {by}; stage clock restarted", "manual", row.stage, row.stage)
    if action == "rollback":
        if row.status not in ("running", "paused"):
            raise RolloutActionError(409, f"cannot roll back a rollout that is {row.status}")
        if row.control is None or row.candidate is None:
            raise RolloutActionError(422, "a rollout needs exactly one control and one candidate variant")
        return Decision("rollback", f"rolled back {by}", "manual", row.stage, row.stage)
    raise RolloutActionError(404, f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")


def _gate(conn: Connection, row: rollout.RolloutRow) -> offline_gate.GateCheck | None:
    if row.control is None or row.candidate is None:
        return None
    required = offline_gate.required_by(row.plan)
    return offline_gate.check(conn, row.id, row.candidate.name, row.control.name, required=required)


def _require_gate(conn: Connection, row: rollout.RolloutRow) -> None:
    """An operator cannot give traffic to a candidate the offline gate does not vouch for
    (to run without a gate, the experiment's declaration must be removed — an audited change)."""
    gate = _gate(conn, row)
    if gate is not None and not gate.passed:
        raise RolloutActionError(409, gate.reason)


def act(
    engine: Engine,
    id_or_name: str,
    action: str,
    actor: str,
    metrics: RolloutMetrics | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> dict[str, Any]:
    """Do ``action`` and return the new status (with the recorded decision first in ``decision``)."""
    try:
        with engine.begin() as conn:
            row = _row(conn, id_or_name, for_update=True)
            decision = _decision_for(row, action, actor)
            if decision.decision in ("start", "advance", "promote", "resume"):
                _require_gate(conn, row)
            now = clock()
            if decision.decision == "pause":
                rollout.set_status(conn, row.id, "paused", decision.reason, now)
            elif decision.decision == "resume":
                rollout.set_status(conn, row.id, "running", decision.reason, now)
                rollout.restart_stage_clock(conn, row, now)
            else:
                apply_decision(conn, row, decision, now)
            after = rollout.load(conn, row.id)
            assert after is not None
            rid = rollout.record(conn, row.id, decision, actor, now, row.state(), after.state())
    except IntegrityError:
        raise RolloutActionError(409, "another experiment is already running on this route") from None
    if metrics is not None:
        metrics.decisions.labels(decision.decision).inc()
        observe_stage(metrics, after)
    with engine.connect() as conn:
        out = status(conn, str(row.id))
    out["decision"] = next((d for d in out["decisions"] if d["id"] == rid), None)
    return out
