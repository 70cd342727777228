"""The dead-letter table: messages the consumer could not decode or the database rejected."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None
    payload: bytes
    reason: str


def write_dead_letters(pg: psycopg.Connection[Any], rows: Sequence[DeadLetterRow]) -> None:
    """Store rows in the caller's transaction (the same one that ingests the batch)."""
    if not rows:
        return
    with (
        pg.cursor() as cur,
        cur.copy(
            b'COPY dead_letters (topic, "partition", "offset", key, payload, reason) FROM STDIN'
        ) as copy,
    ):
        for r in rows:
            # NUL is the one character Postgres text cannot hold; the raw bytes keep it.
            copy.write_row(
                (r.topic, r.partition, r.offset, r.key, r.payload, r.reason.replace("\x00", "\\0"))
            )
