"""Delivery: the thread that moves spooled events to the event bus, and the bus's narrow interface.

Every event is in the spool (:mod:`gateway.spool`) before delivery sees it, so this thread
may block as long as the bus makes it — a flush to a dead broker, a reconnect, a slow
metadata lookup — without any event waiting in memory meanwhile. It sends records in
spool order and commits the spool's position once the bus acknowledged them; a failure
rewinds to the committed position, drops the connection and retries with exponential
backoff. Records just written are usually handed over in memory as well (``offer``), so the
live path does not read its own writes back; after an outage, a restart or when delivery
fell behind, they are read from the spool's files (``replayed``).

The bus is anything with ``deliver`` and ``close`` (:class:`Transport`), made by a
``connect`` function that raises :class:`TransportUnavailable` while the bus cannot be
reached: the Kafka sink passes one built on an :mod:`eventbus` producer; nothing here imports a client.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.spool import Record, Spool, SpoolLockedError

log = logging.getLogger(__name__)


class Transport(Protocol):
    """A connected event-bus producer."""

    def deliver(self, records: Sequence[Record], timeout_s: float) -> int:
        """Send ``records`` and wait for their acknowledgement; return how many, from the start, were."""

    def close(self, timeout_s: float = 0.0) -> bool:
        """Disconnect, abandoning what is not acknowledged (the spool has it); False: try again later."""


class TransportUnavailable(Exception):
    """The bus cannot be reached right now (expected during an outage; retried with backoff)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Records just appended to the spool: their start position and each one's end position."""

    start: int
    records: list[Record]
    ends: list[int]


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """The part of :class:`gateway.kafka_config.SinkConfig` delivery uses. Times in seconds."""

    batch_max: int
    batch_interval_s: float
    flush_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    adopt_interval_s: float
    handoff_max_bytes: int


class Delivery:
    """Delivers one process's spool (and spools of processes that are gone) through a Transport."""

    def __init__(
        self, spool: Spool, spool_root: Path, connect: Callable[[], Transport], settings: DeliverySettings
    ) -> None:
        self.spool = spool
        self.spool_root = spool_root
        self.settings = settings
        self._connect = connect
        self._transport: Transport | None = None
        self._closing: list[Transport] = []  # disconnected, not closed yet (records were pending)
        self._handoff: collections.deque[Chunk] = collections.deque()
        self._stopping = threading.Event()
        self._stop_deadline = 0.0
        self._idle = False  # the last step found nothing to send
        self._orphan: Spool | None = None
        self._next_adopt = 0.0
        self._next_probe = 0.0
        self._backoff = settings.backoff_initial_s
        self.live = False
        self._refusal: str | None = None  # why the last connection attempt failed, if it did
        self.counters = dict.fromkeys(("delivered", "replayed", "adopted", "send_failures", "probes"), 0)

    @property
    def clients_closing(self) -> int:
        """Clients given up on that could not close yet (their records still pending). One
        that never closes is a thread left behind: kafka-python's idempotent producer can stay
        without a producer id after a broker hang, its batches neither sent nor expired, and
        has no public way to abandon them (librdkafka's clients close)."""
        return len(self._closing)

    # --- called from the spool writer's thread ----------------------------------------------

    def offer(self, chunk: Chunk) -> None:
        """Records just written to the spool; kept in memory only while delivery keeps up.
        Called under the spool's lock (``Spool.append``'s ``on_appended``)."""
        if self.live and chunk.start - self.spool.cursor <= self.settings.handoff_max_bytes:
            self._handoff.append(chunk)

    def stop(self, timeout_s: float) -> None:
        """Deliver what is pending for up to ``timeout_s`` if connected, then return from ``run``."""
        self._stop_deadline = time.monotonic() + timeout_s
        self._idle = False  # look once more: the writer's last records came after the last step
        self._stopping.set()

    # --- the delivery thread -----------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._finished():
                try:
                    self._step()
                except Exception:
                    log.exception("event delivery: step failed; retrying")
                    self._degrade()
        finally:
            self._disconnect()
            if self._orphan is not None:
                self._orphan.close()
                self._orphan = None

    def _finished(self) -> bool:
        if not self._stopping.is_set():
            return False
        return (
            self._transport is None
            or self.spool.empty()
            or self._idle
            or time.monotonic() > self._stop_deadline
        )

    def _step(self) -> None:
        s = self.settings
        if self._closing:
            self._close_pending()
        if self._transport is None:
            delay = self._next_probe - time.monotonic()
            if delay > 0:
                if self._stopping.is_set():
                    return
                self._stopping.wait(delay)
                return
            if not self._connect_once():
                return
        records, ends, from_memory = self._next_batch()
        self._idle = not records
        if records:
            if not self._send(records, ends, from_memory, self.spool):
                return
        elif self._adopt_orphans():
            return
        if len(records) < s.batch_max and not self._stopping.is_set():
            # Each round trip costs the client about 1 ms of CPU whatever its size, and each
            # wake-up of a thread tens of µs: look again once the writer gathered more.
            time.sleep(s.batch_interval_s)

    def _next_batch(self) -> tuple[list[Record], list[int], bool]:
        """The next records after the spool's cursor: from the writer's hand-over if it has them."""
        spool, handoff, limit = self.spool, self._handoff, self.settings.batch_max
        # Taken before looking at the hand-over: the writer offers under the lock this reads
        # under, so every record up to here that was offered is in the hand-over by now. The
        # files are read only up to here: what the writer appends meanwhile is offered too.
        appended = spool.appended()
        cursor = spool.cursor
        while handoff and handoff[0].ends[-1] <= cursor:
            handoff.popleft()  # already read from the spool's files
        if handoff and handoff[0].start <= cursor:
            records: list[Record] = []
            ends: list[int] = []
            while handoff and handoff[0].start <= cursor and len(records) < limit:
                chunk = handoff[0]
                skip = bisect.bisect_right(chunk.ends, cursor)  # records before the cursor
                take = min(len(chunk.records) - skip, limit - len(records))
                records += chunk.records[skip : skip + take]
                ends += chunk.ends[skip : skip + take]
                cursor = ends[-1]
                if skip + take == len(chunk.records):
                    handoff.popleft()
            spool.seek(cursor)
            return records, ends, True
        entries = spool.read(limit, upto=appended)
        return [r for r, _ in entries], [e for _, e in entries], False

    def _send(
        self,
        records: list[Record],
        ends: list[int],
        from_memory: bool,
        spool: Spool,
        *,
        adopted: bool = False,
    ) -> bool:
        """Deliver and commit; on a failure rewind, disconnect and back off. True if all were acked."""
        assert self._transport is not None
        acked = self._transport.deliver(records, self.settings.flush_timeout_s)
        if acked:
            spool.commit(ends[acked - 1], acked)
            self.counters["delivered"] += acked
            if adopted:
                self.counters["adopted"] += acked
            elif not from_memory:
                self.counters["replayed"] += acked
        if acked == len(records):
            self._backoff = self.settings.backoff_initial_s
            return True
        # Everything from the first failure on is sent again, so a unit's order never inverts;
        # acknowledged records after it become (deduplicated) duplicates.
        self.counters["send_failures"] += 1
        spool.rewind()
        self._degrade()
        return False

    def _connect_once(self) -> bool:
        self.counters["probes"] += 1
        try:
            self._transport = self._connect()
        except TransportUnavailable as exc:
            # A new reason is a warning (a missing topic is a configuration error, not an
            # outage); the same reason again, at every probe of an outage, only informs.
            why = str(exc)
            level = logging.INFO if why == self._refusal else logging.WARNING
            log.log(level, "event delivery: bus not reachable (%s); events wait in the spool", why)
            self._refusal = why
            self._degrade()
            return False
        except Exception:
            log.exception("event delivery: cannot connect (configuration?); events wait in the spool")
            self._degrade()
            return False
        if not self.live:
            log.info("event delivery: connected; %s events pending in the spool", self.spool.pending_records)
        self.live = True
        self._refusal = None
        return True

    def _degrade(self) -> None:
        if self.live:
            log.warning("event delivery: bus unreachable or slow; events wait in %s", self.spool.directory)
        self.live = False
        self._handoff.clear()
        self.spool.rewind()
        self._disconnect()
        self._next_probe = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.settings.backoff_max_s)

    def _disconnect(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            self._closing.append(transport)
        self._close_pending()

    def _close_pending(self) -> None:
        """Close disconnected transports; one that cannot close yet is tried again next time."""
        still = []
        for transport in self._closing:
            try:
                closed = transport.close(0)
            except Exception:
                log.exception("event delivery: closing a connection failed; dropping it")
                closed = True
            if not closed:
                still.append(transport)
        self._closing = still

    # --- spools of processes that are gone ---------------------------------------------------

    def _claim_orphan(self) -> Spool | None:
        own = self.spool.directory
        for directory in sorted(self.spool_root.iterdir()):
            if directory == own or not directory.name.isdigit() or not directory.is_dir():
                continue
            try:
                orphan = Spool(directory)
            except SpoolLockedError:
                continue  # a live process owns it
            if not orphan.empty():
                log.info("event delivery: delivering %s events left in %s", orphan.pending_records, directory)
                return orphan
            orphan.close()
        return None

    def _adopt_orphans(self) -> bool:
        """Deliver a batch of a dead process's spool; True if there was work."""
        if self._stopping.is_set():
            return False
        if self._orphan is None:
            now = time.monotonic()
            if now < self._next_adopt:
                return False
            self._next_adopt = now + self.settings.adopt_interval_s
            self._orphan = self._claim_orphan()
            if self._orphan is None:
                return False
        orphan = self._orphan
        entries = orphan.read(self.settings.batch_max)
        done = bool(entries) and self._send(
            [r for r, _ in entries], [e for _, e in entries], False, orphan, adopted=True
        )
        if not done or orphan.empty():
            orphan.close()
            self._orphan = None
        return bool(entries)
