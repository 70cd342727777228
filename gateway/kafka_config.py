"""Configuration of the Kafka sink: topic names, tuning, and topic creation."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.events import (
    FEEDBACK_TOPIC,
    INTERACTIONS_TOPIC,
    JUDGEMENTS_TOPIC,
    Event,
    InteractionEvent,
    JudgeEvent,
    NgramsEvent,
)
from eventbus import Bus, open_bus
from gateway.delivery import DeliverySettings


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names; tests use unique ones."""

    interactions: str = INTERACTIONS_TOPIC
    feedback: str = FEEDBACK_TOPIC
    judgements: str = JUDGEMENTS_TOPIC

    @property
    def all(self) -> tuple[str, str, str]:
        """Every topic the gateway writes: each must exist before delivery starts (a record
        for a missing one times out in the client and holds back every event after it)."""
        return (self.interactions, self.feedback, self.judgements)

    def of(self, event: Event) -> str:
        if isinstance(event, InteractionEvent):
            return self.interactions
        return self.judgements if isinstance(event, (JudgeEvent, NgramsEvent)) else self.feedback


@dataclass(frozen=True, slots=True)
class SinkConfig:
    """Tuning of the sink. Times in seconds."""

    hard_max_queue: int = 1_000_000  # events waiting for the spool writer; beyond this emit drops (counted)
    client_id: str = "liftgate-gateway"  # how the broker (quotas, request logs) names this producer
    batch_max: int = 5_000
    # How often the spool writer moves what emit queued to the spool (one write, no fsync): a
    # SIGKILL of the gateway loses about this much of the latest events, never more than what
    # is still queued in memory.
    spool_interval_s: float = 0.02
    # How often records in the spool that Kafka has not acknowledged yet are fsynced, by a
    # thread of their own: the bound on what a power loss or kernel crash may lose (a killed
    # process loses nothing written: the page cache keeps it). 0: after every spool write.
    fsync_interval_s: float = 1.0
    # Pause of the delivery thread between batches unless a full one is waiting. Each produce
    # round trip has a fixed CPU cost in the client (delivery and network threads) whatever its
    # size, so fewer, bigger batches are much cheaper. Events are durable in the spool long
    # before, so this only delays their arrival in Kafka (bench/gateway/README.md: sink CPU at
    # paced rates).
    batch_interval_s: float = 0.1
    flush_timeout_s: float = 5.0
    probe_timeout_s: float = 2.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 1.0  # between probes while Kafka is down: a probe is a refused connect
    close_timeout_s: float = 5.0
    linger_ms: int = 2
    # Below the broker's default message.max.bytes (~1 MiB), which bounds a whole batch.
    batch_bytes: int = 512 << 10
    max_event_bytes: int = 500_000
    # Reconnect attempts of the producer's client to a lost broker back off up to this (the
    # client's default is 30 s).
    reconnect_backoff_max_ms: int = 1000
    # How often a live sink looks for spools of processes that are gone (e.g. after the
    # gateway was scaled down to fewer workers) and delivers them.
    adopt_interval_s: float = 30.0
    # Create missing topics on connect (brokers here disable auto-creation); None: never.
    create_topics_partitions: int | None = 6
    segment_bytes: int = 64 << 20
    max_spool_bytes: int = 8 << 30  # beyond this (a very long outage) events are dropped, counted
    # Records just written are handed to the delivery thread in memory too, unless it is this
    # far behind the writer (then it reads them back from the spool).
    handoff_max_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        positive = ("spool_interval_s", "batch_interval_s", "flush_timeout_s", "probe_timeout_s")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"SinkConfig.{name} must be > 0")
        if not self.fsync_interval_s >= 0:
            raise ValueError("SinkConfig.fsync_interval_s must be >= 0 (0: after every spool write)")
        if min(self.batch_max, self.hard_max_queue, self.max_event_bytes, self.segment_bytes) < 1:
            raise ValueError("SinkConfig sizes must be >= 1")

    def delivery(self) -> DeliverySettings:
        return DeliverySettings(
            batch_max=self.batch_max,
            batch_interval_s=self.batch_interval_s,
            flush_timeout_s=self.flush_timeout_s,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            adopt_interval_s=self.adopt_interval_s,
            handoff_max_bytes=self.handoff_max_bytes,
        )


def ensure_topics(
    bootstrap: str,
    partitions: int = 6,
    topics: Topics = Topics(),
    timeout_s: float = 30.0,
    bus: Bus | None = None,
) -> None:
    """Create the interaction, feedback and judgement topics if they do not exist (idempotent)."""
    bus = bus if bus is not None else open_bus("auto")
    bus.ensure_topics(bootstrap, topics.all, partitions, timeout_s)
