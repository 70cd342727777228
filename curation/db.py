"""Reading large results without holding them: a server-side cursor for one statement."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Executable


def stream(conn: Connection, batch: int, statement: Executable, params: dict[str, Any] | None = None) -> Any:
    """``statement`` on a server-side cursor, fetched ``batch`` rows at a time (the option
    applies to this statement only, not to the connection)."""
    return conn.execute(
        statement, params or {}, execution_options={"stream_results": True, "yield_per": batch}
    )
