"""User-defined metric definitions (``metric_definitions``): the one writer.

The definition arrives validated and normalised by the caller (the analytics catalogue owns
what a metric may be); this module stores it and audits the change in one transaction.
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import Connection, text
from sqlalchemy.exc import IntegrityError

from control import audit
from control.errors import ControlError


def definition(conn: Connection, name: str) -> dict[str, Any] | None:
    row = conn.execute(text("SELECT definition FROM metric_definitions WHERE name = :n"), {"n": name}).first()
    if row is None:
        return None
    value = row[0]
    return value if isinstance(value, dict) else dict(orjson.loads(value))


def create(conn: Connection, spec: dict[str, Any], actor: str) -> None:
    name = str(spec["name"])
    if definition(conn, name) is not None:
        raise ControlError(409, f"metric {name!r} already exists")
    try:
        conn.execute(
            text("INSERT INTO metric_definitions (name, definition) VALUES (:n, CAST(:d AS jsonb))"),
            {"n": name, "d": orjson.dumps(spec).decode()},
        )
    except IntegrityError:  # created by a concurrent call since the check above
        raise ControlError(409, f"metric {name!r} already exists") from None
    audit.write(conn, actor=actor, action="create", entity="metric", entity_id=name, before=None, after=spec)


def update(conn: Connection, name: str, spec: dict[str, Any], actor: str) -> None:
    before = definition(conn, name)
    if before is None:
        raise ControlError(404, f"metric {name!r} not found")
    conn.execute(
        text(
            "UPDATE metric_definitions SET definition = CAST(:d AS jsonb), updated_at = now() WHERE name = :n"
        ),
        {"n": name, "d": orjson.dumps(spec).decode()},
    )
    audit.write(
        conn, actor=actor, action="update", entity="metric", entity_id=name, before=before, after=spec
    )


def delete(conn: Connection, name: str, actor: str) -> None:
    before = definition(conn, name)
    if before is None:
        raise ControlError(404, f"metric {name!r} not found")
    conn.execute(text("DELETE FROM metric_definitions WHERE name = :n"), {"n": name})
    audit.write(
        conn, actor=actor, action="delete", entity="metric", entity_id=name, before=before, after=None
    )
