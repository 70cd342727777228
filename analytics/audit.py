"""The audit log: every change made through the analytics API (who, what, before/after)."""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import Connection, text


def write_audit(
    conn: Connection,
    *,
    actor: str,
    action: str,
    entity: str,
    entity_id: str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    conn.execute(
        text(
            "INSERT INTO audit_log (actor, action, entity, entity_id, before, after)"
            " VALUES (:actor, :action, :entity, :eid, CAST(:before AS jsonb), CAST(:after AS jsonb))"
        ),
        {
            "actor": actor,
            "action": action,
            "entity": entity,
            "eid": entity_id,
            "before": None if before is None else orjson.dumps(before).decode(),
            "after": None if after is None else orjson.dumps(after).decode(),
        },
    )
