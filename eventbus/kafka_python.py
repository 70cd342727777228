"""The pure-Python backend (kafka-python), used through its documented public API only.

The fallback when confluent-kafka cannot be imported (no wheel for the platform) or when
``LIFTGATE_KAFKA_CLIENT=python``. It costs more CPU per record than librdkafka (parsing,
batching and checksums run in the interpreter; bench/gateway and bench/ingest) but behaves
the same: idempotent producer with acks=all and Kafka's default murmur2 partitioner, manual
commits, pause/resume.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, OffsetAndMetadata
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    FencedInstanceIdError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
)

from eventbus.interface import (
    YIELD_EVERY,
    BusError,
    BusFatal,
    BusUnavailable,
    CommitFailed,
    ConsumerOptions,
    DeliveryCallback,
    Message,
    ProducerOptions,
    RevokeCallback,
    TopicPartition,
)

log = logging.getLogger(__name__)


class _KafkaProducer(KafkaProducer):  # type: ignore[misc]  # kafka-python has no type hints
    """kafka-python's producer, whose exit hooks stay quiet once we gave it up.

    kafka-python closes a producer again at interpreter exit (an ``atexit`` hook) and when it
    is collected (``__del__``), both through ``close``, with a flush that raises on records
    still pending. A producer we gave up on (``abandoned``: its broker hung; its records are
    in the caller's spool) may hold such records for ever (see ``PythonProducer.close``), and
    the raise would print a traceback at every exit. Its hooks' ``close`` then stops at once
    and says nothing; ``PythonProducer`` closes through ``KafkaProducer.close`` itself, so its
    own calls still learn when the producer could not close.
    """

    abandoned = False

    def close(self, timeout: float | None = None, null_logger: bool = False) -> None:
        if not self.abandoned:
            super().close(timeout, null_logger)
            return
        with contextlib.suppress(KafkaTimeoutError):
            super().close(0, null_logger)


class PythonProducer:
    def __init__(self, options: ProducerOptions) -> None:
        o = options
        if not any(_answers(_address(item), o.request_timeout_ms / 1000) for item in o.bootstrap.split(",")):
            # A kafka-python client made against a dead or hung broker keeps its network thread
            # retrying for seconds after close, competing with the caller's threads for the
            # interpreter; one request on a plain socket tells the same and costs nothing.
            raise BusUnavailable(f"no broker answers at {o.bootstrap}")
        try:
            self._producer = _KafkaProducer(
                bootstrap_servers=o.bootstrap,
                client_id=o.client_id,
                acks="all",
                enable_idempotence=True,
                linger_ms=o.linger_ms,
                batch_size=o.batch_bytes,
                max_block_ms=o.request_timeout_ms,
                bootstrap_timeout_ms=o.request_timeout_ms,
                delivery_timeout_ms=o.delivery_timeout_ms,
                request_timeout_ms=o.request_timeout_ms,
                reconnect_backoff_max_ms=o.reconnect_backoff_max_ms,
                metrics_enabled=False,  # its per-record sensors cost more CPU than they tell us
                **o.extra,
            )
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            raise BusUnavailable(f"no broker answers at {o.bootstrap}") from exc
        except KafkaError as exc:
            raise BusError(str(exc)) from exc
        self._lock = threading.Lock()
        self._pending = 0  # sent, neither acknowledged nor failed
        self.send_failure: str | None = None

    def produce(
        self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None = None
    ) -> None:
        try:
            future = self._producer.send(topic, value=value, key=key)
        except KafkaError as exc:
            raise BusError(str(exc)) from exc
        with self._lock:
            self._pending += 1

        def done(_: Any) -> None:
            with self._lock:
                self._pending -= 1
            if on_delivery is not None:
                on_delivery(None)

        def failed(exc: BaseException) -> None:
            with self._lock:
                self._pending -= 1
            if on_delivery is not None:
                on_delivery(BusError(str(exc)))

        future.add_callback(done)
        future.add_errback(failed)

    def send(self, records: Sequence[tuple[str, bytes | None, bytes]], timeout_s: float) -> int:
        """A callback per record: kafka-python reports each record's future, nothing cheaper."""
        outcomes = bytearray(len(records))  # 0 pending, 1 acknowledged, 2 failed
        errors: dict[int, str] = {}
        refused: str | None = None
        self.send_failure = None

        def mark(i: int) -> DeliveryCallback:
            def done(error: BusError | None) -> None:
                outcomes[i] = 1 if error is None else 2
                if error is not None:
                    errors[i] = f"{records[i][0]}: {error}"

            return done

        try:
            for i, (topic, key, value) in enumerate(records):
                self.produce(topic, key, value, mark(i))
                if not (i + 1) % YIELD_EVERY:
                    time.sleep(0)
        except BusError as exc:
            log.warning("the client refused a record (%s)", exc)  # the rest stay pending
            refused = f"{records[i][0]}: refused by the client ({exc})"
        pending = self.flush(timeout_s)
        acked = len(outcomes) - len(outcomes.lstrip(b"\x01"))
        if acked < len(records):
            timed_out = f"{pending} records not acknowledged in {timeout_s:g} s"
            self.send_failure = errors.get(acked) or refused or timed_out
        return acked

    def poll(self, timeout_s: float = 0.0) -> None:
        """Nothing to serve: kafka-python runs callbacks on its network thread."""

    def flush(self, timeout_s: float) -> int:
        try:
            self._producer.flush(timeout_s)
        except KafkaTimeoutError:
            return max(1, self._pending)
        return 0

    def partition_count(self, topic: str, timeout_s: float) -> int:
        try:
            return len(self._producer.partitions_for(topic) or ())
        except KafkaTimeoutError:
            return 0  # the broker answered the probe but does not know the topic
        except KafkaError as exc:
            raise BusUnavailable(str(exc)) from exc

    def close(self, timeout_s: float = 0.0) -> bool:
        """False while records are still pending (try again later).

        kafka-python's ``close(timeout)`` flushes first and raises when that flush times out,
        before it stops its threads; it has no public way to abandon records. Every record is
        acknowledged or expired by ``delivery_timeout_ms`` once the client can reach the
        broker or has dropped the connection, so a later call closes it.
        """
        with self._lock:
            pending = self._pending
        if pending and timeout_s <= 0:
            self._producer.abandoned = True
            return False  # the flush inside close() would raise at once
        try:
            KafkaProducer.close(self._producer, timeout_s)  # not the hooks' quiet close
        except KafkaTimeoutError:
            self._producer.abandoned = True
            return False
        return True


class PythonConsumer:
    def __init__(self, options: ConsumerOptions) -> None:
        o = options
        self._timeout_ms = o.request_timeout_ms
        try:
            self._consumer = KafkaConsumer(
                bootstrap_servers=o.bootstrap,
                group_id=o.group_id,
                client_id=o.client_id,
                group_instance_id=o.group_instance_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=o.session_timeout_ms,
                heartbeat_interval_ms=o.heartbeat_interval_ms,
                fetch_min_bytes=o.fetch_min_bytes,
                fetch_max_wait_ms=o.fetch_max_wait_ms,
                max_partition_fetch_bytes=o.max_partition_fetch_bytes,
                metadata_max_age_ms=o.metadata_max_age_ms,
                reconnect_backoff_max_ms=o.reconnect_backoff_max_ms,
                **o.extra,
            )
        except KafkaError as exc:  # e.g. NoBrokersAvailable: it bootstraps in the constructor
            raise BusUnavailable(str(exc)) from exc
        self._dead: str | None = None  # why the client can no longer be used

    def _alive(self) -> None:
        if self._dead is not None:
            raise BusFatal(self._dead)

    def _failure(self, exc: KafkaError, kind: type[BusError] = BusError) -> BusError:
        """The bus error for ``exc``; a fenced member's client is dead for every later call.

        kafka-python learns of the fence from a commit, a heartbeat (which it then stops,
        leaving the client assigned partitions another member owns) or a rejoin: a new
        client is the way back into the group."""
        if isinstance(exc, FencedInstanceIdError):
            self._dead = f"fenced by another member with this group.instance.id ({exc})"
            return BusFatal(self._dead)
        return kind(str(exc))

    def subscribe(self, topics: Sequence[str], on_revoke: RevokeCallback | None = None) -> None:
        self._alive()
        # ``on_revoke`` is not called: kafka-python runs rebalance listeners on its IO thread,
        # where a commit cannot block. A rebalance redelivers what was not committed (ingest
        # ignores the events it stored).
        self._consumer.unsubscribe()
        self._consumer.subscribe(list(topics))

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._alive()
        self._consumer.assign([KafkaTopicPartition(t, p) for t, p in partitions])

    def poll_batch(self, max_records: int, timeout_s: float) -> list[Message]:
        self._alive()
        try:
            fetched = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            raise self._failure(exc) from exc
        return [
            Message(r.topic, r.partition, r.offset, r.key, r.value)
            for records in fetched.values()
            for r in records
        ]

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._alive()
        try:
            self._consumer.commit(
                {KafkaTopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()},
                timeout_ms=self._timeout_ms,
            )
        except KafkaError as exc:
            raise self._failure(exc, CommitFailed) from exc

    def assignment(self) -> list[TopicPartition]:
        self._alive()
        return [TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()]

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        self._alive()
        self._consumer.pause(*(KafkaTopicPartition(t, p) for t, p in partitions))

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        self._alive()
        self._consumer.resume(*(KafkaTopicPartition(t, p) for t, p in partitions))

    def lag(self, partitions: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, int]:
        self._alive()
        parts = [KafkaTopicPartition(t, p) for t, p in partitions]
        ms = int(timeout_s * 1000)
        out: dict[TopicPartition, int] = {}
        try:
            ends = self._consumer.end_offsets(parts, timeout_ms=ms)
            for tp in parts:
                # Bounded: without a timeout position() can block forever (e.g. a partition
                # whose offset is being reset while the group rebalances).
                pos = self._consumer.position(tp, timeout_ms=min(ms, 1000))
                if pos is not None and tp in ends:
                    out[TopicPartition(tp.topic, tp.partition)] = max(0, int(ends[tp]) - int(pos))
        except KafkaError as exc:
            raise self._failure(exc) from exc
        return out

    def partition_count(self, topic: str, timeout_s: float) -> int:
        self._alive()
        try:
            return len(self._consumer.partitions_for_topic(topic) or ())
        except KafkaError as exc:
            raise self._failure(exc, BusUnavailable) from exc

    def close(self) -> None:
        self._consumer.close(autocommit=False, timeout_ms=self._timeout_ms)


class PythonBus:
    name = "python"

    def producer(self, options: ProducerOptions) -> PythonProducer:
        return PythonProducer(options)

    def consumer(self, options: ConsumerOptions) -> PythonConsumer:
        return PythonConsumer(options)

    def ensure_topics(self, bootstrap: str, names: Sequence[str], partitions: int, timeout_s: float) -> None:
        ms = int(timeout_s * 1000)
        if not any(_answers(_address(item), timeout_s) for item in bootstrap.split(",")):
            raise BusUnavailable(f"no broker answers at {bootstrap}")  # see PythonProducer
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap, request_timeout_ms=ms, bootstrap_timeout_ms=ms
            )
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            raise BusUnavailable(f"no broker answers at {bootstrap}") from exc
        try:
            existing = set(admin.list_topics())
            for name in names:
                if name not in existing:
                    # Another process may create it at the same moment: that is fine.
                    with contextlib.suppress(TopicAlreadyExistsError):
                        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        except KafkaError as exc:
            raise BusError(str(exc)) from exc
        finally:
            admin.close()


_PING_ID = 0x4C47  # correlation id of the probe request


def _answers(address: tuple[str, int], timeout_s: float) -> bool:
    """Whether a Kafka broker at ``address`` answers an ApiVersions request within the timeout.

    Version 0 of the request (api key 18), which every broker answers (at worst with an
    error and the versions it supports): a reply with our correlation id is enough.
    """
    client = b"liftgate-probe"
    request = struct.pack(">hhih", 18, 0, _PING_ID, len(client)) + client
    try:
        with socket.create_connection(address, timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            head = b""
            while len(head) < 8:
                chunk = sock.recv(8 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    correlation_id: int = struct.unpack(">ii", head)[1]
    return correlation_id == _PING_ID


def _address(item: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host (Kafka's default port, as the client does)."""
    item = item.strip()
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif item.count(":") == 1:
        host, _, port = item.partition(":")
    else:
        host, port = item, ""
    return host, int(port) if port.isdigit() else 9092
