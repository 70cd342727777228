"""One lock discipline for every change to an experiment's state.

A change takes the experiment's transaction-scoped advisory lock, then re-reads the rows it
will change ``FOR UPDATE`` in the same transaction and decides from what it read there.
Whoever comes second (a controller look, an operator's PATCH, a rollout action) waits for —
or, for the controller, skips — the first, and then sees its committed state: two writers
never interleave, so stage and weights always come from one decision.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import Connection, text

#: First key of the two-int advisory lock: "liftgate rollout" namespace (any fixed int4).
LOCK_NAMESPACE: Final = 0x1F7_0DE


def try_lock(conn: Connection, experiment_id: int) -> bool:
    """Non-blocking (the controller): False when another transaction works on this experiment."""
    got = conn.execute(
        text("SELECT pg_try_advisory_xact_lock(:ns, :e)"), {"ns": LOCK_NAMESPACE, "e": experiment_id}
    ).scalar_one()
    return bool(got)


def lock(conn: Connection, experiment_id: int) -> None:
    """Blocking (operators): waits for a controller's short transaction to commit."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:ns, :e)"), {"ns": LOCK_NAMESPACE, "e": experiment_id})
