"""The RL-risk rollup's length bin in SQL is ``analytics.risks.curve.length_bin``'s."""

from __future__ import annotations

import numpy as np

from analytics.ingest.rollups import length_bin_sql
from analytics.risks.curve import length_bin
from tests.analytics.ingest_helpers import connect


def test_the_sql_length_bin_is_the_python_one_at_every_edge(database_url: str) -> None:
    # Every edge 2^(b/2) - 1 rounded either way, and NULL / negative tokens (bin 0).
    edges = [2 ** (b / 2) - 1 for b in range(60)]
    tokens = sorted({max(0, int(v) + d) for v in edges for d in (-1, 0, 1)} | {0, 1, 2, 3, 10**9})
    with connect(database_url) as conn:
        rows = conn.execute(
            f"SELECT t, {length_bin_sql('t')} FROM unnest(%s::int[]) t".encode(), (tokens,)
        ).fetchall()
        nulls = conn.execute(
            f"SELECT {length_bin_sql('NULL::int')}, {length_bin_sql('(-5)')}".encode()
        ).fetchone()
    assert [b for _, b in rows] == length_bin(np.array([t for t, _ in rows])).tolist()
    assert nulls == (0, 0)
