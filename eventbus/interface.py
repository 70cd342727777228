"""What the rest of liftgate knows of Kafka: a producer, a consumer and an admin call.

Two backends implement it (:mod:`eventbus.confluent` on librdkafka, :mod:`eventbus.kafka_python`
in pure Python), each through its library's public API only; :func:`eventbus.open_bus` picks
one. Records are plain tuples so a batch of 50,000 costs no object per field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

ClientChoice = Literal["auto", "confluent", "python"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Message(NamedTuple):
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class BusError(Exception):
    """A Kafka operation failed (the backend's own error is chained)."""


class BusUnavailable(BusError):
    """No broker answers right now (expected during an outage; callers retry with backoff)."""


class CommitFailed(BusError):
    """Offsets were not committed, e.g. the partitions moved to another group member."""


class BusFatal(BusError):
    """The client can no longer be used, e.g. a static group member fenced by another member
    with its ``group.instance.id``: every later call fails (or, worse, quietly returns nothing).
    Close it and make a new one, which resumes from the committed offsets."""


# Called once per produced record with None (acknowledged by all in-sync replicas) or the
# error; from the thread that calls poll/flush (confluent) or the client's network thread
# (kafka-python), so it must only record the outcome.
DeliveryCallback = Callable[[BusError | None], None]
#: Called inside ``poll_batch`` just before a rebalance takes these partitions from the member
#: (it still owns them: it may commit their offsets). Every owned partition is revoked (eager
#: rebalancing); whatever is assigned next is read again from its committed offset. The
#: kafka-python backend does not call it (its listeners run on its IO thread).
RevokeCallback = Callable[[list["TopicPartition"]], None]


@dataclass(frozen=True, slots=True)
class ProducerOptions:
    """An idempotent producer (acks=all) of a few topics. Times in milliseconds."""

    bootstrap: str
    client_id: str = "liftgate"
    linger_ms: int = 2
    batch_bytes: int = 512 << 10
    # A record neither acknowledged nor failed after this is failed (and its callback told).
    delivery_timeout_ms: int = 5_000
    request_timeout_ms: int = 4_000
    reconnect_backoff_max_ms: int = 1_000
    # Backend-specific settings, merged last (benchmarks and tests; names as the backend spells them).
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """A consumer-group member with manual commits, reading from the earliest offset when none is committed."""

    bootstrap: str
    group_id: str | None
    client_id: str = "liftgate"
    group_instance_id: str | None = None
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 100
    max_partition_fetch_bytes: int = 1 << 20
    metadata_max_age_ms: int = 30_000
    reconnect_backoff_max_ms: int = 1_000
    # Bound of any blocking call (commit, offsets lookup) so a lost coordinator cannot hang a loop.
    request_timeout_ms: int = 10_000
    extra: Mapping[str, Any] = field(default_factory=dict)


class Producer(Protocol):
    def produce(
        self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None = None
    ) -> None:
        """Queue one record (partition: Kafka's default murmur2 of the key); raises BusError if refused."""

    def send(self, records: Sequence[tuple[str, bytes | None, bytes]], timeout_s: float) -> int:
        """Queue ``records`` (topic, key, value) in order, flush, and return how many, from the
        start, are known to be acknowledged: all of them, or the records before the first that
        failed or was refused. When the flush gives up with records still pending, which of
        them landed is not known: 0 (the caller sends them again; consumers drop duplicates).
        Cheaper than ``produce`` with a callback per record; never interleave the two.
        ``send_failure`` then says why, for the log."""

    @property
    def send_failure(self) -> str | None:
        """Why the last ``send`` did not land every record (the first failed record's topic and
        error, or the flush's timeout); None when it did."""

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery callbacks that are due."""

    def flush(self, timeout_s: float) -> int:
        """Wait until every queued record is acknowledged or failed; return how many are still pending."""

    def partition_count(self, topic: str, timeout_s: float) -> int:
        """Partitions of ``topic`` (0: it does not exist); BusUnavailable when no broker answers."""

    def close(self, timeout_s: float = 0.0) -> bool:
        """Stop, abandoning records not acknowledged within ``timeout_s``; False: cannot yet, try again later."""


class Consumer(Protocol):
    def subscribe(self, topics: Sequence[str], on_revoke: RevokeCallback | None = None) -> None:
        """Join the group for ``topics`` (replacing an earlier subscription: a rebalance)."""

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Read these partitions without a group (from the committed offset, else the earliest)."""

    def poll_batch(self, max_records: int, timeout_s: float) -> list[Message]:
        """Up to ``max_records`` records, waiting up to ``timeout_s`` for the first ones.

        Any call of a consumer raises BusFatal once its client is dead (and for good)."""

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit the next offsets to read, synchronously; CommitFailed when the group refused
        them, BusFatal when this member was fenced."""

    def assignment(self) -> list[TopicPartition]: ...

    def pause(self, partitions: Sequence[TopicPartition]) -> None: ...

    def resume(self, partitions: Sequence[TopicPartition]) -> None: ...

    def lag(self, partitions: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, int]:
        """Records after this member's position per partition (partitions whose position is unknown left out)."""

    def partition_count(self, topic: str, timeout_s: float) -> int: ...

    def close(self) -> None:
        """Leave the group without committing anything (also after BusFatal, to free the client)."""


class Bus(Protocol):
    """A backend: makes producers and consumers, creates topics."""

    name: str

    def producer(self, options: ProducerOptions) -> Producer:
        """A producer; raises BusUnavailable when no broker answers within the request timeout."""

    def consumer(self, options: ConsumerOptions) -> Consumer: ...

    def ensure_topics(self, bootstrap: str, names: Sequence[str], partitions: int, timeout_s: float) -> None:
        """Create the topics that do not exist yet (idempotent, also when another process races)."""


#: Records between two releases of the interpreter (a ``sleep(0)``) in a loop over a batch —
#: ``Producer.send``, the gateway's spool writer — so the process's other threads (the
#: gateway's event loop) are not kept waiting for a whole batch (up to the 5 ms switch
#: interval); free at this spacing (bench/gateway/sink_bench.py).
YIELD_EVERY = 64
