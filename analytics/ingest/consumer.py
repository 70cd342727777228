"""Kafka → Postgres: the analytics consumer group (exactly-once effect).

Each poll (up to ``consumer_max_records`` records or ``consumer_poll_ms``) becomes one
Postgres transaction through ``analytics.ingest.write.ingest_raw``, written by a writer thread
while the main thread polls and decodes the next batch: decodable events are
ingested idempotently, undecodable ones are written to ``dead_letters`` (raw bytes, key,
topic/partition/offset, reason) in the same transaction. Offsets are committed only
after that transaction committed, so a crash anywhere redelivers the batch and the
``event_id`` keys make the replay a no-op.

Kafka client dead for good (a fatal error, e.g. this static member fenced by another with its
``group.instance.id``): the batch in flight is written but not committed, the client is
closed and a new one joins after a backoff, resuming from the committed offsets (the replay
is a no-op, as after a crash). More than ``consumer_max_client_restarts`` new clients within
``consumer_client_restart_window_s`` raise ``ConsumerGaveUp``: the thread ends with the reason
(the service's ``/healthz`` turns 503, a standalone process exits non-zero).

Postgres unavailable: the batch is held, partitions are paused (the main thread keeps
polling so the group membership stays alive), the write is retried with exponential backoff up to
``consumer_max_backoff_s``; nothing is committed meanwhile. Several processes share the
partitions through the consumer group; on a rebalance uncommitted work is simply
redelivered to the new owner (a failed commit is logged and harmless).

Run ``python -m analytics.ingest.consumer`` (settings from ``LIFTGATE_*``), or call
``run_consumer(settings, stop_event)`` from a thread of the analytics service.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from analytics.ingest.copy_text import CountedConversations
from analytics.ingest.dead_letters import DeadLetterRow
from analytics.ingest.samples import SampleCuts
from analytics.ingest.write import IngestResult, Raw, attribute_pending, ingest_raw
from contracts import redaction
from contracts.events import (
    FEEDBACK_TOPIC,
    INTERACTIONS_TOPIC,
    JUDGEMENTS_TOPIC,
    DecodeError,
    InteractionEvent,
    JudgeEvent,
    NgramsEvent,
    decode,
)
from eventbus import (
    Bus,
    BusError,
    BusFatal,
    ClientChoice,
    ConsumerOptions,
    Message,
    TopicPartition,
    open_bus,
)
from eventbus import Consumer as BusConsumer

log = logging.getLogger(__name__)


class ConsumerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIFTGATE_", extra="ignore")

    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:15432/liftgate"
    kafka_bootstrap: str = "127.0.0.1:19092"
    # Kafka client library: confluent (librdkafka), python (kafka-python), auto (confluent when
    # it can be imported). See docs/operations.md ("Kafka client").
    kafka_client: ClientChoice = "auto"
    consumer_group: str = "liftgate-analytics"
    interactions_topic: str = INTERACTIONS_TOPIC
    feedback_topic: str = FEEDBACK_TOPIC
    judgements_topic: str = JUDGEMENTS_TOPIC
    # Records per poll = per transaction when lagging (a quiet stream gives small batches
    # every poll). The rollup upserts of a batch collapse a unit's repeated events and the
    # fixed cost per transaction is spread: 50,000 ingests faster than 20,000 at about 2.5x
    # the peak memory per process (bench/ingest/README.md). A poll returns at most what the
    # fetches hold: see consumer_max_partition_fetch_bytes.
    consumer_max_records: int = Field(default=50_000, ge=1, le=200_000)
    # After the start and after each rebalance, polls take at most this many records,
    # doubling per poll up to consumer_max_records (see PollRamp).
    consumer_ramp_records: int = Field(default=5_000, ge=1, le=200_000)
    consumer_poll_ms: int = Field(default=200, ge=1, le=60_000)
    consumer_max_backoff_s: float = Field(default=10.0, gt=0, le=300)
    # How often feedback left unattributed by a cross-transaction race is re-joined. A
    # process's first sweep reads all unattributed feedback; later ones only what was stored
    # since the previous sweep began, minus this overlap (the race needs two overlapping
    # batch transactions: the overlap must exceed twice the longest one).
    consumer_sweep_interval_s: float = Field(default=30.0, gt=0)
    consumer_sweep_overlap_s: float = Field(default=3600.0, gt=0)
    # Static membership (Kafka's group.instance.id): a restarted process with the same id
    # takes its partitions back at once instead of waiting out the session timeout.
    consumer_instance_id: str | None = None
    # Group members run by this process, one thread each (own Kafka client and database
    # connection): their database work overlaps while the interpreter is shared. Separate
    # processes scale further (one interpreter each); see docs/operations.md.
    consumer_threads: int = Field(default=1, ge=1, le=16)
    consumer_session_timeout_ms: int = Field(default=10_000, ge=6_000, le=300_000)
    consumer_metrics_port: int = Field(default=0, ge=0, le=65535)  # 0: no own /metrics server
    # Fetch tuning: fewer, larger fetches cost less CPU per record (kafka-python parses records
    # in the interpreter); fetch_max_wait_ms bounds the latency a small fetch adds.
    consumer_fetch_min_bytes: int = Field(default=256 * 1024, ge=1)
    consumer_fetch_max_wait_ms: int = Field(default=100, ge=0, le=10_000)
    # At most this much per partition per fetch: with 4 MiB (~5,700 events of ~700 bytes) a
    # member of 3 partitions never polled more than ~17,000 records, whatever max_records.
    consumer_max_partition_fetch_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # How often the client refreshes topic metadata (kafka-python's default is 5 min): a
    # group that formed before its topics were visible, or topics that gained partitions,
    # are picked up within this time.
    consumer_metadata_max_age_ms: int = Field(default=30_000, ge=1000)
    # Reconnect attempts to a lost broker back off exponentially up to this (kafka-python's
    # default is 30 s, librdkafka's 10 s): after a broker crash the consumer was idle up to ~30 s after the broker
    # was back. With 1 s it resumed within ~1 s of the broker answering again (test_consumer_resume);
    # an attempt while the broker is down is one refused TCP connect.
    consumer_reconnect_backoff_max_ms: int = Field(default=1000, ge=50, le=60_000)
    # Upper bound for any blocking Kafka call of the loop (offset commit, lag lookup): a
    # client may wait forever without one, e.g. for a coordinator lost mid-rebalance.
    consumer_kafka_timeout_ms: int = Field(default=10_000, ge=100)
    # After a stop request, a write still running this long is cancelled (its batch stays
    # uncommitted and is redelivered): the process exits even if Postgres hangs.
    consumer_stop_grace_s: float = Field(default=15.0, gt=0)
    # The cyclic GC's first-generation threshold while consuming (CPython's default: 700
    # allocations). A batch allocates ~10 container objects per event, hardly any in cycles,
    # so the default runs hundreds of young collections per batch that free ~nothing, and
    # batches of 50,000 keep enough alive that promotions trigger full collections; a high
    # threshold cuts the consumer's CPU per event (bench/ingest/README.md). 0 keeps the
    # interpreter's setting.
    # Process-wide; a lower threshold set elsewhere is raised.
    consumer_gc_gen0: int = Field(default=1_000_000, ge=0)
    # A client that failed for good (fatal error: e.g. fenced by another member with this
    # process's consumer_instance_id) is replaced, at most this many times within the window;
    # one more failure raises (a duplicate instance id fences both processes without end).
    consumer_max_client_restarts: int = Field(default=5, ge=0, le=1000)
    consumer_client_restart_window_s: float = Field(default=600.0, gt=0)


class ConsumerGaveUp(RuntimeError):
    """The Kafka client kept failing for good although replaced: ingest cannot go on here."""


class _HasConnection(Protocol):
    database_url: str
    kafka_bootstrap: str | None
    kafka_client: ClientChoice


@dataclass
class ConsumerMetrics:
    registry: CollectorRegistry = field(default_factory=lambda: REGISTRY)

    def __post_init__(self) -> None:
        r = self.registry
        self.consumed = Counter(
            "liftgate_analytics_events_consumed", "Kafka records consumed and written", ["topic"], registry=r
        )
        self.dead_lettered = Counter(
            "liftgate_analytics_events_dead_lettered",
            "Records written to dead_letters",
            ["topic"],
            registry=r,
        )
        self.duplicates = Counter(
            "liftgate_analytics_events_duplicate", "Redelivered events ignored by ingest", registry=r
        )
        self.lag = Gauge(
            "liftgate_analytics_consumer_lag",
            "Records not yet consumed, summed over this process's partitions",
            ["topic"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "liftgate_analytics_batch_write_seconds",
            "Time to write one batch to Postgres (one transaction)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self._lag_lock = threading.Lock()
        self._lag_by_member: dict[tuple[int, str], int] = {}
        self.db_retries = Counter(
            "liftgate_analytics_db_retries", "Batch writes retried after a database error", registry=r
        )
        self.client_restarts = Counter(
            "liftgate_analytics_consumer_client_restarts",
            "Kafka clients replaced after a fatal error (e.g. this static member fenced)",
            registry=r,
        )

    def set_lag(self, member: int, topic: str, value: int) -> None:
        """One member's lag on a topic; the gauge shows the sum over this process's members."""
        with self._lag_lock:
            self._lag_by_member[(member, topic)] = value
            total = sum(v for (_, t), v in self._lag_by_member.items() if t == topic)
        self.lag.labels(topic).set(total)


_default_metrics: ConsumerMetrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> ConsumerMetrics:
    """Metrics on the process-default registry, declared once per process."""
    global _default_metrics
    with _default_lock:
        if _default_metrics is None:
            _default_metrics = ConsumerMetrics()
        return _default_metrics


def consumer_options(s: ConsumerSettings, member: int = 0) -> ConsumerOptions:
    """How a group member reads Kafka: manual commits from the earliest offset, fetch sizes, timeouts."""
    instance = s.consumer_instance_id
    return ConsumerOptions(
        bootstrap=s.kafka_bootstrap,
        group_id=s.consumer_group,
        client_id="liftgate-analytics",
        group_instance_id=instance if instance is None or member == 0 else f"{instance}-{member}",
        session_timeout_ms=s.consumer_session_timeout_ms,
        # A member learns of a rebalance from a heartbeat, and a member joining waits for it:
        # every second rather than Kafka's 3 s (the group's formation with both:
        # bench/ingest/README.md). One request a second per member is nothing to the broker.
        heartbeat_interval_ms=min(1000, s.consumer_session_timeout_ms // 4),
        fetch_min_bytes=s.consumer_fetch_min_bytes,
        fetch_max_wait_ms=s.consumer_fetch_max_wait_ms,
        max_partition_fetch_bytes=s.consumer_max_partition_fetch_bytes,
        metadata_max_age_ms=s.consumer_metadata_max_age_ms,
        reconnect_backoff_max_ms=s.consumer_reconnect_backoff_max_ms,
        request_timeout_ms=s.consumer_kafka_timeout_ms,
    )


def _pg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@dataclass
class Batch:
    interactions: list[Raw] = field(default_factory=list)
    feedback: list[Raw] = field(default_factory=list)
    dead: list[DeadLetterRow] = field(default_factory=list)
    judgements: list[Raw] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)  # next offset to commit
    per_topic: dict[str, int] = field(default_factory=dict)


def decode_batch(records: list[Message]) -> Batch:
    """Sort records into interactions, feedback and dead letters (with the reason)."""
    b = Batch()
    offsets: dict[tuple[str, int], int] = {}
    per_topic = b.per_topic
    for rec in records:
        topic, partition, offset, key, payload = rec
        payload = payload or b""
        try:
            ev = decode(payload)
        except DecodeError as exc:
            b.dead.append(DeadLetterRow(topic, partition, offset, key, payload, exc.reason))
        else:
            if isinstance(ev, InteractionEvent):
                b.interactions.append(Raw(payload, topic, partition, offset, key, ev))
            elif isinstance(ev, (JudgeEvent, NgramsEvent)):
                b.judgements.append(Raw(payload, topic, partition, offset, key, ev))
            else:
                b.feedback.append(Raw(payload, topic, partition, offset, key))
        # A partition's records arrive in offset order: the last one seen is the highest.
        offsets[topic, partition] = offset + 1
        per_topic[topic] = per_topic.get(topic, 0) + 1
    b.offsets = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
    return b


def since_rebalance(records: list[Message], owned: set[TopicPartition]) -> list[Message]:
    """Of a poll during which partitions were revoked, the records to write: per partition
    still owned, those from its last restart on.

    A poll can return records read before the rebalance and, after it, the same partition
    read again from its committed offset (the offsets go back): the earlier run is dropped
    (its records are in the later one or will be read again). Partitions no longer owned
    are dropped too: their new owner reads them from the committed offsets.
    """
    runs: dict[tuple[str, int], list[Message]] = {}
    last: dict[tuple[str, int], int] = {}
    for r in records:
        k = (r.topic, r.partition)
        if k in last and r.offset <= last[k]:
            runs[k] = []
        runs.setdefault(k, []).append(r)
        last[k] = r.offset
    return [r for (t, p), rs in runs.items() if TopicPartition(t, p) in owned for r in rs]


class PollRamp:
    """How many records the next poll takes: ``start`` after the start and after each
    rebalance (``reset``, from ``_on_revoke``: the confluent client's; kafka-python's
    listeners run on its IO thread and the ramp starts only once), doubling per poll that
    returned records (``polled``) up to ``top``.

    A rebalance waits for every member's batch in flight (``Consumer._on_revoke``): a member
    joining a group whose members have just started waits, with nothing to do, until they
    learn of the rebalance (their next heartbeat) and finish that batch. Small first batches
    bound the second part; a member that stays assigned reaches full batches within a few
    polls (the benchmark's figures with and without: bench/ingest/README.md).
    """

    def __init__(self, start: int, top: int) -> None:
        self.top = max(1, top)
        self.start = max(1, min(start, self.top))
        self.limit = self.start

    def polled(self) -> None:
        self.limit = min(self.limit * 2, self.top)

    def reset(self) -> None:
        self.limit = self.start


class Consumer:
    """One consumer-group member; ``run`` loops until ``stop`` is set."""

    def __init__(
        self,
        settings: ConsumerSettings,
        stop: threading.Event,
        metrics: ConsumerMetrics | None = None,
        member: int = 0,
        bus: Bus | None = None,
    ) -> None:
        """``bus``: the Kafka client backend (None: the one ``settings.kafka_client`` names)."""
        self.s = settings
        self.member = member
        self.stop = stop
        self.metrics = metrics or default_metrics()
        self.pg: psycopg.Connection[Any] | None = None
        # The latency samples' cuts this writer has read (valid across reconnects: they only fall).
        self._cuts = SampleCuts()
        # The conversations this writer saw counted (rows of conversations_counted are never deleted).
        self._conversations = CountedConversations()
        # Counters exist from the start (at 0), so rate() and alerts see both topics at once;
        # the lag gauge appears only once partitions are assigned (an unknown lag is not 0).
        for topic in (settings.interactions_topic, settings.feedback_topic, settings.judgements_topic):
            self.metrics.consumed.labels(topic)
            self.metrics.dead_lettered.labels(topic)
        self._bus = bus if bus is not None else open_bus(settings.kafka_client)
        self._topics = [settings.interactions_topic, settings.feedback_topic, settings.judgements_topic]
        # Rebalances seen (``_on_revoke``): records a poll returned across one are dropped.
        self._revocations = 0
        self._ramp = PollRamp(settings.consumer_ramp_records, settings.consumer_max_records)
        self.kafka = self._open_client()
        self._kafka_open = True
        self._restarts: deque[float] = deque()  # when clients were replaced, within the window
        # The batch the writer thread is writing (its offsets committed once it is written).
        self._inflight: tuple[Batch, Future[IngestResult | None]] | None = None
        # Records a keep-alive poll returned while partitions were paused (none expected):
        # kept, in order, for the next batch rather than skipped.
        self._held: list[Message] = []
        self._next_lag = 0.0
        self._unassigned_since: float | None = None
        self._rejoin_after = 20.0
        self._failing = threading.Event()
        self._closing = threading.Event()
        self._next_sweep = time.monotonic() + settings.consumer_sweep_interval_s
        self._swept_at: datetime | None = None  # database time the last sweep began
        self._sweep_overlap = timedelta(seconds=settings.consumer_sweep_overlap_s)

    # -- database ---------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self.pg is None or self.pg.closed or self.pg.broken:
            if self.pg is not None:
                self.pg.close()
            # Offsets are committed to Kafka once the batch's commit returned, so that commit
            # must be durable: the embedded server runs with synchronous_commit=off.
            self.pg = psycopg.connect(
                _pg_url(self.s.database_url), connect_timeout=5, options="-c synchronous_commit=on"
            )
        return self.pg

    def _reset_connection(self) -> None:
        if self.pg is not None:
            try:
                if not self.pg.broken and not self.pg.closed:
                    self.pg.rollback()
                    return
            except psycopg.Error:
                pass
            self.pg.close()
            self.pg = None

    def _write(self, batch: Batch) -> IngestResult | None:
        """Writer thread: write until it succeeds (None if stopped first), backing off."""
        backoff = 0.1
        while True:
            try:
                with self.metrics.batch_seconds.time():
                    res = ingest_raw(
                        self._connection(),
                        batch.interactions,
                        batch.feedback,
                        batch.dead,
                        batch.judgements,
                        cuts=self._cuts,
                        conversations=self._conversations,
                    )
                self._failing.clear()
                self._maybe_sweep()
                return res
            except psycopg.Error as exc:
                self._failing.set()
                self.metrics.db_retries.inc()
                log.warning(
                    "batch write failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, backoff
                )
                self._reset_connection()
            if self._closing.wait(backoff):
                return None
            backoff = min(backoff * 2, self.s.consumer_max_backoff_s)

    def _await(self, fut: Future[IngestResult | None], keepalive: bool = True) -> IngestResult | None:
        """Main thread: wait for the writer; while it fails, pause and keep the membership alive
        (``keepalive`` False: the client is dead, just wait)."""
        paused: list[TopicPartition] = []
        stop_deadline: float | None = None
        try:
            while True:
                try:
                    return fut.result(timeout=0.5)
                except FutureTimeout:
                    if self.stop.is_set():
                        self._closing.set()  # a writer still retrying gives up
                        now = time.monotonic()
                        if stop_deadline is None:
                            stop_deadline = now + self.s.consumer_stop_grace_s
                        elif now > stop_deadline:
                            self._cancel_write()
                            stop_deadline = now + self.s.consumer_stop_grace_s
                    if keepalive and self._failing.is_set():
                        if not paused:
                            paused = self.kafka.assignment()
                            self.kafka.pause(paused)
                        # Paused partitions return no records; polling keeps this member in the
                        # group (a member that stops polling is evicted after max.poll.interval).
                        self._held += self._poll(0.0)
        finally:
            if paused:
                # A rebalance while paused may have moved some of them away.
                owned = set(self.kafka.assignment())
                self.kafka.resume([tp for tp in paused if tp in owned])

    def _cancel_write(self) -> None:
        """Cancel the writer's statement in flight (from the main thread; psycopg allows it)."""
        pg = self.pg
        if pg is not None and not pg.closed:
            log.warning(
                "stopping: cancelling a batch write still running after %.0fs", self.s.consumer_stop_grace_s
            )
            try:
                pg.cancel_safe(timeout=5.0)
            except psycopg.Error as exc:
                log.warning("cancel failed: %s", exc)

    # -- kafka ------------------------------------------------------------------------------

    def _open_client(self) -> BusConsumer:
        client = self._bus.consumer(consumer_options(self.s, self.member))
        try:
            client.subscribe(self._topics, on_revoke=self._on_revoke)
        except BaseException:
            client.close()
            raise
        return client

    def _poll(self, timeout_s: float) -> list[Message]:
        """One poll's records; of a poll a rebalance interrupted, only those to write
        (``since_rebalance``)."""
        seen = self._revocations
        records = self.kafka.poll_batch(self._ramp.limit, timeout_s)
        if self._revocations != seen:
            records = since_rebalance(records, set(self.kafka.assignment()))
        elif records:
            self._ramp.polled()
        return records

    def _on_revoke(self, revoked: list[TopicPartition]) -> None:
        """Inside a poll, before a rebalance takes the partitions: the batch being written is
        awaited and its offsets committed while this member still owns them.

        Their next owner (this member too: every partition is revoked, and whatever comes back
        is read again from its committed offset) then starts after the written batch instead
        of reading it again: a group whose members start one after the other redelivered the
        first member's batch (tens of thousands of events, stored twice over and waiting on
        each other's row locks) to the second. Records polled but not yet handed to the
        writer, or held, are read again from the committed offsets (``since_rebalance``). A write
        still failing after ``consumer_stop_grace_s`` is left to finish later; its events are
        then redelivered (ingest ignores those it stored).
        """
        self._revocations += 1
        self._ramp.reset()
        self._held = []  # read again from the committed offsets
        if self._inflight is None:
            return
        batch, fut = self._inflight
        try:
            res = fut.result(timeout=self.s.consumer_stop_grace_s)
        except FutureTimeout:
            log.warning("partitions revoked while a batch write is still running: it will be redelivered")
            return
        except Exception:  # the writer's own error: the main thread reports it on its next wait
            return
        if res is None:  # not written (stopping): redelivered
            return
        self._inflight = None
        self._finish(batch, res)

    def _close_client(self) -> None:
        if self._kafka_open:
            self._kafka_open = False
            try:
                self.kafka.close()
            except BusError as exc:
                log.warning("closing the Kafka client: %s", exc)

    def _replace_client(self, cause: BusError) -> bool:
        """Close the dead client and join with a new one, after a backoff that grows with the
        replacements within the window; False if stopped meanwhile. Raises ConsumerGaveUp once
        ``consumer_max_client_restarts`` replacements within the window were not enough.

        The new client starts from the committed offsets: what the dead one read but did not
        commit is redelivered, and ingest ignores events it already stored."""
        self._close_client()
        self._held = []  # read by the dead client, redelivered to the new one
        self._unassigned_since = None
        window = self.s.consumer_client_restart_window_s
        while True:
            now = time.monotonic()
            while self._restarts and self._restarts[0] < now - window:
                self._restarts.popleft()
            if len(self._restarts) >= self.s.consumer_max_client_restarts:
                raise ConsumerGaveUp(
                    f"Kafka client failed for good although replaced {len(self._restarts)} times"
                    f" within {window:.0f}s (a consumer_instance_id shared by two live processes?): {cause}"
                ) from cause
            delay = min(0.5 * 2 ** len(self._restarts), self.s.consumer_max_backoff_s)
            self._restarts.append(now)
            self.metrics.client_restarts.inc()
            log.error(
                "Kafka client failed for good (%s): replacing it in %.1fs; it resumes from the committed offsets",
                cause,
                delay,
            )
            if self.stop.wait(delay):
                return False
            try:
                self.kafka = self._open_client()
            except BusError as exc:
                cause = exc
                continue
            self._kafka_open = True
            return True

    def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        # Only partitions this member still owns: one a rebalance moved away while the batch
        # was written may already be read further (and committed) by its new owner, and this
        # older offset would move the group back over what that owner stored (the broker takes
        # a commit from any member of the current generation).
        owned = set(self.kafka.assignment())
        offsets = {tp: o for tp, o in offsets.items() if tp in owned}
        if not offsets:
            return
        try:
            self.kafka.commit(offsets)
        except BusFatal:
            raise  # the client is dead: the batch is redelivered to its successor
        except BusError as exc:
            # The partitions moved to another member: it re-reads from the last committed
            # offset and ingest ignores what this batch already stored.
            log.warning(
                "offset commit failed after a successful write (%s); records will be redelivered", exc
            )

    def _update_lag(self) -> None:
        now = time.monotonic()
        if now < self._next_lag:
            return
        parts = list(self.kafka.assignment())
        if not parts:
            return
        self._next_lag = now + 5.0
        lag: dict[str, int] = {}
        try:
            by_partition = self.kafka.lag(parts, self.s.consumer_kafka_timeout_ms / 1000)
        except BusFatal:
            raise
        except BusError as exc:
            log.debug("lag unavailable: %s", exc)
            return
        for tp, value in by_partition.items():
            lag[tp.topic] = lag.get(tp.topic, 0) + value
        for topic, value in lag.items():
            self.metrics.set_lag(self.member, topic, value)

    def _check_assignment(self) -> None:
        """Rejoin the group when this member has owned nothing for a while.

        A client can complete a rebalance with nothing assigned to anyone when the leader
        assigned from metadata that did not list the (just created) topics yet (kafka-python's
        log says "No partition metadata for topic") and then not rejoin by itself. If this
        member owns no partition for ``_rejoin_after`` seconds while the topics have
        partitions, it resubscribes (a rebalance). The wait doubles each time, up to 10 min,
        so a member that is legitimately idle (more members than partitions) costs the
        group a few early rebalances, then nearly none.
        """
        now = time.monotonic()
        if self.kafka.assignment():
            self._unassigned_since = None
            return
        if self._unassigned_since is None:
            self._unassigned_since = now
            return
        if now - self._unassigned_since < self._rejoin_after:
            return
        timeout_s = self.s.consumer_kafka_timeout_ms / 1000
        try:
            if not any(self.kafka.partition_count(t, timeout_s) for t in self._topics):
                return  # the topics do not exist (yet): nothing to rejoin for
        except BusFatal:
            raise
        except BusError as exc:
            log.debug("metadata unavailable: %s", exc)
            return
        log.warning(
            "no partition assigned for %.0fs although the topics have partitions: rejoining the group",
            now - self._unassigned_since,
        )
        self.kafka.subscribe(self._topics, on_revoke=self._on_revoke)
        self._unassigned_since = now
        self._rejoin_after = min(self._rejoin_after * 2, 600.0)

    def _maybe_sweep(self) -> None:
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + self.s.consumer_sweep_interval_s
        since = None if self._swept_at is None else self._swept_at - self._sweep_overlap
        try:
            sweep = attribute_pending(self._connection(), since)
            self._swept_at = sweep.started
            if sweep.attributed:
                log.info("attributed %s feedback events left over by concurrent batches", sweep.attributed)
        except psycopg.Error as exc:
            log.warning("feedback sweep failed: %s", exc)
            self._reset_connection()

    def _finish(self, batch: Batch, res: IngestResult, commit: bool = True) -> None:
        """Count a written batch and commit its offsets (``commit`` False: the client is dead)."""
        for topic, n in batch.per_topic.items():
            self.metrics.consumed.labels(topic).inc(n)
        for topic in [*(d.topic for d in batch.dead), *res.refused]:
            self.metrics.dead_lettered.labels(topic).inc()
        self.metrics.duplicates.inc(res.duplicates)
        if commit:
            self._commit(batch.offsets)

    def _step(self, writer: ThreadPoolExecutor) -> bool:
        """One poll: the batch before it committed, this one handed to the writer. False when
        stopped while the database was down (the batch in flight stays uncommitted)."""
        records = self._poll(self.s.consumer_poll_ms / 1000)
        if self._held:
            records, self._held = self._held + records, []
        batch = decode_batch(records) if records else None
        if self._inflight is not None:
            done, fut = self._inflight
            res = self._await(fut)
            if res is None:
                return False
            if self._inflight is not None:  # else finished by _on_revoke meanwhile
                self._inflight = None
                self._finish(done, res)
        if batch is not None:
            self._inflight = (batch, writer.submit(self._write, batch))
        self._update_lag()
        self._check_assignment()
        return True

    def _settle(self) -> None:
        """Wait for the batch in flight without the (dead) client: written, counted, not
        committed; the next client reads it again from the committed offsets."""
        if self._inflight is not None:
            batch, fut = self._inflight
            self._inflight = None
            res = self._await(fut, keepalive=False)
            if res is not None:
                self._finish(batch, res, commit=False)

    def run(self) -> None:
        """Poll and decode batch k+1 while the writer thread writes batch k (two cores busy).

        Offsets are committed in batch order, each only after its transaction committed.
        """
        log.info(
            "consumer %s reading %s, %s, %s",
            self.s.consumer_group,
            self.s.interactions_topic,
            self.s.feedback_topic,
            self.s.judgements_topic,
        )
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-writer")
        try:
            while not self.stop.is_set():
                try:
                    going = self._step(writer)
                except BusFatal as exc:
                    self._settle()
                    going = not self.stop.is_set() and self._replace_client(exc)
                if not going:
                    break
            if self._inflight is not None:
                batch, fut = self._inflight
                self._inflight = None
                try:
                    res = self._await(fut, keepalive=self._kafka_open)
                    if res is not None:
                        self._finish(batch, res, commit=self._kafka_open)
                except BusFatal as exc:
                    log.warning("offsets not committed at stop (%s); redelivered on restart", exc)
        finally:
            self._closing.set()  # a writer still retrying gives up; its batch stays uncommitted
            writer.shutdown(wait=True)
            self._close_client()
            if self.pg is not None:
                self.pg.close()


def run_consumer(
    settings: ConsumerSettings | _HasConnection,
    stop_event: threading.Event,
    metrics: ConsumerMetrics | None = None,
) -> None:
    """Consume until ``stop_event`` is set (for a thread of the analytics service).

    Accepts the service's settings too: database URL and bootstrap are taken from them,
    the consumer's own options from ``LIFTGATE_*`` environment variables.
    """
    if not isinstance(settings, ConsumerSettings):
        settings = ConsumerSettings(
            database_url=settings.database_url,
            kafka_bootstrap=settings.kafka_bootstrap or "127.0.0.1:19092",
            kafka_client=settings.kafka_client,
        )
    tune_gc(settings.consumer_gc_gen0)
    bus = open_bus(settings.kafka_client)
    if settings.consumer_threads == 1:
        Consumer(settings, stop_event, metrics, bus=bus).run()
        return
    _run_members(settings, stop_event, metrics or default_metrics(), bus)


def tune_gc(gen0: int) -> None:
    """Raise the GC's young-generation threshold to ``gen0`` (never lower it; 0: no change).

    What was allocated so far (modules, settings, clients) is frozen out of the collector's
    reach, so the rare full collections do not walk it again and again.
    """
    if gen0 <= 0:
        return
    t0, t1, t2 = gc.get_threshold()
    if gen0 > t0:
        gc.freeze()
        gc.set_threshold(gen0, max(t1, 20), max(t2, 20))


def _run_members(
    settings: ConsumerSettings, stop_event: threading.Event, metrics: ConsumerMetrics, bus: Bus
) -> None:
    """``consumer_threads`` group members in threads; one failing stops them all (and re-raises)."""
    stop_all = threading.Event()
    errors: list[BaseException] = []

    def member(i: int) -> None:
        try:
            Consumer(settings, stop_all, metrics, member=i, bus=bus).run()
        except BaseException as exc:
            errors.append(exc)
            log.exception("consumer member %s failed", i)
        finally:
            stop_all.set()  # a member that ends ends the others (they are restarted together)

    threads = [
        threading.Thread(target=member, args=(i,), name=f"consumer-{i}", daemon=True)
        for i in range(settings.consumer_threads)
    ]
    for t in threads:
        t.start()
    while not stop_event.wait(0.5) and not stop_all.is_set():
        pass
    stop_all.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main() -> None:
    settings = ConsumerSettings()
    redaction.install(database_url=settings.database_url)  # before anything logs
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if settings.consumer_metrics_port:
        start_http_server(settings.consumer_metrics_port, addr="127.0.0.1")
    run_consumer(settings, stop)


if __name__ == "__main__":
    main()
