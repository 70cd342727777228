"""The bus contract, run against both backends on a real broker."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventbus import (
    Bus,
    BusError,
    BusFatal,
    BusUnavailable,
    Consumer,
    ConsumerOptions,
    Message,
    ProducerOptions,
    TopicPartition,
    open_bus,
)
from tests.gateway.kafka_helpers import ROOT, PrivateBroker, dead_bootstrap


def _read(consumer_poll: object, want: int, timeout_s: float = 60.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += consumer_poll(1_000, 0.5)  # type: ignore[operator]
    return out


def _read_topic(bus: Bus, bootstrap: str, topic: str, group: str, want: int) -> list[Message]:
    """``want`` records of ``topic``, read by a new member of ``group`` from the start."""
    consumer = bus.consumer(ConsumerOptions(bootstrap, group_id=group))
    consumer.subscribe([topic])
    try:
        return _read(consumer.poll_batch, want)
    finally:
        consumer.close()


def test_records_of_one_key_are_read_in_the_order_they_were_produced(
    bus: Bus, kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"t-{unique_name}"
    bus.ensure_topics(kafka_bootstrap, [topic], 6, 30)
    producer = bus.producer(ProducerOptions(kafka_bootstrap))
    outcomes: list[BusError | None] = []
    for i in range(3_000):
        producer.produce(topic, f"unit-{i % 37}".encode(), str(i).encode(), outcomes.append)
    assert producer.flush(30) == 0
    assert producer.close(5)
    assert outcomes == [None] * 3_000
    got = _read_topic(bus, kafka_bootstrap, topic, f"g-{unique_name}", 3_000)
    assert len(got) == 3_000
    by_key: dict[bytes | None, list[int]] = {}
    partition_of: dict[bytes | None, set[int]] = {}
    for m in got:
        by_key.setdefault(m.key, []).append(int(m.value or b""))
        partition_of.setdefault(m.key, set()).add(m.partition)
    assert all(values == sorted(values) for values in by_key.values())
    assert all(len(parts) == 1 for parts in partition_of.values())  # one key, one partition
    assert len({p for parts in partition_of.values() for p in parts}) > 1  # keys spread


def test_both_backends_put_a_key_in_the_same_partition(kafka_bootstrap: str, unique_name: str) -> None:
    # A gateway fleet may run both clients (e.g. during an upgrade): a unit's events must still
    # share one partition, or their order across the two is lost.
    topic = f"t-{unique_name}"
    buses = [open_bus("confluent"), open_bus("python")]
    buses[0].ensure_topics(kafka_bootstrap, [topic], 6, 30)
    keys = [f"unit-{i}".encode() for i in range(50)]
    for b in buses:
        producer = b.producer(ProducerOptions(kafka_bootstrap))
        for k in keys:
            producer.produce(topic, k, b.name.encode())
        assert producer.flush(30) == 0
        producer.close(5)
    consumer = buses[0].consumer(ConsumerOptions(kafka_bootstrap, group_id=f"g-{unique_name}"))
    consumer.subscribe([topic])
    try:
        got = _read(consumer.poll_batch, 100)
    finally:
        consumer.close()
    placed: dict[bytes | None, dict[bytes | None, int]] = {}
    for m in got:
        placed.setdefault(m.key, {})[m.value] = m.partition
    assert len(placed) == 50
    assert all(p[b"confluent"] == p[b"python"] for p in placed.values())


def test_a_new_member_resumes_after_the_committed_offsets_and_pause_holds_records_back(
    bus: Bus, kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"t-{unique_name}"
    bus.ensure_topics(kafka_bootstrap, [topic], 1, 30)
    producer = bus.producer(ProducerOptions(kafka_bootstrap))
    for i in range(100):
        producer.produce(topic, b"k", str(i).encode())
    assert producer.flush(30) == 0
    producer.close(5)
    options = ConsumerOptions(kafka_bootstrap, group_id=f"g-{unique_name}", fetch_max_wait_ms=10)
    first = bus.consumer(options)
    first.subscribe([topic])
    try:
        got = _read(first.poll_batch, 100)
        assert [int(m.value or b"") for m in got] == list(range(100))
        first.commit({TopicPartition(topic, 0): 60})  # only the first 60 were "written"
    finally:
        first.close()
    producer = bus.producer(ProducerOptions(kafka_bootstrap))
    for i in range(100, 110):
        producer.produce(topic, b"k", str(i).encode())
    assert producer.flush(30) == 0
    producer.close(5)
    second = bus.consumer(options)
    second.subscribe([topic])
    try:
        early: list[Message] = []
        deadline = time.monotonic() + 60
        while not second.assignment() and time.monotonic() < deadline:
            early += second.poll_batch(1, 0.2)  # joins the group; what it reads is kept
        assert second.assignment() == [TopicPartition(topic, 0)]
        second.pause(second.assignment())
        # A paused partition yields nothing however long we poll (the member stays in the group).
        while_paused = [m for _ in range(5) for m in second.poll_batch(1_000, 0.2)]
        assert while_paused == []
        second.resume(second.assignment())
        rest = _read(second.poll_batch, 50 - len(early))
        values = [int(m.value or b"") for m in early + rest]
        assert values == list(range(60, 110))
        lag = second.lag(second.assignment(), 10)
        assert lag == {TopicPartition(topic, 0): 0}
    finally:
        second.close()


def test_a_fenced_static_member_raises_bus_fatal_on_every_later_call_and_still_closes(
    bus: Bus, kafka_bootstrap: str, unique_name: str
) -> None:
    topic = f"t-{unique_name}"
    bus.ensure_topics(kafka_bootstrap, [topic], 1, 30)
    options = ConsumerOptions(
        kafka_bootstrap, group_id=f"g-{unique_name}", group_instance_id="one", session_timeout_ms=6_000
    )

    def joined(consumer: Consumer) -> Consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while not consumer.assignment():
            assert time.monotonic() < deadline, "never assigned"
            consumer.poll_batch(10, 0.2)
        return consumer

    first = joined(bus.consumer(options))
    second = joined(bus.consumer(options))  # the same instance id: the broker fences the first
    try:
        with pytest.raises(BusFatal):
            first.commit({TopicPartition(topic, 0): 0})
        with pytest.raises(BusFatal):
            first.poll_batch(10, 0.1)
        with pytest.raises(BusFatal):
            first.assignment()
        with pytest.raises(BusFatal):
            first.subscribe([topic])
        first.close()
        second.commit({TopicPartition(topic, 0): 0})  # the member that holds the id is unharmed
    finally:
        second.close()


def test_send_answers_the_acknowledged_prefix_of_a_batch(
    bus: Bus, kafka_bootstrap: str, unique_name: str
) -> None:
    topic, missing = f"t-{unique_name}", f"missing-{unique_name}"  # the broker creates no topic itself
    bus.ensure_topics(kafka_bootstrap, [topic], 3, 30)
    producer = bus.producer(
        ProducerOptions(kafka_bootstrap, delivery_timeout_ms=3_000, request_timeout_ms=1_000)
    )
    try:
        good = [(topic, f"unit-{i % 7}".encode(), str(i).encode()) for i in range(500)]
        assert producer.send(good, 30) == 500 and producer.send_failure is None
        # A record that cannot land: the answer stops before it, whatever became of the rest.
        mixed = [(topic, b"k", b"a%d" % i) for i in range(5)] + [(missing, b"k", b"lost")]
        mixed += [(topic, b"k", b"b%d" % i) for i in range(5)]
        started = time.monotonic()
        assert producer.send(mixed, 10) == 5
        assert time.monotonic() - started < 10
        assert producer.send_failure is not None and missing in producer.send_failure  # what to log
        assert producer.send([(topic, b"k", b"after")], 30) == 1  # a failure does not stick
        assert producer.send_failure is None
    finally:
        producer.close(5)
    got = _read_topic(bus, kafka_bootstrap, topic, f"g-{unique_name}", 506)
    values = [m.value for m in got]
    by_key: dict[bytes | None, list[int]] = {}
    for m in got:
        if m.key != b"k":
            by_key.setdefault(m.key, []).append(int(m.value or b""))
    assert sorted(v for vs in by_key.values() for v in vs) == list(range(500))
    assert all(vs == sorted(vs) for vs in by_key.values())
    assert {b"a0", b"a4", b"after"} <= set(values) and b"lost" not in values


def test_a_failed_delivery_is_reported_to_its_callback(bus: Bus, unique_name: str) -> None:
    # A broker that never answers: the producer cannot even be made (BusUnavailable), or each
    # record fails within the delivery timeout; never a silent success.
    options = ProducerOptions(dead_bootstrap(), delivery_timeout_ms=1_000, request_timeout_ms=500)
    started = time.monotonic()
    try:
        producer = bus.producer(options)
    except BusUnavailable:
        assert time.monotonic() - started < 5
        return
    outcomes: list[BusError | None] = []
    producer.produce(f"t-{unique_name}", b"k", b"v", outcomes.append)
    producer.flush(5)
    producer.close(0)
    assert len(outcomes) == 1 and isinstance(outcomes[0], BusError)


def test_an_unreachable_broker_is_reported_as_unavailable_within_the_timeout(
    bus: Bus, unique_name: str
) -> None:
    started = time.monotonic()
    with pytest.raises(BusUnavailable):
        bus.ensure_topics(dead_bootstrap(), [f"t-{unique_name}"], 1, 1.0)
    assert time.monotonic() - started < 10


def test_an_unknown_client_name_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, confluent or python"):
        open_bus("java")  # type: ignore[arg-type]


def test_auto_picks_librdkafka_when_it_can_be_imported() -> None:
    assert open_bus("auto").name == "confluent"


# A producer given up on while its broker hangs: close(0) abandons its records (kafka-python's
# cannot, and says False), and the process must still exit on its own, without the client's
# exit hooks raising on the records left in it.
_GIVE_UP_WHILE_FROZEN = """
import sys
from eventbus import ProducerOptions, open_bus

producer = open_bus(sys.argv[2]).producer(
    ProducerOptions(sys.argv[1], delivery_timeout_ms=120_000, request_timeout_ms=60_000)
)
producer.produce("frozen", b"k", b"first")
assert producer.flush(30) == 0, "not acknowledged"
print("live", flush=True)
sys.stdin.readline()  # the broker is frozen now
producer.produce("frozen", b"k", b"second")
print("closed", producer.close(0), flush=True)
"""


@pytest.mark.slow
def test_a_producer_given_up_on_while_its_broker_hangs_lets_its_process_exit_without_a_traceback(
    tmp_path: Path, bus: Bus, kafka_client: str
) -> None:
    broker = PrivateBroker(tmp_path / "state")
    broker.up()
    child: subprocess.Popen[str] | None = None
    try:
        bus.ensure_topics(broker.bootstrap, ["frozen"], 1, 30)
        child = subprocess.Popen(
            [sys.executable, "-c", _GIVE_UP_WHILE_FROZEN, broker.bootstrap, kafka_client],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "live", child.communicate(timeout=30)
        broker.freeze()
        child.stdin.write("\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        broker.thaw()
        broker.down()
    assert child.returncode == 0, err
    if kafka_client == "python":  # its record still pending: it could not close
        assert out.split() == ["closed", "False"], out
    assert "Traceback" not in err and "Exception ignored" not in err, err
