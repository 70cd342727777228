"""The Kafka event sink: a few hundred nanoseconds on the request path, delivery in the background.

``emit`` appends the event object to a deque and returns: no encoding, no lock, no I/O.
One background thread does everything else, in order:

* **live** (spool empty, broker answering): pop a batch, encode it, hand it to
  :class:`gateway.kafka_batches.BatchProducer` (one flush per batch). Records that were not acknowledged go to
  the spool and the sink turns *degraded*.
* **degraded**: every event goes to the durable spool (fsync per batch). A probe tries to
  reach the broker with bounded exponential backoff; once it answers, the spool is replayed
  oldest first (its committed position advances per delivered batch) while newer events
  keep being appended behind it; when it is empty the sink is live again. So each unit's
  events reach Kafka in the order they were emitted, across broker outages and restarts.

If the in-memory queue grows past ``max_queue`` (Kafka slower than traffic) the sink spills
to the spool rather than dropping; only past ``hard_max_queue`` (the background thread
cannot keep up even with the disk) does ``emit`` drop, and counts it. Delivery is at least
once: a timed-out batch may have partly landed and is sent again; consumers dedup by
``event_id``. A graceful stop (``close``) spools whatever it could not deliver; a SIGKILL
loses only the in-memory queue (about one batch interval of events).

``healthy()`` means "no event is being lost" (delivering, or spooling durably); ``live``
means "Kafka is being reached". Settings live in :mod:`gateway.kafka_config`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

from kafka.errors import KafkaError

from contracts.events import Event, encode
from gateway.kafka_batches import YIELD_EVERY, BatchProducer
from gateway.kafka_config import SinkConfig, Topics, ensure_topics
from gateway.spool import Record, Spool, SpoolLockedError, claim_spool_dir

__all__ = ["KafkaSink", "SinkConfig", "Topics", "ensure_topics"]

log = logging.getLogger(__name__)


class KafkaSink:
    """``gateway.sink.EventSink`` delivering to Kafka, with a durable spool for outages."""

    def __init__(
        self,
        bootstrap: str,
        spool_root: Path,
        *,
        topics: Topics = Topics(),
        config: SinkConfig = SinkConfig(),
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.spool_root = spool_root
        self.topics = topics
        self.config = config
        self._producer_options = dict(producer_options or {})
        self._queue: collections.deque[Event] = collections.deque()
        self._hard_max = config.hard_max_queue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer: BatchProducer | None = None
        self._spool: Spool | None = None
        self._orphan: Spool | None = None
        self._next_adopt = 0.0
        self._live = False
        self._closed = False
        self._next_probe = 0.0
        self._backoff = config.backoff_initial_s
        self._counters = dict.fromkeys(
            ("delivered", "spooled", "replayed", "adopted", "send_failures", "probes"), 0
        )
        self._dropped = 0
        self._oversized = 0
        self._spool_full = False
        self._spool_dropped = 0  # written by the background thread only (emit owns _dropped)

    # --- the request path -------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if len(self._queue) >= self._hard_max or self._closed:
            self._dropped += 1
            return
        self._queue.append(event)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="liftgate-kafka-sink", daemon=True)
            self._thread.start()

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Deliver what can be delivered within ``close_timeout_s``; spool the rest; stop."""
        self._closed = True
        self._stop.set()
        if self._thread is None and self._queue:
            # Never started: the thread still claims a spool and persists what was emitted.
            self._thread = threading.Thread(target=self._run, name="liftgate-kafka-sink", daemon=True)
            self._thread.start()
        if self._thread is not None:
            self._thread.join(self.config.close_timeout_s + self.config.flush_timeout_s + 5.0)
            if self._thread.is_alive():
                log.error("kafka sink thread did not stop in time; %s events still queued", len(self._queue))

    @property
    def live(self) -> bool:
        """True while events go straight to Kafka (False while spooling, or stopped)."""
        return self._live and self._thread is not None and self._thread.is_alive()

    def healthy(self) -> bool:
        """True while no event is lost: delivered to Kafka, or durably spooled during an outage.

        Deliberately not ``live``: /readyz uses this, and a Kafka outage that the spool
        absorbs must not take every gateway out of its load balancer. ``stats()["live"]``
        tells whether Kafka is currently reached.
        """
        thread = self._thread
        return (
            thread is not None
            and thread.is_alive()
            and self._spool is not None
            and not self._spool_full
            and len(self._queue) < self._hard_max
        )

    def stats(self) -> dict[str, int]:
        spool = self._spool
        return {
            "queued": len(self._queue),
            "dropped": self._dropped + self._oversized + self._spool_dropped,
            "oversized": self._oversized,
            "spool_pending": spool.pending_records if spool else 0,
            "spool_bytes": spool.pending_bytes if spool else 0,
            "spool_corrupt": spool.corrupt_records if spool else 0,
            "live": int(self._live),
            **self._counters,
        }

    # --- the background thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._spool = claim_spool_dir(self.spool_root, segment_bytes=self.config.segment_bytes)
        except Exception:
            log.exception("kafka sink: cannot open a spool under %s; events stay in memory", self.spool_root)
            return
        log.info("kafka sink: spool %s holds %s events", self._spool.directory, self._spool.pending_records)
        while not self._stop.is_set():
            try:
                busy = self._step()
            except Exception:
                # e.g. a full disk: keep the events queued (bounded) and try again shortly.
                log.exception("kafka sink: background step failed")
                self._degrade()
                busy = False
                self._stop.wait(1.0)
            if not busy or len(self._queue) < self.config.batch_max:
                self._stop.wait(self.config.batch_interval_s)
        try:
            self._shutdown()
        except Exception:
            log.exception("kafka sink: shutdown failed; %s events not persisted", len(self._queue))

    def _step(self) -> bool:
        """One unit of work; False when idle (the caller naps)."""
        assert self._spool is not None
        if self._live:
            if len(self._queue) > self.config.max_queue:
                log.warning("kafka sink: %s events queued; spilling to the spool", len(self._queue))
                self._degrade(retry_now=True)
                return True
            batch = self._pop(self.config.batch_max)
            if not batch:
                return self._adopt_orphans()
            unacked = self._deliver(batch)
            if unacked:
                self._spool_records(unacked)
                self._degrade()
            return True
        busy = self._spill_queue()
        if time.monotonic() < self._next_probe:
            return busy
        if self._producer is None and not self._connect():
            return busy
        self._replay()
        return True

    def _pop(self, limit: int) -> list[Record]:
        q, topics, max_bytes = self._queue, self.topics, self.config.max_event_bytes
        out: list[Record] = []
        for i in range(1, min(len(q), limit) + 1):
            if not i % YIELD_EVERY:
                time.sleep(0)
            event = q.popleft()
            value = encode(event)
            if len(value) > max_bytes:
                # The broker would reject it forever, blocking the spool behind it.
                self._oversized += 1
                log.error(
                    "kafka sink: dropping event %s of %s bytes (max %s)",
                    event.event_id,
                    len(value),
                    max_bytes,
                )
                continue
            out.append((topics.of(event), event.key, value))
        return out

    def _spool_records(self, records: list[Record]) -> None:
        assert self._spool is not None
        if self._spool.pending_bytes >= self.config.max_spool_bytes:
            # A long outage must not fill the disk the gateway runs on: count and drop.
            if not self._spool_full:
                log.error(
                    "kafka sink: spool holds %s bytes (the limit); dropping events", self._spool.pending_bytes
                )
            self._spool_full = True
            self._spool_dropped += len(records)
            return
        self._spool_full = False
        self._spool.append(records)
        self._counters["spooled"] += len(records)

    def _spill_queue(self) -> bool:
        batch = self._pop(self.config.batch_max)
        if batch:
            self._spool_records(batch)
        return bool(batch)

    def _degrade(self, *, retry_now: bool = False) -> None:
        if self._live:
            log.warning("kafka sink: broker unreachable or slow; spooling events to %s", self.spool_root)
        self._live = False
        if not retry_now:
            self._close_producer()
            self._next_probe = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, self.config.backoff_max_s)

    def _connect(self) -> bool:
        self._counters["probes"] += 1
        cfg = self.config
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": cfg.linger_ms,
            "batch_size": cfg.batch_bytes,
            "max_block_ms": int(cfg.probe_timeout_s * 1000),
            "bootstrap_timeout_ms": int(cfg.probe_timeout_s * 1000),
            "request_timeout_ms": int(cfg.flush_timeout_s * 1000),
            "delivery_timeout_ms": int(cfg.flush_timeout_s * 1000) + cfg.linger_ms + 1000,
            "metrics_enabled": False,  # its per-record sensors cost more CPU than they tell us
            **self._producer_options,
        }
        try:
            if cfg.create_topics_partitions:
                ensure_topics(self.bootstrap, cfg.create_topics_partitions, self.topics, cfg.probe_timeout_s)
            topics = (self.topics.interactions, self.topics.feedback)
            self._producer = BatchProducer(options, topics, fast_append=cfg.fast_append)
        except (KafkaError, OSError, RuntimeError) as exc:
            log.info("kafka sink: broker %s not ready (%s)", self.bootstrap, exc)
            self._degrade()
            return False
        except Exception:
            log.exception("kafka sink: cannot create a producer (configuration?); spooling")
            self._degrade()
            return False
        return True

    def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(0)

    def _deliver(self, records: list[Record]) -> list[Record]:
        """Send and flush one batch; return the records not acknowledged, in order."""
        if self._producer is None:
            return records
        acked = self._producer.deliver(records, self.config.flush_timeout_s)
        self._counters["delivered"] += acked
        if acked == len(records):
            self._backoff = self.config.backoff_initial_s
            return []
        self._counters["send_failures"] += 1
        # Everything from the first failure on is retried, so a unit's order never inverts;
        # acknowledged records after it become (deduplicated) duplicates.
        return records[acked:]

    def _replay(self) -> None:
        """Deliver the spool oldest first, then go live; new events queue behind it."""
        spool = self._spool
        assert spool is not None
        deadline = time.monotonic() + 0.5  # keep spilling the queue regularly while replaying
        while not spool.empty() and time.monotonic() < deadline:
            entries = spool.read(self.config.batch_max)
            if not entries:
                break
            records = [r for r, _ in entries]
            unacked = self._deliver(records)
            done = len(records) - len(unacked)
            if done:
                spool.commit(entries[done - 1][1], done)
                self._counters["replayed"] += done
            if unacked:
                spool.rewind()
                self._degrade()
                return
        if spool.empty() and not self._queue_over_limit():
            self._live = True
            self._backoff = self.config.backoff_initial_s
            log.info("kafka sink: live again (spool drained)")

    def _claim_orphan(self) -> Spool | None:
        own = self._spool.directory if self._spool else None
        for directory in sorted(self.spool_root.iterdir()):
            if directory == own or not directory.name.isdigit() or not directory.is_dir():
                continue
            try:
                orphan = Spool(directory)
            except SpoolLockedError:
                continue  # a live process owns it
            if not orphan.empty():
                log.info("kafka sink: delivering %s events left in %s", orphan.pending_records, directory)
                return orphan
            orphan.close()
        return None

    def _adopt_orphans(self) -> bool:
        """Deliver a bit of a dead process's spool; True if there was work."""
        if self._orphan is None:
            now = time.monotonic()
            if now < self._next_adopt:
                return False
            self._next_adopt = now + self.config.adopt_interval_s
            self._orphan = self._claim_orphan()
            if self._orphan is None:
                return False
        orphan = self._orphan
        entries = orphan.read(self.config.batch_max)
        if not entries:
            orphan.close()
            self._orphan = None
            return False
        records = [r for r, _ in entries]
        unacked = self._deliver(records)
        done = len(records) - len(unacked)
        if done:
            orphan.commit(entries[done - 1][1], done)
            self._counters["adopted"] += done
        if unacked or orphan.empty():
            orphan.close()
            self._orphan = None
        if unacked:
            self._degrade()
        return True

    def _queue_over_limit(self) -> bool:
        return len(self._queue) > self.config.max_queue

    def _shutdown(self) -> None:
        deadline = time.monotonic() + self.config.close_timeout_s
        while self._live and self._queue and time.monotonic() < deadline:
            batch = self._pop(self.config.batch_max)
            unacked = self._deliver(batch)
            if unacked:
                self._spool_records(unacked)
                self._live = False
        while self._queue:
            self._spill_queue()
        self._close_producer()
        for spool in (self._orphan, self._spool):
            if spool is not None:
                spool.close()
        log.info("kafka sink stopped: %s", self.stats())
