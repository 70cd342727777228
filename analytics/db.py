"""Run a driver-level SQL statement on whatever connection the caller holds.

Reports and tests hold SQLAlchemy engines, connections or sessions; ingest and the
consumer hold raw psycopg connections. The hand-written SQL in analytics uses psycopg's
``%s`` / ``%(name)s`` placeholders, which every one of these accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

AnyConn = Engine | Connection | Session | psycopg.Connection[Any]
Params = Sequence[Any] | Mapping[str, Any] | None


def _sa(params: Params) -> Any:
    """SQLAlchemy reads a list of parameters as executemany; positional params must be a tuple."""
    return tuple(params) if isinstance(params, list) else params


def fetch_all(conn: AnyConn, sql: str, params: Params = None) -> list[tuple[Any, ...]]:
    if isinstance(conn, psycopg.Connection):
        return list(conn.execute(sql.encode(), params).fetchall())
    params = _sa(params)
    if isinstance(conn, Engine):
        with conn.connect() as c:
            return [tuple(r) for r in c.exec_driver_sql(sql, params).fetchall()]
    if isinstance(conn, Session):
        return [tuple(r) for r in conn.connection().exec_driver_sql(sql, params).fetchall()]
    return [tuple(r) for r in conn.exec_driver_sql(sql, params).fetchall()]


def execute(conn: AnyConn, sql: str, params: Params = None) -> None:
    """Execute in the caller's transaction (an Engine gets its own, committed)."""
    if isinstance(conn, psycopg.Connection):
        conn.execute(sql.encode(), params)
        return
    params = _sa(params)
    if isinstance(conn, Engine):
        with conn.begin() as c:
            c.exec_driver_sql(sql, params)
    elif isinstance(conn, Session):
        conn.connection().exec_driver_sql(sql, params)
    else:
        conn.exec_driver_sql(sql, params)
