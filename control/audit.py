"""The audit log's one writer: who changed what, the state before and after.

Written in the transaction of the change it records, so a change and its audit row commit
or roll back together. Secrets never reach it: any value under a key that names one
(``api_key``, ``token``, ``password``, ``secret``, ``key_hash``…) is masked, at any depth,
whatever the caller passed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson
from sqlalchemy import Connection, text

MASK: Final = "***"
# A whole key (``api_key``, ``admin_token``…), so ``max_tokens`` or ``key_metric`` stay readable.
_SECRET_KEY: Final = re.compile(
    r"(?i)(?:[a-z0-9]+_)*(?:api_?key|token|password|passwd|secret|key_hash|authorization)"
)
MAX_ACTOR: Final = 128


def redacted(value: Any) -> Any:
    """``value`` with every secret-named field masked (a masked preview like ``***abcd`` stays)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, child in value.items():
            if isinstance(key, str) and _SECRET_KEY.fullmatch(key) and child is not None:
                out[key] = child if _is_masked(child) else MASK
            else:
                out[key] = redacted(child)
        return out
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def _is_masked(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(MASK) and len(value) <= len(MASK) + 4


def _json(value: Any) -> str:
    """JSON text of a state. PostgreSQL's jsonb writes a number like ``1.6e234`` back without
    an exponent, so a stored value can come back as an integer beyond 64 bits, which orjson
    refuses: those states go through the standard library's encoder (arbitrary-size ints)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))


def write(
    conn: Connection,
    *,
    actor: str,
    action: str,
    entity: str,
    entity_id: str | int | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    conn.execute(
        text(
            "INSERT INTO audit_log (actor, action, entity, entity_id, before, after)"
            " VALUES (:actor, :action, :entity, :eid, CAST(:before AS jsonb), CAST(:after AS jsonb))"
        ),
        {
            "actor": actor[:MAX_ACTOR],
            "action": action,
            "entity": entity,
            "eid": None if entity_id is None else str(entity_id),
            "before": None if before is None else _json(redacted(before)),
            "after": None if after is None else _json(redacted(after)),
        },
    )
