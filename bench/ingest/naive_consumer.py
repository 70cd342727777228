"""A naive Kafka → COPY consumer: the reference pipeline for ``bench_ingest.py --naive``.

What a team would write without liftgate's guarantees: poll, decode (the same
``contracts.events.decode``), COPY the interaction rows straight into ``interactions``
(psycopg's ``write_row``, same columns), commit, commit the offsets. No de-duplication
(a batch holding a redelivered event is written again without the stored ones), no rollups, no dead letters, no conversation or
feedback handling. Same Kafka client (``LIFTGATE_KAFKA_CLIENT``), settings and GC tuning as the real consumer,
and the same overlap (the next poll runs while the previous batch is written).

Reads the real consumer's environment (LIFTGATE_DATABASE_URL, LIFTGATE_KAFKA_BOOTSTRAP,
LIFTGATE_CONSUMER_GROUP, LIFTGATE_INTERACTIONS_TOPIC); stops on SIGTERM.
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from analytics.ingest import copy_text
from analytics.ingest.consumer import ConsumerSettings, _pg_url, consumer_options, tune_gc
from contracts.events import InteractionEvent, decode
from eventbus import TopicPartition, open_bus

COPY = f"COPY interactions ({copy_text.INTERACTION_COLUMNS}) FROM STDIN".encode()


def write(pg: psycopg.Connection[Any], values: list[bytes]) -> None:
    events = [decode(v) for v in values]
    try:
        _copy(pg, events)
    except psycopg.errors.UniqueViolation:
        # Redelivered after the group's start-up rebalance (the first member to join owns
        # every partition for a moment): skip what is stored, or the reference run dies.
        ids = "{" + ",".join(e.event_id for e in events) + "}"
        rows = pg.execute(b"SELECT event_id::text FROM interactions WHERE event_id = ANY(%s::uuid[])", (ids,))
        stored = {r[0] for r in rows.fetchall()}
        pg.commit()
        _copy(pg, [e for e in events if e.event_id not in stored])


def _copy(pg: psycopg.Connection[Any], events: list[Any]) -> None:
    with pg.transaction(), pg.cursor() as cur, cur.copy(COPY) as copy:
        for e in events:
            assert isinstance(e, InteractionEvent)
            copy.write_row(copy_text.interaction_row(e, copy_text.ts_text(e.ts)))


def main() -> None:
    s = ConsumerSettings()
    tune_gc(s.consumer_gc_gen0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kafka = open_bus(s.kafka_client).consumer(consumer_options(s))
    kafka.subscribe([s.interactions_topic])
    pg = psycopg.connect(_pg_url(s.database_url), options="-c synchronous_commit=on")
    pool = ThreadPoolExecutor(1)
    pending: tuple[Any, dict[TopicPartition, int]] | None = None

    def finish() -> None:
        assert pending is not None
        pending[0].result()
        # The written batch's offsets (not the newer positions), of partitions still owned: a
        # rebalance may have moved one to a member that committed further meanwhile.
        owned = set(kafka.assignment())
        offsets = {tp: o for tp, o in pending[1].items() if tp in owned}
        if offsets:
            kafka.commit(offsets)

    try:
        while not stop.is_set():
            records = kafka.poll_batch(s.consumer_max_records, 0.2)
            if pending is not None:
                finish()
                pending = None
            values = [r.value or b"" for r in records]
            if values:
                offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
                pending = (pool.submit(write, pg, values), offsets)
        if pending is not None:
            finish()
    finally:
        pool.shutdown()
        kafka.close()
        pg.close()


if __name__ == "__main__":
    main()
