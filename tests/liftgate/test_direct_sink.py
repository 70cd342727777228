"""DirectSink end to end against real PostgreSQL: rollups, non-blocking emit, outage recovery."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

from contracts.events import InteractionEvent
from liftgate import db as dbmod
from liftgate.direct_sink import DirectSink
from liftgate.embedded_pg import EmbeddedPostgres
from tests.analytics.ingest_helpers import (
    assert_rollups_equal,
    connect,
    count_rows,
    declared_experiment,
    expected_rollups,
    interaction,
    new_experiment_id,
    random_events,
    stored_rollups,
    wait_for,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_events_emitted_to_the_direct_sink_land_in_rollups(database_url: str) -> None:
    exp = declared_experiment(database_url)  # its events' tag keys are rolled up as segments
    events = random_events(exp, 5000, random.Random(3), units=100)
    sink = DirectSink(database_url, batch_size=700, interval_s=0.05)
    await sink.start()
    for e in events:
        sink.emit(e)
    await sink.close()
    assert sink.stats()["delivered"] == len(events)
    assert sink.stats()["queued"] == 0
    with connect(database_url) as conn:
        assert_rollups_equal(stored_rollups(conn, exp), expected_rollups(events))


def test_emit_never_blocks_and_memory_stays_bounded_while_the_database_is_unreachable() -> None:
    sink = DirectSink(
        f"postgresql://postgres@127.0.0.1:{_free_port()}/nothing",
        max_queue=1000,
        interval_s=0.01,
        close_timeout_s=0.5,
    )
    sink.start_thread()
    exp = new_experiment_id()
    events = [interaction(exp, "control", f"u{i}") for i in range(5000)]
    t0 = time.perf_counter()
    for e in events:
        sink.emit(e)
    per_emit_us = (time.perf_counter() - t0) / len(events) * 1e6
    wait_for(lambda: sink.stats()["retries"] >= 2, 30, "retries against the dead database")
    assert per_emit_us < 50, per_emit_us  # typically < 1 µs; generous for a loaded CI box
    assert not sink.healthy()
    stats = sink.stats()
    assert stats["delivered"] == 0
    assert stats["dropped"] >= 4000 - sink._batch_size
    assert stats["queued"] <= 1000
    t1 = time.monotonic()
    sink.close_sync()
    assert time.monotonic() - t1 < 10


def test_direct_sink_retries_through_a_database_restart_and_delivers_everything_once(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(data_dir=tmp_path / "pg", port=_free_port(), durable=False)
    pg.start()
    try:
        url = pg.ensure_database("lg_direct")
        dbmod.upgrade(url)
        exp = new_experiment_id()
        events = [interaction(exp, "control" if i % 2 else "candidate", f"u{i % 50}") for i in range(3000)]
        sink = DirectSink(url, batch_size=200, interval_s=0.02, max_backoff_s=0.5)
        sink.start_thread()
        for e in events[:1000]:
            sink.emit(e)
        wait_for(lambda: sink.stats()["delivered"] == 1000, 30, "first part delivered")
        pg.stop()
        for e in events[1000:]:
            sink.emit(e)
        wait_for(lambda: sink.stats()["retries"] > 0, 30, "a failed write")
        assert not sink.healthy()
        pg.start()
        wait_for(
            lambda: sink.stats()["delivered"] == len(events), 60, "everything delivered after the restart"
        )
        assert sink.healthy()
        sink.close_sync()
        n = count_rows(url, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp)
        assert n == len(events)
        with connect(url) as conn:
            got = stored_rollups(conn, exp)
        assert sum(m["requests"] for m in got.values()) == len(events)
        assert all(isinstance(e, InteractionEvent) for e in events)
    finally:
        pg.stop()
