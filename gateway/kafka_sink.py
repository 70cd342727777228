"""The Kafka event sink: a deque append on the request path, a write-ahead spool, delivery apart.

``emit`` appends the event object to a deque and returns: no encoding, no lock, no I/O.
Three background threads do the rest:

* the **spool writer** never touches the network: every ``spool_interval_s`` (20 ms) it
  encodes what was queued and appends it to the durable spool (:mod:`gateway.spool`, one
  ``write``, no fsync). Once there, an event survives the gateway being killed; so a SIGKILL
  loses only what was emitted in the last ~20 ms, whether Kafka is up, down or slow;
* **delivery** (:mod:`gateway.delivery`) sends the spool to Kafka oldest first and commits
  its position once acknowledged. Flushes to a dead broker, reconnects and backoff happen
  there and hold up nothing else. Fresh records are handed over in memory while it keeps up;
  after an outage or a restart it replays them from the spool's files. It also delivers
  spools that processes now gone left behind;
* the **syncer** fsyncs what was spooled and is still unacknowledged half an interval later,
  so a power loss loses at most ``fsync_interval_s`` (1 s) of the unacknowledged events —
  and while Kafka keeps up, nothing is fsynced at all.

Each unit's events reach Kafka in the order they were emitted, across outages and restarts.
Delivery is at least once: a timed-out batch may have partly landed and is sent again, and a
process killed between an acknowledgement and its commit sends it again after the restart;
consumers deduplicate by ``event_id``. Only past ``hard_max_queue`` queued events (the writer
cannot keep up even with the disk) or ``max_spool_bytes`` spooled ones (a very long outage)
are events dropped, and counted.

``healthy()`` means "no event is being lost" (written to the spool); ``live`` means "Kafka is
being reached". Settings live in :mod:`gateway.kafka_config`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from pathlib import Path
from typing import Any

from contracts.events import Event, encode
from eventbus import Bus, BusError, ProducerOptions, open_bus
from eventbus.interface import YIELD_EVERY
from gateway.delivery import Chunk, Delivery, Transport, TransportUnavailable
from gateway.kafka_config import SinkConfig, Topics, ensure_topics
from gateway.kafka_transport import BusTransport
from gateway.spool import Record, Spool, claim_spool_dir

__all__ = ["KafkaSink", "SinkConfig", "Topics", "ensure_topics"]

log = logging.getLogger(__name__)


class KafkaSink:
    """``gateway.sink.EventSink`` delivering to Kafka through a durable write-ahead spool."""

    def __init__(
        self,
        bootstrap: str,
        spool_root: Path,
        *,
        topics: Topics = Topics(),
        config: SinkConfig = SinkConfig(),
        bus: Bus | None = None,
        producer_options: dict[str, Any] | None = None,
    ) -> None:
        """``bus``: the Kafka client backend (``eventbus.open_bus``; None: the automatic choice).

        ``producer_options``: extra settings of the backend's producer, as it names them.
        """
        self.bootstrap = bootstrap
        self.bus = bus if bus is not None else open_bus("auto")
        self.spool_root = spool_root
        self.topics = topics
        self.config = config
        self._producer_options = dict(producer_options or {})
        self._queue: collections.deque[Event] = collections.deque()
        self._hard_max = config.hard_max_queue
        self._closed = False
        self._stop = threading.Event()  # the writer: drain the queue and return
        self._sync_stop = threading.Event()
        self._spooling = threading.Event()  # the writer holds a spool (or could not get one)
        self._sync_wanted = threading.Event()
        self._writer: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._syncer: threading.Thread | None = None
        self._spool: Spool | None = None
        self._delivery: Delivery | None = None
        self._unwritten: list[Record] = []  # encoded, not in the spool yet (its last write failed)
        self._write_failing = False
        self._counters = dict.fromkeys(("spooled", "write_failures", "fsyncs"), 0)
        self._dropped = 0  # written by emit only
        self._oversized = 0
        self._spool_full = False
        self._spool_dropped = 0  # written by the writer only

    # --- the request path -------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if len(self._queue) >= self._hard_max or self._closed:
            self._dropped += 1
            return
        self._queue.append(event)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the threads; return once a spool is held, so ``healthy()`` is true from here."""
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="liftgate-sink-spool", daemon=True)
            self._writer.start()
        await asyncio.to_thread(self._spooling.wait, 30.0)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Spool everything queued, deliver what can be within ``close_timeout_s``, fsync, stop."""
        cfg = self.config
        self._closed = True
        self._stop.set()
        if self._writer is None:
            # Never started: the writer still claims a spool and persists what was emitted.
            self._writer = threading.Thread(target=self._write_loop, name="liftgate-sink-spool", daemon=True)
            self._writer.start()
        self._writer.join(cfg.close_timeout_s + 30.0)
        if self._writer.is_alive():
            log.error(
                "kafka sink: spool writer did not stop in time; %s events still queued", len(self._queue)
            )
        if self._delivery is not None and self._sender is not None:
            self._delivery.stop(cfg.close_timeout_s)
            self._sender.join(cfg.close_timeout_s + cfg.flush_timeout_s + cfg.probe_timeout_s + 5.0)
            if self._sender.is_alive():
                log.error("kafka sink: delivery thread did not stop in time")
        self._sync_stop.set()
        self._sync_wanted.set()
        if self._syncer is not None:
            self._syncer.join(30.0)
        spool, sender = self._spool, self._sender
        if spool is not None and not self._writer.is_alive() and not (sender and sender.is_alive()):
            try:
                spool.sync()  # a graceful stop leaves nothing that a power loss could take
            except OSError:
                log.exception("kafka sink: final fsync of the spool failed")
            spool.close()
        log.info("kafka sink stopped: %s", self.stats())

    @property
    def live(self) -> bool:
        """True while Kafka is being reached and acknowledges what is sent."""
        sender = self._sender
        return self._delivery is not None and self._delivery.live and sender is not None and sender.is_alive()

    def healthy(self) -> bool:
        """True while no event is lost: every emitted event is being written to the spool.

        Deliberately not ``live``: /readyz uses this, and a Kafka outage that the spool
        absorbs must not take every gateway out of its load balancer. ``stats()["live"]``
        tells whether Kafka is currently reached.
        """
        writer, sender = self._writer, self._sender
        return (
            writer is not None
            and writer.is_alive()
            and sender is not None
            and sender.is_alive()
            and self._spool is not None
            and not self._spool_full
            and not self._write_failing
            and len(self._queue) < self._hard_max
        )

    def stats(self) -> dict[str, int]:
        spool, delivery = self._spool, self._delivery
        return {
            "queued": len(self._queue) + len(self._unwritten),
            "dropped": self._dropped + self._oversized + self._spool_dropped,
            "oversized": self._oversized,
            "spool_pending": spool.pending_records if spool else 0,
            "spool_bytes": spool.pending_bytes if spool else 0,
            "spool_corrupt": spool.corrupt_records if spool else 0,
            "live": int(self.live),
            "clients_closing": delivery.clients_closing if delivery else 0,
            **self._counters,
            **(
                delivery.counters
                if delivery
                else dict.fromkeys(("delivered", "replayed", "adopted", "send_failures", "probes"), 0)
            ),
        }

    # --- the spool writer -------------------------------------------------------------------

    def _write_loop(self) -> None:
        try:
            spool = claim_spool_dir(self.spool_root, segment_bytes=self.config.segment_bytes)
        except Exception:
            log.exception("kafka sink: cannot open a spool under %s; events stay in memory", self.spool_root)
            self._spooling.set()
            return
        self._spool = spool
        log.info("kafka sink: spool %s holds %s events", spool.directory, spool.pending_records)
        if not self._stop.is_set():
            self._delivery = Delivery(spool, self.spool_root, self._connect, self.config.delivery())
            self._sender = threading.Thread(
                target=self._delivery.run, name="liftgate-sink-delivery", daemon=True
            )
            self._sender.start()
            self._syncer = threading.Thread(target=self._sync_loop, name="liftgate-sink-fsync", daemon=True)
            self._syncer.start()
        self._spooling.set()
        interval = self.config.spool_interval_s
        while not self._stop.is_set():
            if not self._write_batch() or len(self._queue) < self.config.batch_max:
                # A plain sleep: a wake-up costs half the CPU of Event.wait's, and a stop
                # request waits one interval at most.
                time.sleep(interval if not self._write_failing else 1.0)
        # Stopping: everything queued goes to the spool (a disk that keeps failing ends it).
        for _ in range(10):
            while self._write_batch():
                pass
            if not (self._queue or self._unwritten):
                break
            time.sleep(0.2)

    def _write_batch(self) -> bool:
        """Spool up to ``batch_max`` queued events; False when there was nothing or the write failed."""
        spool = self._spool
        assert spool is not None
        if not self._unwritten:
            self._unwritten = self._pop(self.config.batch_max)
        records = self._unwritten
        if not records:
            return False
        if spool.pending_bytes >= self.config.max_spool_bytes:
            # A long outage must not fill the disk the gateway runs on: count and drop.
            if not self._spool_full:
                log.error(
                    "kafka sink: spool holds %s bytes (the limit); dropping events", spool.pending_bytes
                )
            self._spool_full = True
            self._spool_dropped += len(records)
            self._unwritten = []
            return True
        self._spool_full = False
        delivery = self._delivery
        offer = None if delivery is None else lambda start, ends: delivery.offer(Chunk(start, records, ends))
        try:
            spool.append(records, offer)
        except OSError:
            # e.g. a full disk: keep the batch (and the queue, bounded) and try again shortly.
            if not self._write_failing:
                log.exception("kafka sink: cannot write to the spool %s; retrying", spool.directory)
            self._write_failing = True
            self._counters["write_failures"] += 1
            return False
        if self._write_failing:
            log.info("kafka sink: spool writes succeed again")
        self._write_failing = False
        self._unwritten = []
        self._counters["spooled"] += len(records)
        if self.config.fsync_interval_s == 0:
            self._sync_wanted.set()
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

    # --- the syncer -----------------------------------------------------------------------

    def _sync_loop(self) -> None:
        """fsync, twice per interval, what was spooled before the previous tick and is not delivered.

        So nothing unacknowledged stays in the page cache only for longer than the interval,
        and while Kafka acknowledges within half an interval (the usual case) nothing is
        fsynced at all: the disk sees no writes for events that were only passing through.
        """
        spool = self._spool
        assert spool is not None
        interval = self.config.fsync_interval_s
        previous = spool.end
        while not self._sync_stop.is_set():
            if interval > 0:
                self._sync_stop.wait(interval / 2)
                upto, previous = previous, spool.end
            else:
                self._sync_wanted.wait()
                self._sync_wanted.clear()
                upto = None
            if self._sync_stop.is_set():
                return  # close_sync does the last one, after the writer's last append
            try:
                if spool.sync(upto):
                    self._counters["fsyncs"] += 1
            except OSError:
                log.exception("kafka sink: fsync of the spool failed")

    # --- Kafka ----------------------------------------------------------------------------

    def _connect(self) -> Transport:
        """A producer whose topics exist (created when missing); TransportUnavailable while down."""
        cfg = self.config
        flush_ms = int(cfg.flush_timeout_s * 1000)
        options = ProducerOptions(
            bootstrap=self.bootstrap,
            client_id=cfg.client_id,
            linger_ms=cfg.linger_ms,
            batch_bytes=cfg.batch_bytes,
            # Every record is acknowledged or expired by the time a flush gives up, so no
            # record of a failed batch is still retried by the client while delivery backs off.
            delivery_timeout_ms=flush_ms - 100,
            request_timeout_ms=max(flush_ms - 100 - cfg.linger_ms - 100, 100),
            reconnect_backoff_max_ms=cfg.reconnect_backoff_max_ms,
            extra=self._producer_options,
        )
        topics = self.topics.all
        probe_s = cfg.probe_timeout_s
        try:
            if cfg.create_topics_partitions:
                self.bus.ensure_topics(self.bootstrap, topics, cfg.create_topics_partitions, probe_s)
            producer = self.bus.producer(options)
        except BusError as exc:
            raise TransportUnavailable(f"broker {self.bootstrap}: {exc}") from exc
        try:
            missing = [t for t in topics if not producer.partition_count(t, probe_s)]
            if missing:
                raise TransportUnavailable(f"topics {missing} do not exist at {self.bootstrap}")
        except (BusError, TransportUnavailable) as exc:
            producer.close(0)
            if isinstance(exc, TransportUnavailable):
                raise
            raise TransportUnavailable(f"broker {self.bootstrap}: {exc}") from exc
        return BusTransport(producer)
