"""Audit records of dataset actions (create, split, export, refused export, delete, references,
retention), in the shared ``audit_log`` table with the actor."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert

from contracts.tables import AuditLog


def audit(
    conn: Connection, actor: str, action: str, entity_id: str | None, *,
    before: dict[str, Any] | None = None, after: dict[str, Any] | None = None, entity: str = "dataset",
) -> None:  # fmt: skip
    conn.execute(insert(AuditLog).values(actor=actor, action=action, entity=entity, entity_id=entity_id,
                                         before=before, after=after))  # fmt: skip
