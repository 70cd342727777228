"""One kafka-python producer used batch by batch: append a batch, flush once, check it.

The sink's CPU per event is dominated by kafka-python's per-record Python code, so this
module keeps that path short (figures in bench/gateway/sink_bench.py):

* metrics off (kafka-python's per-record sensors), the C ``crc32c`` package installed;
* partitions chosen here, with the default partitioner's murmur2 cached per key, so the
  producer's partitioner and metadata lookups are skipped;
* on kafka-python >= 3, records go straight into the producer's record accumulator: the
  same call ``send`` ends with, minus its per-record validation, serialisation and logging
  (about a third of the CPU per record). Any other version uses plain ``send``.

One flush per batch; the batch's futures are then all done and checked in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import kafka
from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka.partitioner.default import murmur2

from gateway.spool import Record

log = logging.getLogger(__name__)

_FAST_APPEND = int(kafka.__version__.split(".")[0]) >= 3
_CACHE_MAX = 200_000
# Release the GIL between short runs of records, so the gateway's event loop thread is not
# kept waiting for a whole batch (up to the 5 ms switch interval): it halves the p99 of the
# loop's timers under sink load (bench/gateway/sink_bench.py); a sleep(0) per 64 records is free.
YIELD_EVERY = 64


class BatchProducer:
    """A connected producer whose topics' partitions are known."""

    def __init__(self, options: dict[str, Any], topics: Sequence[str], *, fast_append: bool = True) -> None:
        """Connect and fetch the topics' metadata; raises when the broker or a topic is missing."""
        self._producer = KafkaProducer(**options)
        try:
            self._partitions: dict[str, int] = {}
            for topic in topics:
                parts = self._producer.partitions_for(topic)
                if not parts:
                    raise RuntimeError(f"topic {topic} has no partitions")
                self._partitions[topic] = len(parts)
        except Exception:
            self._producer.close(0)
            raise
        self._tps: dict[tuple[str, bytes], TopicPartition] = {}
        self._accumulator = getattr(self._producer, "_accumulator", None)
        if not (fast_append and _FAST_APPEND) or options.get("transactional_id"):
            self._accumulator = None  # transactions need send()'s bookkeeping

    def _tp(self, topic: str, key: bytes) -> TopicPartition:
        tps = self._tps
        tp = tps.get((topic, key))
        if tp is None:
            if len(tps) > _CACHE_MAX:
                tps.clear()
            # Kafka's default partitioner, so any other producer of these topics agrees.
            tp = TopicPartition(topic, (murmur2(key) & 0x7FFFFFFF) % self._partitions[topic])
            tps[(topic, key)] = tp
        return tp

    def deliver(self, records: Sequence[Record], timeout_s: float) -> int:
        """Send and flush ``records``; return how many, from the start, were acknowledged."""
        futures = []
        tp_of = self._tp
        try:
            if self._accumulator is not None:
                append, now, ts = self._accumulator.append, time.monotonic(), int(time.time() * 1000)
                for i, (topic, key, value) in enumerate(records, 1):
                    futures.append(append(tp_of(topic, key), ts, key, value, [], now=now)[0])
                    if not i % YIELD_EVERY:
                        time.sleep(0)
            else:
                send = self._producer.send
                for topic, key, value in records:
                    futures.append(send(topic, value=value, key=key, partition=tp_of(topic, key).partition))
            self._producer.flush(timeout_s)
        except Exception as exc:
            log.warning("kafka sink: delivery of %s events failed (%s)", len(records), exc)
        return next((i for i, f in enumerate(futures) if not f.succeeded()), len(futures))

    def close(self, timeout_s: float = 0.0) -> bool:
        """Close; False while records are still pending (kafka-python then refuses: try again later).

        Pending records are abandoned (the spool has them); the producer's close flushes first
        and raises while a record has neither been acknowledged nor expired, e.g. a request to
        a hung broker.
        """
        try:
            self._producer.close(timeout_s)
        except KafkaTimeoutError:
            return False
        return True
