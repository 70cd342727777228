"""Exactly once: a consumer process SIGKILLed at random moments, then Postgres stopped for 30 s."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psycopg
import pytest

from analytics.ingest.consumer import ConsumerMetrics, ConsumerSettings, run_consumer
from contracts.events import Event, InteractionEvent
from eventbus import ClientChoice
from liftgate import db as dbmod
from liftgate.embedded_pg import EmbeddedPostgres
from tests.analytics.ingest_helpers import (
    assert_rollups_equal,
    committed_offsets,
    connect,
    count_rows,
    create_topics,
    declared_experiment,
    event_records,
    expected_rollups,
    pg_url,
    produce,
    random_events,
    stored_rollups,
    wait_for,
)

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[3]


def _produce_slowly(
    bootstrap: str,
    events: list[Event],
    topics: tuple[str, str],
    chunks: int,
    gap_s: float,
    paced_by: Callable[[], int] | None = None,
    per_step: int = 3,
) -> threading.Thread:
    """Produce the events in ``chunks`` parts, ``gap_s`` apart, in a background thread.

    With ``paced_by`` (a counter of kills) the stream never runs more than a few steps ahead
    of it: chunk j waits (at most 20 s) until ``paced_by() >= j // per_step - 1``, so on a
    loaded machine, where each restart is slow, the kills still land while events remain."""
    records = event_records(events, *topics)
    size = -(-len(records) // chunks)

    def run() -> None:
        for j, i in enumerate(range(0, len(records), size)):
            if paced_by is not None:
                deadline = time.monotonic() + 20
                while paced_by() < j // per_step - 1 and time.monotonic() < deadline:
                    time.sleep(0.05)
            produce(bootstrap, records[i : i + size])
            time.sleep(gap_s)  # paces the stream so that kills/outages land mid-flow

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _start_consumer(env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """``python -m analytics.ingest.consumer`` with these settings, output appended to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "analytics.ingest.consumer"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _all_ingested(database_url: str, exp: int, events: list[Event]) -> bool:
    n_i = sum(1 for e in events if isinstance(e, InteractionEvent))
    got_i = count_rows(database_url, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp)
    got_f = count_rows(
        database_url,
        "SELECT count(*) FROM feedback WHERE experiment_id = %s",
        exp,
    )
    attributable = len(events) - n_i  # every feedback in random_events refers to one of its interactions
    return got_i == n_i and got_f == attributable


def test_consumer_killed_with_sigkill_at_random_moments_ingests_every_event_exactly_once(
    database_url: str, kafka_bootstrap: str, unique_name: str, tmp_path: Path, kafka_client: ClientChoice
) -> None:
    rng = random.Random(42)
    topics = (f"i-{unique_name}", f"f-{unique_name}")
    create_topics(kafka_bootstrap, *topics)
    exp = declared_experiment(database_url)
    events = random_events(exp, 9000, rng, units=300)
    n_interactions = sum(1 for e in events if isinstance(e, InteractionEvent))
    env = {
        **os.environ,
        "LIFTGATE_DATABASE_URL": database_url,
        "LIFTGATE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LIFTGATE_CONSUMER_GROUP": f"g-{unique_name}",
        "LIFTGATE_INTERACTIONS_TOPIC": topics[0],
        "LIFTGATE_FEEDBACK_TOPIC": topics[1],
        "LIFTGATE_JUDGEMENTS_TOPIC": f"{topics[0]}.judgements",  # not the shared broker's default
        "LIFTGATE_CONSUMER_MAX_RECORDS": "300",
        "LIFTGATE_CONSUMER_POLL_MS": "50",
        "LIFTGATE_CONSUMER_SWEEP_INTERVAL_S": "1",
        # Static membership: the restarted process takes the partitions back at once.
        "LIFTGATE_CONSUMER_INSTANCE_ID": f"m-{unique_name}",
        "LIFTGATE_KAFKA_CLIENT": kafka_client,
    }
    log = (tmp_path / "consumer.log").open("ab")

    def start() -> subprocess.Popen[bytes]:
        return _start_consumer(env, log)

    def ingested() -> int:
        return count_rows(database_url, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp)

    kills_mid_run = 0
    kills = 0
    producer = _produce_slowly(kafka_bootstrap, events, topics, chunks=40, gap_s=0.75, paced_by=lambda: kills)
    deadline = time.monotonic() + 150
    proc = start()
    try:
        while kills < 12 and time.monotonic() < deadline:
            seen = ingested()
            # Kill only once this process is really writing, then at a random moment after.
            try:
                wait_for(lambda seen=seen: ingested() > seen, 30, "progress before a kill", interval=0.05)
            except AssertionError:
                break  # nothing left to consume
            time.sleep(rng.uniform(0.0, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            kills += 1
            kills_mid_run += 0 < ingested() < n_interactions
            proc = start()
        producer.join(timeout=120)
        wait_for(
            lambda: _all_ingested(database_url, exp, events), 120, "every event ingested after the kills"
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    assert kills >= 10, f"only {kills} kills happened"
    assert kills_mid_run >= 10, f"only {kills_mid_run} kills landed mid-run"
    assert ingested() == n_interactions
    with connect(database_url) as conn:
        assert_rollups_equal(stored_rollups(conn, exp), expected_rollups(events))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_postgres_stopped_for_30_seconds_mid_run_loses_and_doubles_nothing(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    # Our own server (own port and data dir): the shared one on 15432 is never stopped.
    pg = EmbeddedPostgres(data_dir=tmp_path / "pg", port=_free_port(), durable=False)
    pg.start()
    try:
        url = pg.ensure_database("lg_outage")
        dbmod.upgrade(url)
        topics = (f"i-{unique_name}", f"f-{unique_name}")
        create_topics(kafka_bootstrap, *topics)
        exp = declared_experiment(url)
        events = random_events(exp, 6000, random.Random(7), units=200)
        settings = ConsumerSettings(
            database_url=url,
            kafka_bootstrap=kafka_bootstrap,
            consumer_group=f"g-{unique_name}",
            interactions_topic=topics[0],
            feedback_topic=topics[1],
            judgements_topic=f"{topics[0]}.judgements",
            consumer_max_records=300,
            consumer_poll_ms=50,
            consumer_max_backoff_s=2.0,
            consumer_sweep_interval_s=1.0,
        )
        from prometheus_client import CollectorRegistry

        metrics = ConsumerMetrics(CollectorRegistry())
        stop = threading.Event()
        consumer = threading.Thread(target=run_consumer, args=(settings, stop, metrics), daemon=True)
        consumer.start()
        producer = _produce_slowly(kafka_bootstrap, events, topics, chunks=60, gap_s=0.75)
        try:
            wait_for(
                lambda: (
                    count_rows(url, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp) > 500
                ),
                60,
                "ingest under way",
            )
            pg.stop()
            outage_start = time.monotonic()
            wait_for(
                lambda: (metrics.registry.get_sample_value("liftgate_analytics_db_retries_total") or 0) > 0,
                15,
                "retries",
            )
            committed_early = committed_offsets(kafka_bootstrap, settings.consumer_group)
            time.sleep(max(0.0, 30 - (time.monotonic() - outage_start)))  # the outage itself
            committed_late = committed_offsets(kafka_bootstrap, settings.consumer_group)
            pg.start()
            producer.join(timeout=120)
            wait_for(lambda: _all_ingested(url, exp, events), 120, "every event ingested after the outage")
        finally:
            stop.set()
            consumer.join(timeout=60)
        assert committed_early == committed_late, "offsets were committed while Postgres was down"
        assert not consumer.is_alive()
        with connect(url) as conn:
            assert_rollups_equal(stored_rollups(conn, exp), expected_rollups(events))
    finally:
        pg.stop()


def test_sigterm_while_postgres_blocks_the_write_exits_within_the_grace_and_commits_nothing(
    database_url: str, kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    """A write stuck in Postgres (here: a lock held elsewhere) must not keep the process alive.

    SIGTERM → the writer's statement is cancelled after ``consumer_stop_grace_s``, its
    transaction rolls back and no offset is committed; a restarted consumer ingests the
    same events exactly once.
    """
    topics = (f"i-{unique_name}", f"f-{unique_name}")
    create_topics(kafka_bootstrap, *topics)
    exp = declared_experiment(database_url)
    events = random_events(exp, 600, random.Random(7), units=50)
    group = f"g-{unique_name}"
    env = {
        **os.environ,
        "LIFTGATE_DATABASE_URL": database_url,
        "LIFTGATE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LIFTGATE_CONSUMER_GROUP": group,
        "LIFTGATE_INTERACTIONS_TOPIC": topics[0],
        "LIFTGATE_FEEDBACK_TOPIC": topics[1],
        "LIFTGATE_JUDGEMENTS_TOPIC": f"{topics[0]}.judgements",  # not the shared broker's default
        "LIFTGATE_CONSUMER_STOP_GRACE_S": "2",
    }
    log = (tmp_path / "consumer.log").open("ab")

    def start() -> subprocess.Popen[bytes]:
        return _start_consumer(env, log)

    def lock_waiters() -> int:
        return count_rows(
            database_url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query ILIKE %s",
            "%FROM lg_fold%",  # the fold statement (it upserts unit_rollups)
        )

    blocker = psycopg.connect(pg_url(database_url))
    proc = start()
    try:
        blocker.execute("LOCK TABLE unit_rollups IN ACCESS EXCLUSIVE MODE")  # held until rollback
        produce(kafka_bootstrap, event_records(events, *topics))
        wait_for(lambda: lock_waiters() > 0, 60, "the consumer's write to wait on the lock")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        stopped_after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        blocker.rollback()
        blocker.close()
    assert stopped_after < 20, stopped_after
    assert count_rows(database_url, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp) == 0
    committed = committed_offsets(kafka_bootstrap, group)
    assert all(offset <= 0 for offset in committed.values()), committed
    proc = start()
    try:
        wait_for(lambda: _all_ingested(database_url, exp, events), 90, "every event after the restart")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    with connect(database_url) as conn:
        assert_rollups_equal(stored_rollups(conn, exp), expected_rollups(events))
