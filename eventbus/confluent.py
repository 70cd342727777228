"""The librdkafka backend (confluent-kafka): batching, record parsing and retries in C.

Producers are idempotent (``enable.idempotence``: acks=all, no duplicates or reordering by
the client's own retries) and partition with ``murmur2_random``, Kafka's default, so a unit's
events land in the same partition whichever backend or language produced them. Consumers
commit only what they are told to (``enable.auto.commit`` and ``enable.auto.offset.store``
off). librdkafka's log lines go to the ``eventbus.librdkafka`` logger; a client's line repeated
over and over (a refused connection during an outage) once per 30 s with a count
(``eventbus.repeats``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import confluent_kafka as ck

# The documented import path; the package's stubs do not list the re-export.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

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
from eventbus.repeats import RepeatsAdapter

log = logging.getLogger("eventbus.librdkafka")

_UNREACHABLE = {ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN, ck.KafkaError._TIMED_OUT}
# The member was fenced by another with its group.instance.id: librdkafka raises a fatal
# error (_FATAL, on a consumed message whose error does not say fatal()) and from then on
# fails every call, or returns nothing from consume().
_FATAL = {ck.KafkaError._FATAL, ck.KafkaError.FENCED_INSTANCE_ID}


def _is_fatal(err: object) -> bool:
    return isinstance(err, ck.KafkaError) and (err.fatal() or err.code() in _FATAL)


def _error(exc: ck.KafkaException) -> BusError:
    err = exc.args[0] if exc.args else None
    unreachable = isinstance(err, ck.KafkaError) and err.code() in _UNREACHABLE
    return (BusUnavailable if unreachable else BusError)(str(err if err is not None else exc))


class ConfluentProducer:
    def __init__(self, options: ProducerOptions) -> None:
        o = options
        # What ``send`` learns: the values of the records whose delivery failed. Records queued
        # by ``send`` carry no callback of their own: librdkafka reports them to this one
        # (``produce``'s per-record callbacks take precedence over it), which costs about half
        # of a callback object per record (bench/gateway/README.md).
        self._failed: list[bytes] = []
        self._first_error: str | None = None  # the first failed record's topic and error, this send
        self.send_failure: str | None = None
        self._producer = ck.Producer(
            {
                "bootstrap.servers": o.bootstrap,
                "client.id": o.client_id,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",
                "linger.ms": o.linger_ms,
                "batch.size": o.batch_bytes,
                "message.timeout.ms": o.delivery_timeout_ms,
                "request.timeout.ms": min(o.request_timeout_ms, o.delivery_timeout_ms),
                "reconnect.backoff.max.ms": o.reconnect_backoff_max_ms,
                "logger": RepeatsAdapter(log),
                "on_delivery": self._reported,
                **o.extra,
            }
        )

    def _reported(self, err: ck.KafkaError | None, msg: Any) -> None:
        if err is not None:
            if not self._failed:
                self._first_error = f"{msg.topic()}: {err.str()}"
            self._failed.append(msg.value())

    def send(self, records: Sequence[tuple[str, bytes | None, bytes]], timeout_s: float) -> int:
        self._failed = failed = list[bytes]()
        self._first_error = self.send_failure = None
        produce = self._producer.produce
        queued = 0
        try:
            for topic, key, value in records:
                produce(topic, value, key)
                queued += 1
                if not queued % YIELD_EVERY:
                    time.sleep(0)
        except (BufferError, ck.KafkaException) as exc:
            log.warning("the client refused a record (%s)", exc)
            self.send_failure = f"{records[queued][0]}: refused by the client ({exc})"
        if pending := self._producer.flush(timeout_s):
            self.send_failure = self._first_error or f"{pending} records not acknowledged in {timeout_s:g} s"
            return 0  # which of the pending records landed is not known
        if not failed:
            return queued
        bad = set(failed)  # a record's bytes are unique here (an event's id is in them)
        for i in range(queued):
            if records[i][2] in bad:
                self.send_failure = self._first_error
                return i
        return queued  # the failures were an earlier batch's, reported late

    def produce(
        self, topic: str, key: bytes | None, value: bytes, on_delivery: DeliveryCallback | None = None
    ) -> None:
        try:
            if on_delivery is None:
                self._producer.produce(topic, value, key)
            else:
                self._producer.produce(topic, value, key, on_delivery=_reporter(on_delivery))
        except BufferError as exc:  # the client's queue is full
            raise BusError(str(exc)) from exc
        except ck.KafkaException as exc:
            raise _error(exc) from exc

    def poll(self, timeout_s: float = 0.0) -> None:
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))

    def partition_count(self, topic: str, timeout_s: float) -> int:
        return _partition_count(self._producer, topic, timeout_s)

    def close(self, timeout_s: float = 0.0) -> bool:
        if self._producer.flush(timeout_s):
            # Abandon the rest (the caller keeps its own copy): a close would wait for it.
            self._producer.purge()
            self._producer.flush(0)
        self._producer.close()
        return True


def _reporter(on_delivery: DeliveryCallback) -> Any:
    def report(err: ck.KafkaError | None, _msg: Any) -> None:
        on_delivery(None if err is None else BusError(str(err)))

    return report


def _partition_count(client: ck.Producer | ck.Consumer, topic: str, timeout_s: float) -> int:
    # All topics, not list_topics(topic): asking for one topic creates it on brokers that
    # auto-create, with the broker's default partitions.
    try:
        meta = client.list_topics(timeout=timeout_s)
    except ck.KafkaException as exc:
        raise BusUnavailable(str(exc)) from exc
    found = meta.topics.get(topic)
    return 0 if found is None or found.error is not None else len(found.partitions)


class ConfluentConsumer:
    def __init__(self, options: ConsumerOptions) -> None:
        o = options
        conf: dict[str, Any] = {
            "bootstrap.servers": o.bootstrap,
            "client.id": o.client_id,
            "group.id": o.group_id or "liftgate-unused",  # librdkafka requires one, even to assign
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": o.session_timeout_ms,
            "heartbeat.interval.ms": o.heartbeat_interval_ms,
            "fetch.min.bytes": o.fetch_min_bytes,
            "fetch.wait.max.ms": o.fetch_max_wait_ms,
            "max.partition.fetch.bytes": o.max_partition_fetch_bytes,
            "topic.metadata.refresh.interval.ms": o.metadata_max_age_ms,
            "reconnect.backoff.max.ms": o.reconnect_backoff_max_ms,
            "socket.timeout.ms": o.request_timeout_ms,
            "logger": RepeatsAdapter(log),
            **o.extra,
        }
        if o.group_instance_id is not None:
            conf["group.instance.id"] = o.group_instance_id
        self._consumer = ck.Consumer(conf)
        self._timeout_s = o.request_timeout_ms / 1000
        self._topics: list[str] = []
        self._dead: str | None = None  # why the client can no longer be used

    def _alive(self) -> None:
        if self._dead is not None:
            raise BusFatal(self._dead)

    def _failure(self, exc: ck.KafkaException, kind: type[BusError] | None = None) -> BusError:
        """The bus error for ``exc``; a fatal one marks this client dead for every later call."""
        err = exc.args[0] if exc.args else None
        if _is_fatal(err):
            self._dead = str(err)
            return BusFatal(self._dead)
        return _error(exc) if kind is None else kind(str(err if err is not None else exc))

    def subscribe(self, topics: Sequence[str], on_revoke: RevokeCallback | None = None) -> None:
        self._alive()
        self._topics = list(topics)
        try:
            if on_revoke is None:
                self._consumer.subscribe(self._topics)
            else:

                def revoked(_: Any, parts: list[Any]) -> None:
                    on_revoke([TopicPartition(p.topic, p.partition) for p in parts])

                self._consumer.subscribe(self._topics, on_revoke=revoked)
        except ck.KafkaException as exc:
            raise self._failure(exc) from exc

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._alive()
        try:
            self._consumer.assign([ck.TopicPartition(t, p) for t, p in partitions])
        except ck.KafkaException as exc:
            raise self._failure(exc) from exc

    def poll_batch(self, max_records: int, timeout_s: float) -> list[Message]:
        self._alive()
        try:
            batch = self._consumer.consume(max_records, timeout_s)
        except ck.KafkaException as exc:
            raise self._failure(exc) from exc
        out: list[Message] = []
        append = out.append
        for m in batch:
            err = m.error()
            if err is not None:
                if _is_fatal(err):
                    self._dead = str(err)
                    raise BusFatal(self._dead)
                # e.g. a subscribed topic that does not exist yet: nothing to read, not fatal.
                log.warning("consume: %s", err)
                continue
            append(Message(m.topic(), m.partition(), m.offset(), m.key(), m.value()))  # type: ignore[arg-type]
        return out

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._alive()
        parts = [ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            done = self._consumer.commit(offsets=parts, asynchronous=False)
        except ck.KafkaException as exc:
            raise self._failure(exc, CommitFailed) from exc
        failed = [tp for tp in done or () if tp.error is not None]
        if failed:
            if _is_fatal(failed[0].error):
                self._dead = str(failed[0].error)
                raise BusFatal(self._dead)
            raise CommitFailed(f"offsets refused: {failed[0].error}")

    def assignment(self) -> list[TopicPartition]:
        self._alive()
        try:
            return [TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()]
        except ck.KafkaException as exc:
            raise self._failure(exc) from exc

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        self._alive()
        if partitions:
            try:
                self._consumer.pause([ck.TopicPartition(t, p) for t, p in partitions])
            except ck.KafkaException as exc:
                raise self._failure(exc) from exc

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        self._alive()
        if partitions:
            try:
                self._consumer.resume([ck.TopicPartition(t, p) for t, p in partitions])
            except ck.KafkaException as exc:
                raise self._failure(exc) from exc

    def lag(self, partitions: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, int]:
        self._alive()
        out: dict[TopicPartition, int] = {}
        parts = [ck.TopicPartition(t, p) for t, p in partitions]
        try:
            positions = self._consumer.position(parts)
            unfetched = [tp for tp in positions if tp.offset < 0]
            # Nothing fetched yet (e.g. an empty partition): the member starts from the
            # committed offset, else from the earliest one (auto.offset.reset).
            committed = {
                (tp.topic, tp.partition): tp.offset
                for tp in (self._consumer.committed(unfetched, timeout=timeout_s) if unfetched else ())
            }
            for tp in positions:
                marks = self._consumer.get_watermark_offsets(tp, timeout=timeout_s)
                if marks is None:
                    continue
                position = tp.offset if tp.offset >= 0 else committed.get((tp.topic, tp.partition), -1)
                if position < 0:
                    position = marks[0]
                out[TopicPartition(tp.topic, tp.partition)] = max(0, marks[1] - position)
        except ck.KafkaException as exc:
            raise self._failure(exc) from exc
        return out

    def partition_count(self, topic: str, timeout_s: float) -> int:
        self._alive()
        return _partition_count(self._consumer, topic, timeout_s)

    def close(self) -> None:
        try:
            self._consumer.close()  # auto-commit is off: leaves the group, commits nothing
        except ck.KafkaException as exc:
            if self._dead is None:
                raise self._failure(exc) from exc
            log.debug("closing a dead client: %s", exc)  # its resources are freed all the same


class ConfluentBus:
    name = "confluent"

    def producer(self, options: ProducerOptions) -> ConfluentProducer:
        return ConfluentProducer(options)

    def consumer(self, options: ConsumerOptions) -> ConfluentConsumer:
        return ConfluentConsumer(options)

    def ensure_topics(self, bootstrap: str, names: Sequence[str], partitions: int, timeout_s: float) -> None:
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": RepeatsAdapter(log)}
        admin = AdminClient(conf)
        try:
            existing = set(admin.list_topics(timeout=timeout_s).topics)
        except ck.KafkaException as exc:
            raise BusUnavailable(str(exc)) from exc
        new = [
            NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names if n not in existing
        ]
        if not new:
            return
        futures = admin.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout_s)
            except ck.KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, ck.KafkaError) and err.code() == ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # another process created it at the same moment
                raise BusError(f"cannot create topic {name}: {err}") from exc
