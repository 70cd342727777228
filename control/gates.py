"""Offline gate declarations and gate decisions: the one writer (``contracts.offline_gate``
reads them to decide whether a candidate may get traffic).

Both change what the rollout controller and the admin API allow for an experiment, so both
take the experiment's lock (:mod:`control.locking`) and write an audit row in the same
transaction: a controller look never sees half of a gate decision.

A failing decision for a candidate that a running A/B test shows to users pauses that test in
the same transaction (fail closed; audited, ``status_reason`` says why): the gate holds a
candidate when an A/B test starts, and one that fails later — declared after the start, or
run again — must not leave users on it. Starting again checks the gate. A rollout is not
paused here: its controller rolls it back on its next look.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, func, select, text
from sqlalchemy.dialects.postgresql import insert

from contracts import offline_gate
from contracts.tables import GateDecision, OfflineGateDeclaration
from control import audit, notifications, rollout
from control.locking import lock


def declaration(conn: Connection, experiment_id: int) -> dict[str, Any] | None:
    row = conn.execute(
        select(OfflineGateDeclaration.declaration).where(
            OfflineGateDeclaration.experiment_id == experiment_id
        )
    ).first()
    return dict(row[0]) if row else None


def set_declaration(conn: Connection, experiment_id: int, value: dict[str, Any], actor: str) -> None:
    """Declare (or replace) the experiment's offline gate."""
    lock(conn, experiment_id)
    before = declaration(conn, experiment_id)
    stmt = insert(OfflineGateDeclaration).values(
        experiment_id=experiment_id, declaration=value, updated_by=actor[:128]
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["experiment_id"],
            set_={
                "declaration": stmt.excluded.declaration,
                "updated_by": stmt.excluded.updated_by,
                "updated_at": func.now(),
            },
        )
    )
    audit.write(
        conn, actor=actor, action="set_offline_gate", entity="experiment", entity_id=experiment_id,
        before=before, after=value,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SavedDecision:
    id: int
    #: The reason a running A/B test showing the candidate was paused by this decision, if one was.
    paused: str | None = None


def save_decision(conn: Connection, values: dict[str, Any]) -> SavedDecision:
    """Record the gate's decision for one candidate: its id, and whether it paused a test."""
    experiment_id = int(values["experiment_id"])
    lock(conn, experiment_id)
    did = int(conn.execute(insert(GateDecision).values(**values).returning(GateDecision.id)).scalar_one())
    summary = {
        k: values.get(k) for k in ("variant", "baseline_variant", "upstream", "model", "passed", "verdict")
    }
    actor = str(values.get("actor") or "offline-gate")
    audit.write(
        conn, actor=actor, action="offline_gate.decision",
        entity="experiment", entity_id=experiment_id, before=None, after={**summary, "decision_id": did},
    )  # fmt: skip
    if not values.get("passed"):
        exp = conn.execute(
            text("SELECT id, name, route FROM experiments WHERE id = :e"), {"e": experiment_id}
        ).first()
        experiment = None if exp is None else {"id": int(exp[0]), "name": exp[1], "route": exp[2]}
        reasons = values.get("reasons") or []
        reason = "; ".join(str(r.get("message", r) if isinstance(r, dict) else r) for r in reasons[:5])
        why = reason or f"verdict {values.get('verdict')}"
        paused = _pause_serving_ab(conn, experiment_id, str(values["variant"]), did, why, actor)
        notifications.emit(
            conn,
            "offline_gate.failed",
            {**summary, "decision_id": did, "reason": why, "paused": paused is not None},
            experiment=experiment,
        )
        return SavedDecision(did, paused)
    return SavedDecision(did)


def _pause_serving_ab(
    conn: Connection, experiment_id: int, variant: str, decision_id: int, why: str, actor: str
) -> str | None:
    """Pause a running A/B test that shows ``variant`` to users (``offline_gate.serving``);
    the reason it gave when it did. The caller holds the experiment's lock; the rows are read
    ``FOR UPDATE`` and the status written by ``control.rollout.set_status``, as every status
    change is."""
    row = rollout.load(conn, experiment_id, for_update=True)
    if row is None or variant not in offline_gate.serving(conn, experiment_id):
        return None
    reason = f"paused by the offline gate: variant {variant!r} failed (decision {decision_id}): {why}"[:2000]
    rollout.set_status(conn, experiment_id, "paused", reason, datetime.now(UTC))
    audit.write(
        conn, actor=actor, action="pause", entity="experiment", entity_id=experiment_id,
        before={"status": row.status, "status_reason": row.status_reason},
        after={"status": "paused", "status_reason": reason},
    )  # fmt: skip
    return reason
