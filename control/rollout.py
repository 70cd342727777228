"""Rollout state in PostgreSQL: reading it, changing weights/status, recording decisions.

:func:`set_status` is the one write of an experiment's status, for every caller (operators'
start/pause/stop in ``control.config``, the offline gate's pause in ``control.gates``, the
rollout controller and manual rollout actions).

Every function runs inside the caller's transaction (a SQLAlchemy ``Connection`` from
``engine.begin()``). Two controller processes (or a controller and an operator) never act
on one experiment at once: the caller takes the experiment's lock first
(:mod:`control.locking`), then :func:`load` re-reads the rows ``FOR UPDATE``, so whoever
comes second sees the first one's committed stage and timing. Each decision is recorded in
``rollout_decisions`` and the audit log in the same transaction (:func:`record`).

Weights are percentages: the candidate gets the stage's percent, the control the rest.
The gateway refreshes its snapshot from these rows within 1 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

import orjson
from sqlalchemy import Connection, text

from control import audit, notifications


class Decision(Protocol):
    """What the control plane records of a rollout decision (the controller's or an operator's)."""

    @property
    def decision(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def code(self) -> str: ...
    @property
    def stage(self) -> int | None: ...
    @property
    def to_stage(self) -> int | None: ...
    @property
    def evidence(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class VariantRow:
    id: int
    name: str
    weight: float
    is_control: bool


@dataclass(frozen=True, slots=True)
class RolloutRow:
    id: int
    name: str
    route: str
    mode: str
    status: str
    plan: Any
    stage: int | None
    stage_started_at: datetime | None
    status_reason: str | None
    variants: tuple[VariantRow, ...]

    @property
    def control(self) -> VariantRow | None:
        controls = [v for v in self.variants if v.is_control]
        return controls[0] if len(controls) == 1 else None

    @property
    def candidate(self) -> VariantRow | None:
        others = [v for v in self.variants if not v.is_control]
        return others[0] if len(others) == 1 else None

    def state(self) -> dict[str, Any]:
        """What the audit log keeps as before/after."""
        return {
            "status": self.status,
            "rollout_stage": self.stage,
            "stage_started_at": self.stage_started_at.isoformat() if self.stage_started_at else None,
            "weights": {v.name: v.weight for v in self.variants},
            "control": self.control.name if self.control else None,
        }


def load(conn: Connection, experiment_id: int, *, for_update: bool = False) -> RolloutRow | None:
    lock_clause = " FOR UPDATE" if for_update else ""
    row = conn.execute(
        text(
            "SELECT id, name, route, mode, status, rollout_plan, rollout_stage, stage_started_at, status_reason"
            f" FROM experiments WHERE id = :e{lock_clause}"
        ),
        {"e": experiment_id},
    ).first()
    if row is None:
        return None
    variants = conn.execute(
        text(
            f"SELECT id, name, weight, is_control FROM variants WHERE experiment_id = :e ORDER BY id{lock_clause}"
        ),
        {"e": experiment_id},
    )
    eid, name, route, mode, status, plan, stage, started, reason = row
    return RolloutRow(
        int(eid),
        str(name),
        str(route),
        str(mode),
        str(status),
        plan,
        stage,
        started,
        reason,
        tuple(VariantRow(int(i), str(n), float(w), bool(c)) for i, n, w, c in variants),
    )


def _weights(conn: Connection, row: RolloutRow, candidate_pct: float) -> None:
    for v in row.variants:
        w = (100.0 - candidate_pct) if v.is_control else candidate_pct
        conn.execute(text("UPDATE variants SET weight = :w WHERE id = :id"), {"w": w, "id": v.id})


def set_stage(conn: Connection, row: RolloutRow, stage: int, percent: float, now: datetime) -> None:
    _weights(conn, row, percent)
    conn.execute(
        text(
            "UPDATE experiments SET rollout_stage = :s, stage_started_at = :t, updated_at = :t WHERE id = :e"
        ),
        {"s": stage, "t": now, "e": row.id},
    )


#: Statuses that end an experiment: each sets ``stopped_at``.
ENDED: Final = frozenset({"stopped", "rolled_back", "completed"})


def set_status(conn: Connection, experiment_id: int, status: str, reason: str, now: datetime) -> None:
    """The one write of an experiment's status, whoever changes it: an operator's start, pause
    or stop (``control.config.transition``), a manual rollout action, the controller's rollback
    or promotion, the offline gate's pause (``control.gates``). The caller holds the
    experiment's lock and its row ``FOR UPDATE`` (``load(..., for_update=True)``, or
    ``control.config``'s ``_locked``), and audits the change in the same transaction.

    ``started_at``: set by the first start (kept by a resume); ``stopped_at``: set by every
    end (``ENDED``)."""
    sets = ["status = :st", "status_reason = :r", "updated_at = :t"]
    if status == "running":
        sets.append("started_at = coalesce(started_at, :t)")
    if status in ENDED:
        sets.append("stopped_at = :t")
    conn.execute(
        text(f"UPDATE experiments SET {', '.join(sets)} WHERE id = :e"),
        {"st": status, "r": reason[:2000], "t": now, "e": experiment_id},
    )


def restart_stage_clock(conn: Connection, row: RolloutRow, now: datetime) -> None:
    conn.execute(
        text("UPDATE experiments SET stage_started_at = :t, updated_at = :t WHERE id = :e"),
        {"t": now, "e": row.id},
    )


def rollback(conn: Connection, row: RolloutRow, reason: str, now: datetime) -> None:
    """Candidate 0%, control 100%, status ``rolled_back`` (the gateway then serves the control)."""
    _weights(conn, row, 0.0)
    set_status(conn, row.id, "rolled_back", reason, now)


def promote(conn: Connection, row: RolloutRow, reason: str, now: datetime) -> None:
    """The candidate becomes the route's baseline: candidate 100%, old control 0%, status ``completed``.

    The control flag stays where it was, so the experiment's report keeps reading
    "candidate vs control"; the gateway serves a completed experiment's highest-weight
    variant to everyone, which is now the candidate.
    """
    _weights(conn, row, 100.0)
    set_status(conn, row.id, "completed", reason, now)


@dataclass(frozen=True, slots=True)
class DecisionRow:
    id: int
    stage: int | None
    to_stage: int | None
    decision: str
    reason: str
    actor: str
    evidence: dict[str, Any]
    created_at: datetime

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stage": self.stage,
            "to_stage": self.to_stage,
            "decision": self.decision,
            "reason": self.reason,
            "actor": self.actor,
            "evidence": self.evidence,
            "created_at": self.created_at.isoformat(),
        }


_DECISION_COLS = "id, stage, to_stage, decision, reason, actor, evidence, created_at"


def last_decision(conn: Connection, experiment_id: int) -> DecisionRow | None:
    row = conn.execute(
        text(
            f"SELECT {_DECISION_COLS} FROM rollout_decisions WHERE experiment_id = :e"
            " ORDER BY created_at DESC, id DESC LIMIT 1"
        ),
        {"e": experiment_id},
    ).first()
    return None if row is None else DecisionRow(*row)


def decisions(conn: Connection, experiment_id: int, limit: int = 500) -> list[DecisionRow]:
    """The rollout timeline, oldest first (at most the newest ``limit`` decisions)."""
    rows = conn.execute(
        text(
            f"SELECT {_DECISION_COLS} FROM (SELECT {_DECISION_COLS} FROM rollout_decisions WHERE experiment_id = :e"
            " ORDER BY created_at DESC, id DESC LIMIT :n) d ORDER BY created_at, id"
        ),
        {"e": experiment_id, "n": limit},
    )
    return [DecisionRow(*r) for r in rows]


def is_repeat_hold(conn: Connection, experiment_id: int, decision: Decision) -> bool:
    """A hold identical (same stage and rule) to the last recorded decision is not re-recorded.

    A hold at which a group-sequential look was taken (``group_looks`` changed) is recorded:
    the looks taken are the plan's memory (read by the controller, ``analytics.rollout.controller``).
    """
    if decision.decision != "hold":
        return False
    last = last_decision(conn, experiment_id)
    return (
        last is not None
        and last.decision == "hold"
        and last.stage == decision.stage
        and last.evidence.get("code") == decision.code
        and last.evidence.get("group_looks") == decision.evidence.get("group_looks")
    )


def record(
    conn: Connection,
    experiment_id: int,
    decision: Decision,
    actor: str,
    now: datetime,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> int:
    evidence = {"code": decision.code, **decision.evidence}
    rid = conn.execute(
        text(
            "INSERT INTO rollout_decisions (experiment_id, stage, to_stage, decision, reason, actor, evidence,"
            " created_at) VALUES (:e, :s, :ts, :d, :r, :a, CAST(:ev AS jsonb), :t) RETURNING id"
        ),
        {
            "e": experiment_id,
            "s": decision.stage,
            "ts": decision.to_stage,
            "d": decision.decision,
            "r": decision.reason,
            "a": actor[:128],
            "ev": orjson.dumps(evidence).decode(),
            "t": now,
        },
    ).scalar_one()
    audit.write(
        conn,
        actor=actor,
        action=f"rollout.{decision.decision}",
        entity="experiment",
        entity_id=str(experiment_id),
        before=before,
        after=None if after is None else {**after, "reason": decision.reason, "decision_id": int(rid)},
    )
    # In this transaction: the decision and its notifications commit together.
    exp = conn.execute(
        text("SELECT id, name, route FROM experiments WHERE id = :e"), {"e": experiment_id}
    ).first()
    experiment = (
        {"id": experiment_id} if exp is None else {"id": int(exp[0]), "name": exp[1], "route": exp[2]}
    )
    notifications.rollout_decision(
        conn, experiment, decision, actor=actor, decision_id=int(rid), now=now, before=before, after=after
    )
    return int(rid)
