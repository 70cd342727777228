"""``rl_rollups`` compaction: appended rows summed into one compacted row per key.

Ingest appends a row per counted response and per counted thumb; the compaction
(``analytics.ingest.rollups.compact_rl_rollups``) moves them into one row per key. What a
reader sums per key must be the same before, during and after, whatever is appended
meanwhile, and no row may be moved twice or lost.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest
from sqlalchemy import create_engine

from analytics.ingest.rollups import RL_COMPACT_LOCK, compact_all_rl_rollups, compact_rl_rollups
from analytics.service.app import rl_compaction_worker
from analytics.service.context import ServiceContext
from analytics.service.telemetry import ServiceMetrics
from tests.analytics.ingest_helpers import connect, declared_experiment, wait_for

_APPEND = (
    "INSERT INTO rl_rollups (experiment_id, variant, unit_id, category, lbin, responses, tokens,"
    " thumbs_up, thumbs_down) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_SUMS = (
    "SELECT variant, unit_id, category, lbin, sum(responses), sum(tokens), sum(thumbs_up), sum(thumbs_down)"
    " FROM rl_rollups WHERE experiment_id = %s GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
)


def _rows(exp: int, n: int, units: int = 4) -> list[tuple[Any, ...]]:
    """``n`` appended rows over a few keys (responses, then thumbs of the same keys)."""
    out = []
    for i in range(n):
        unit, lbin = f"u{i % units}", i % 3
        if i % 4 == 3:
            out.append((exp, "control", unit, "math", lbin, 0.0, 0.0, 1.0, 0.0))  # a thumb
        else:
            out.append(
                (exp, "candidate" if i % 2 else "control", unit, "math", lbin, 1.0, 10.0 + i, 0.0, 0.0)
            )
    return out


def _append(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(_APPEND, rows)
    conn.commit()


def _state(conn: psycopg.Connection[Any], exp: int) -> tuple[list[tuple[Any, ...]], int, int]:
    """(sums per key, appended rows, compacted rows)."""
    sums = conn.execute(_SUMS, (exp,)).fetchall()
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE NOT compacted), count(*) FILTER (WHERE compacted)"
        " FROM rl_rollups WHERE experiment_id = %s",
        (exp,),
    ).fetchone()
    conn.commit()
    assert row is not None
    return sums, int(row[0]), int(row[1])


def test_compaction_keeps_every_keys_sums_and_later_appends_merge_into_the_compacted_row(
    database_url: str,
) -> None:
    exp, other = declared_experiment(database_url), declared_experiment(database_url)
    with connect(database_url) as conn:
        _append(conn, _rows(exp, 40) + _rows(other, 8))
        before, appended, compacted = _state(conn, exp)
        keys = len(before)
        assert (appended, compacted) == (40, 0) and keys < 40
        assert compact_rl_rollups(conn, exp) == 40
        assert _state(conn, exp) == (before, 0, keys)
        assert _state(conn, other)[1:] == (8, 0)  # another experiment's rows are its own
        # Appended again, to existing keys and a new one: the compacted rows are added to.
        more = [*_rows(exp, 12), (exp, "control", "new-unit", "code", 7, 1.0, 5.0, 0.0, 0.0)]
        _append(conn, more)
        want = _state(conn, exp)[0]
        assert compact_rl_rollups(conn, exp) == 13
        assert _state(conn, exp) == (want, 0, keys + 1)
        assert compact_rl_rollups(conn, exp) == 0  # nothing left: a no-op
        assert _state(conn, exp) == (want, 0, keys + 1)


def test_rows_of_a_transaction_still_open_are_left_for_the_next_run(database_url: str) -> None:
    exp = declared_experiment(database_url)
    key = ("control", "u0", "math", 0)
    with connect(database_url) as writer, connect(database_url) as compactor:
        _append(writer, _rows(exp, 10))
        writer.execute(_APPEND, (exp, *key, 1.0, 99.0, 0.0, 0.0))  # not committed yet
        assert compact_rl_rollups(compactor, exp) == 10
        before = {r[:4]: r[4:] for r in _state(compactor, exp)[0]}
        writer.commit()
        sums, appended, _ = _state(compactor, exp)
        assert appended == 1  # the late row waits for the next run, and is counted meanwhile
        after = {r[:4]: r[4:] for r in sums}
        b, a = before.pop(key), after.pop(key)
        assert (a[0] - b[0], a[1] - b[1]) == (1.0, 99.0) and after == before
        assert compact_rl_rollups(compactor, exp) == 1
        assert _state(compactor, exp)[:2] == (sums, 0)


def test_a_compaction_in_progress_elsewhere_is_skipped_not_waited_for(database_url: str) -> None:
    exp = declared_experiment(database_url)
    with connect(database_url) as holder, connect(database_url) as compactor:
        _append(holder, _rows(exp, 6))
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (RL_COMPACT_LOCK, exp))
        started = time.monotonic()
        assert compact_rl_rollups(compactor, exp) == 0
        assert time.monotonic() - started < 5  # skipped, not blocked
        assert _state(compactor, exp)[1:] == (6, 0)
        holder.rollback()
        assert compact_rl_rollups(compactor, exp) == 6


def test_chunks_commit_one_by_one_and_a_passed_deadline_stops_after_one(database_url: str) -> None:
    exp = declared_experiment(database_url)
    with connect(database_url) as conn:
        _append(conn, _rows(exp, 25))
        want = _state(conn, exp)[0]
        assert compact_rl_rollups(conn, exp, chunk=7, deadline=time.monotonic() - 1) == 7
        assert _state(conn, exp)[:2] == (want, 18)  # a reader sees the same sums mid-way
        assert compact_rl_rollups(conn, exp, chunk=7) == 18
        assert _state(conn, exp)[:2] == (want, 0)
        conn.execute("SELECT 1")
        with pytest.raises(RuntimeError, match="outside a transaction"):
            compact_rl_rollups(conn, exp)


def test_compact_all_visits_each_experiment_with_appended_rows(database_url: str) -> None:
    a, b = declared_experiment(database_url), declared_experiment(database_url)
    with connect(database_url) as conn:
        _append(conn, _rows(a, 9) + _rows(b, 5))
        assert compact_all_rl_rollups(conn) >= 14  # other tests' experiments may have some too
        assert _state(conn, a)[1] == 0 and _state(conn, b)[1] == 0


def _sample(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_service_worker_compacts_what_ingest_appends(database_url: str) -> None:
    exp = declared_experiment(database_url)
    engine = create_engine(database_url)
    metrics = ServiceMetrics()
    ctx = cast(
        ServiceContext,
        SimpleNamespace(settings=SimpleNamespace(rl_compact_interval_s=0.05), engine=engine, metrics=metrics),
    )
    worker = rl_compaction_worker(ctx)
    assert worker is not None and worker.name == "rl-compaction"
    off = cast(
        ServiceContext,
        SimpleNamespace(settings=SimpleNamespace(rl_compact_interval_s=0.0), engine=engine, metrics=metrics),
    )
    assert rl_compaction_worker(off) is None
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    try:
        with connect(database_url) as conn:
            _append(conn, _rows(exp, 30))
            want = _state(conn, exp)[0]
            thread.start()
            wait_for(lambda: _state(conn, exp)[1] == 0, 30, "the worker to compact the appended rows")
            assert _state(conn, exp) == (want, 0, len(want))
        runs = "liftgate_analytics_rl_compaction_runs_total"
        wait_for(lambda: _sample(metrics, runs, outcome="ok") >= 1, 10, "a counted run")
        assert _sample(metrics, "liftgate_analytics_rl_compacted_rows_total") >= 30
        assert _sample(metrics, runs, outcome="error") == 0
    finally:
        stop.set()
        thread.join(10)
        engine.dispose()
    assert not thread.is_alive()
