"""Configuration of the Kafka sink: topic names, tuning, and topic creation."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from contracts.events import FEEDBACK_TOPIC, INTERACTIONS_TOPIC, Event, InteractionEvent


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names; tests use unique ones."""

    interactions: str = INTERACTIONS_TOPIC
    feedback: str = FEEDBACK_TOPIC

    def of(self, event: Event) -> str:
        return self.interactions if isinstance(event, InteractionEvent) else self.feedback


@dataclass(frozen=True, slots=True)
class SinkConfig:
    """Tuning of the sink. Times in seconds."""

    max_queue: int = 50_000  # above this, the background thread spills to the spool
    hard_max_queue: int = 1_000_000  # above this, emit drops (and counts) events
    batch_max: int = 5_000
    # Pause between batches unless a full batch is waiting. Each produce round trip costs
    # kafka-python ~1 ms of CPU whatever its size, so fewer, bigger batches are much cheaper;
    # analytics does not mind events arriving 50 ms later.
    batch_interval_s: float = 0.05
    flush_timeout_s: float = 5.0
    probe_timeout_s: float = 2.0
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    close_timeout_s: float = 5.0
    linger_ms: int = 2
    # Below the broker's default message.max.bytes (~1 MiB), which bounds a whole batch.
    batch_bytes: int = 512 << 10
    max_event_bytes: int = 500_000
    fast_append: bool = True  # see gateway.kafka_batches; False forces KafkaProducer.send
    # How often a live sink looks for spools of processes that are gone (e.g. after the
    # gateway was scaled down to fewer workers) and delivers them.
    adopt_interval_s: float = 30.0
    # Create missing topics on connect (brokers here disable auto-creation); None: never.
    create_topics_partitions: int | None = 6
    segment_bytes: int = 64 << 20
    max_spool_bytes: int = 8 << 30  # beyond this (a very long outage) events are dropped, counted


def ensure_topics(
    bootstrap: str, partitions: int = 6, topics: Topics = Topics(), timeout_s: float = 30.0
) -> None:
    """Create the interaction and feedback topics if they do not exist (idempotent)."""
    ms = int(timeout_s * 1000)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ms, bootstrap_timeout_ms=ms)
    try:
        existing = set(admin.list_topics())
        new = [
            NewTopic(name, num_partitions=partitions, replication_factor=1)
            for name in (topics.interactions, topics.feedback)
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(new)
    finally:
        admin.close()
