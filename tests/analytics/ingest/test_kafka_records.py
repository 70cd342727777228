"""analytics.ingest.kafka_records: the fast v2 record parser yields what kafka-python's does.

Against the real broker: the same topic is read with kafka-python's own parser and with
the fast one, and every ConsumerRecord must be equal — keys (also null), values (also
null and large enough for multi-byte varints), headers, timestamps, offsets — with an
uncompressed and a gzip producer, and when polls stop in the middle of batches. A
structurally broken batch raises kafka-python's CorruptRecordError (pure logic, built
with kafka-python's own batch builder).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from analytics.ingest import kafka_records


@pytest.fixture(params=["c", "python"])
def loop(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test runs with the C record loop (analytics.ingest._kafkarec) and the Python one."""
    was = kafka_records.USE_C_PARSER
    kafka_records.USE_C_PARSER = request.param == "c"
    yield request.param
    kafka_records.USE_C_PARSER = was


def test_the_c_loop_is_built() -> None:
    assert kafka_records._kafkarec is not None


@pytest.fixture
def restore_parser() -> Iterator[None]:
    was = kafka_records.installed()
    yield
    if was:
        kafka_records.install()
    else:
        kafka_records.uninstall()


def _produce(bootstrap: str, topic: str, compression: str | None) -> int:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, batch_size=64 * 1024, compression_type=compression
    )
    n = 0
    for i in range(3000):
        key = None if i % 13 == 0 else f"user-{i % 97}".encode()
        if i % 29 == 0 and key is not None:
            value = None
        elif i % 31 == 0:
            value = b"v" * (20_000 + i)  # multi-byte length varints
        else:
            value = f'{{"i": {i}, "pad": "{"x" * (i % 300)}"}}'.encode()
        headers = [("h1", b"one"), ("h2", b"")] if i % 17 == 0 else None
        producer.send(topic, key=key, value=value, headers=headers)
        n += 1
        if i % 500 == 0:
            producer.flush()
            time.sleep(0.03)  # spread timestamps: multi-byte timestamp deltas in later batches
    producer.flush()
    producer.close()
    return n


def _consume(bootstrap: str, topic: str, n: int, max_records: int) -> list[Any]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=max_records,
    )
    out: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < n and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500, max_records=max_records).values():
                out.extend(recs)
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_fast_parser_yields_the_same_records_as_kafka_python(
    kafka_bootstrap: str, unique_name: str, compression: str | None, restore_parser: None, loop: str
) -> None:
    assert kafka_records.supported()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(unique_name, 3, 1)])
    try:
        n = _produce(kafka_bootstrap, unique_name, compression)
        kafka_records.uninstall()
        reference = _consume(kafka_bootstrap, unique_name, n, max_records=500)
        assert kafka_records.install() and kafka_records.installed()
        fast = _consume(kafka_bootstrap, unique_name, n, max_records=500)
        # Small polls stop inside batches: the next poll must resume at the next record.
        fast_small = _consume(kafka_bootstrap, unique_name, n, max_records=7)
    finally:
        admin.delete_topics([unique_name])
        admin.close()
    assert len(reference) == n
    assert fast == reference
    assert fast_small == reference
    assert any(r.key is None for r in fast) and any(r.value is None for r in fast)
    assert any(r.headers == [("h1", b"one"), ("h2", b"")] for r in fast)
    assert any(r.serialized_value_size > 20_000 for r in fast)


def _batch(
    records: list[tuple[bytes | None, bytes | None]], headers: list[tuple[str, bytes | None]] | None = None
) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers or [])
    built: bytearray = builder.build()
    return built


class _Part:
    """What _records_v2 reads and writes on kafka-python's PartitionRecords."""

    leader_epoch = 0
    records_read = 0
    bytes_read = 0
    next_fetch_offset = 0


class _TP:
    topic = "t"
    partition = 0


def test_parser_reads_a_built_batch_and_tracks_the_position(loop: str) -> None:
    buf = _batch([(b"k1", b"v1"), (None, b"v2" * 100), (b"k3", None)])
    part = _Part()
    recs = list(kafka_records._records_v2(part, _TP(), DefaultRecordBatch(bytes(buf))))
    assert [(r.offset, r.key, r.value) for r in recs] == [
        (0, b"k1", b"v1"),
        (1, None, b"v2" * 100),
        (2, b"k3", None),
    ]
    assert [r.timestamp for r in recs] == [1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_002]
    assert part.records_read == 3 and part.next_fetch_offset == 3


def test_header_values_may_be_null(loop: str) -> None:
    buf = _batch([(b"k", b"v")], headers=[("a", None), ("bb", b"xyz")])
    (rec,) = kafka_records._records_v2(_Part(), _TP(), DefaultRecordBatch(bytes(buf)))
    assert rec.headers == [("a", None), ("bb", b"xyz")]
    assert rec.serialized_header_size == len("a") + len("bb") + len(b"xyz")


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_truncated_batch_is_a_corrupt_record_error(cut: int, loop: str) -> None:
    buf = _batch([(b"key", b"value-" * 10), (b"key2", b"value2")])
    broken = DefaultRecordBatch(bytes(buf[:-cut]))
    with pytest.raises(CorruptRecordError):
        list(kafka_records._records_v2(_Part(), _TP(), broken))


def test_a_record_with_a_wrong_length_is_a_corrupt_record_error(loop: str) -> None:
    buf = _batch([(b"key", b"value")])
    header = DefaultRecordBatch.HEADER_STRUCT.size
    buf[header] += 2  # the first record's length varint (zigzag: +1)
    with pytest.raises(CorruptRecordError):
        list(kafka_records._records_v2(_Part(), _TP(), DefaultRecordBatch(bytes(buf))))


@pytest.mark.parametrize("cut", [1, 5, 10])  # the last record is 17 bytes long
def test_records_before_a_corrupt_one_are_still_yielded(cut: int, loop: str) -> None:
    buf = _batch([(b"key", b"value-" * 10), (b"key2", b"value2")])
    got: list[Any] = []
    with pytest.raises(CorruptRecordError):
        for rec in kafka_records._records_v2(_Part(), _TP(), DefaultRecordBatch(bytes(buf[:-cut]))):
            got.append(rec)
    assert [(r.offset, r.key) for r in got] == [(0, b"key")]


def test_trailing_bytes_after_the_records_are_a_corrupt_record_error(loop: str) -> None:
    buf = _batch([(b"k", b"v")]) + b"\x00"
    with pytest.raises(CorruptRecordError, match="unconsumed"):
        list(kafka_records._records_v2(_Part(), _TP(), DefaultRecordBatch(bytes(buf))))


def test_random_bytes_never_crash_the_parser(loop: str) -> None:
    """Garbage after a valid batch header: records or CorruptRecordError, nothing else."""
    rng = random.Random(7)
    good = _batch([(b"key-%d" % i, b"v" * i) for i in range(20)], headers=[("h", b"x")])
    header = DefaultRecordBatch.HEADER_STRUCT.size
    for _ in range(2000):
        buf = bytearray(good)
        for _ in range(rng.randrange(1, 6)):
            buf[rng.randrange(header, len(buf))] = rng.randrange(256)
        if rng.random() < 0.3:
            buf = buf[: rng.randrange(header, len(buf))]
        try:
            recs = list(kafka_records._records_v2(_Part(), _TP(), DefaultRecordBatch(bytes(buf))))
        except CorruptRecordError:
            continue
        assert all(r.value is None or isinstance(r.value, bytes) for r in recs)
