"""Rollout state as analytics reads it; every change goes through ``control.rollout``.

The rows, the experiment lock and the writes (stage, weights, status, decisions) are the
control plane's (:mod:`control.rollout`, re-exported here for the controller and the
views); what stays here are the reads only analytics needs: which rollouts run, and the
units per variant the gateway tagged with a stage.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text

from control.locking import lock, try_lock
from control.rollout import (
    DecisionRow,
    RolloutRow,
    VariantRow,
    decisions,
    is_repeat_hold,
    last_decision,
    load,
    promote,
    record,
    restart_stage_clock,
    rollback,
    set_stage,
    set_status,
)

__all__ = [
    "DecisionRow",
    "RolloutRow",
    "VariantRow",
    "decisions",
    "is_repeat_hold",
    "last_decision",
    "load",
    "lock",
    "promote",
    "record",
    "resolve",
    "restart_stage_clock",
    "rollback",
    "running_rollouts",
    "set_stage",
    "set_status",
    "shifted",
    "stage_split",
    "try_lock",
]


def running_rollouts(conn: Connection) -> list[int]:
    rows = conn.execute(
        text("SELECT id FROM experiments WHERE mode = 'rollout' AND status = 'running' ORDER BY id")
    )
    return [int(r[0]) for r in rows]


def resolve(conn: Connection, id_or_name: str) -> int | None:
    col = "id" if id_or_name.isdigit() else "name"
    value: Any = int(id_or_name) if id_or_name.isdigit() else id_or_name
    row = conn.execute(text(f"SELECT id FROM experiments WHERE {col} = :v"), {"v": value}).first()
    return None if row is None else int(row[0])


def stage_split(conn: Connection, experiment_id: int, segment: str) -> dict[str, int]:
    """Units per variant in one stage's segment (``rollout_stage=<index>``, tagged by the gateway)."""
    rows = conn.execute(
        text(
            "SELECT variant, count(*) FROM segment_rollups WHERE experiment_id = :e AND segment = :s"
            " GROUP BY variant"
        ),
        {"e": experiment_id, "s": segment},
    )
    return {str(v): int(n) for v, n in rows}


def shifted(ts: datetime, seconds: float) -> datetime:
    return ts + timedelta(seconds=seconds)
