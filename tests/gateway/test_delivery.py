"""Delivery's logic with a recording transport: memory hand-over vs spool reads, failures, closing.

The spool is real (files under tmp_path); the transport is a stand-in that records what it is
given and can be told to fail, so these tests pin the order, commit and retry rules exactly.
The same paths against a real broker are covered in test_kafka_sink and test_sink_durability.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from gateway.delivery import Chunk, Delivery, DeliverySettings, Transport, TransportUnavailable
from gateway.spool import Record, Spool

SETTINGS = DeliverySettings(
    batch_max=50,
    batch_interval_s=0.001,
    flush_timeout_s=1.0,
    backoff_initial_s=0.01,
    backoff_max_s=0.02,
    adopt_interval_s=3600.0,
    handoff_max_bytes=1 << 20,
)


def records(n: int, start: int = 0) -> list[Record]:
    return [("t", f"k{i % 3}".encode(), f"v{i}".encode()) for i in range(start, start + n)]


class Recorder:
    """A transport that acknowledges everything, except ``fail_after`` records per call if set."""

    def __init__(self, log: list[Record], fail_after: int | None = None, closable_after: int = 0) -> None:
        self.log, self.fail_after = log, fail_after
        self.close_calls, self.closable_after, self.closed = 0, closable_after, False

    def deliver(self, batch: Sequence[Record], timeout_s: float) -> int:
        acked = len(batch) if self.fail_after is None else min(self.fail_after, len(batch))
        self.log.extend(batch[:acked])
        return acked

    def close(self, timeout_s: float = 0.0) -> bool:
        self.close_calls += 1
        self.closed = self.close_calls > self.closable_after
        return self.closed


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def running(delivery: Delivery) -> threading.Thread:
    thread = threading.Thread(target=delivery.run, daemon=True)
    thread.start()
    return thread


def write(spool: Spool, delivery: Delivery, batch: list[Record]) -> None:
    """What the sink's spool writer does: append, and offer under the spool's lock."""
    spool.append(batch, lambda start, ends: delivery.offer(Chunk(start, batch, ends)))


def test_records_offered_while_live_go_out_from_memory_in_order_and_are_committed(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    got: list[Record] = []
    delivery = Delivery(spool, tmp_path, lambda: Recorder(got), SETTINGS)
    thread = running(delivery)
    until(lambda: delivery.live, "connected")
    for i in range(0, 300, 7):  # chunks smaller and (joined) larger than batch_max
        write(spool, delivery, records(7, start=i))
    until(lambda: len(got) == 301, "delivery")
    delivery.stop(5)
    thread.join(10)
    assert got == records(301)
    assert delivery.counters["delivered"] == 301 and delivery.counters["replayed"] == 0
    assert spool.empty()
    spool.close()


def test_records_the_writer_appends_while_delivery_looks_for_them_still_go_out_from_memory(
    tmp_path: Path,
) -> None:
    # The writer may append (and offer) between delivery's look at the hand-over and its read
    # of the spool's files: what it appended then is left to the hand-over, not read back.
    class WriterInBetween(Spool):
        pending: list[Record] | None = records(5)

        def read(
            self, max_records: int, max_bytes: int = 4 << 20, upto: int | None = None
        ) -> list[tuple[Record, int]]:
            batch, self.pending = self.pending, None
            if batch is not None:
                write(self, delivery, batch)
            return super().read(max_records, max_bytes, upto)

    spool = WriterInBetween(tmp_path)
    got: list[Record] = []
    delivery = Delivery(spool, tmp_path, lambda: Recorder(got), SETTINGS)
    thread = running(delivery)
    until(lambda: len(got) == 5, "delivery")
    delivery.stop(1.0)
    thread.join(5)
    assert got == records(5)
    assert delivery.counters["delivered"] == 5 and delivery.counters["replayed"] == 0
    assert spool.committed == spool.end


def test_records_written_before_the_connection_are_read_back_from_the_spool_then_memory_takes_over(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    got: list[Record] = []
    early = records(120)
    spool.append(early)  # e.g. left by a killed process, or written during an outage
    delivery = Delivery(spool, tmp_path, lambda: Recorder(got), SETTINGS)
    thread = running(delivery)
    until(lambda: delivery.live, "connected")
    write(spool, delivery, records(30, start=120))
    until(lambda: len(got) == 150, "delivery")
    delivery.stop(5)
    thread.join(10)
    assert got == records(150)
    assert delivery.counters["replayed"] >= 120 and delivery.counters["delivered"] == 150
    spool.close()


def test_a_partly_acknowledged_batch_is_sent_again_from_its_first_unacknowledged_record(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    got: list[Record] = []
    transports: list[Recorder] = []

    def connect() -> Transport:
        # The first connection acknowledges 10 records of each batch, then fails.
        transport = Recorder(got, fail_after=10 if not transports else None)
        transports.append(transport)
        return transport

    delivery = Delivery(spool, tmp_path, connect, SETTINGS)
    spool.append(records(40))
    thread = running(delivery)
    until(lambda: len(got) == 40 and spool.empty(), "delivery after the failure")
    delivery.stop(5)
    thread.join(10)
    assert got == records(40)  # the acknowledged 10 were committed, not sent twice
    assert delivery.counters["send_failures"] == 1 and len(transports) == 2
    spool.close()


def test_a_connection_that_cannot_close_yet_is_closed_on_a_later_step(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    got: list[Record] = []
    stubborn = Recorder(got, fail_after=0, closable_after=3)  # refuses to close 3 times
    transports = iter([stubborn])

    def connect() -> Transport:
        try:
            return next(transports)
        except StopIteration:
            raise TransportUnavailable("down") from None

    delivery = Delivery(spool, tmp_path, connect, SETTINGS)
    spool.append(records(5))
    thread = running(delivery)
    until(lambda: stubborn.closed, "the stubborn connection closed")
    delivery.stop(5)
    thread.join(10)
    assert stubborn.close_calls == 4 and not delivery.live
    assert spool.pending_records == 5  # nothing was acknowledged: all still in the spool
    spool.close()


def test_offers_are_not_kept_in_memory_while_the_bus_is_unreachable(tmp_path: Path) -> None:
    spool = Spool(tmp_path)

    def connect() -> Transport:
        raise TransportUnavailable("down")

    delivery = Delivery(spool, tmp_path, connect, SETTINGS)
    thread = running(delivery)
    until(lambda: delivery.counters["probes"] >= 2, "probes")
    for i in range(0, 100, 10):
        write(spool, delivery, records(10, start=i))
    delivery.stop(5)
    thread.join(10)
    assert not delivery.live and delivery.counters["delivered"] == 0
    assert spool.pending_records == 100
    assert not delivery._handoff  # the spool alone holds them
    spool.close()


def test_a_refusal_is_a_warning_when_its_reason_is_new_and_information_when_it_repeats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path)
    reasons = iter(["broker down", "broker down", "broker down", "topics ['x'] do not exist"])

    def connect() -> Transport:
        raise TransportUnavailable(next(reasons, "topics ['x'] do not exist"))

    caplog.set_level(logging.INFO, logger="gateway.delivery")
    delivery = Delivery(spool, tmp_path, connect, SETTINGS)
    thread = running(delivery)
    until(lambda: delivery.counters["probes"] >= 6, "probes")
    delivery.stop(5)
    thread.join(10)
    refusals = [(r.levelname, r.getMessage()) for r in caplog.records if "not reachable" in r.getMessage()]
    warned = [m for level, m in refusals if level == "WARNING"]
    assert len(warned) == 2 and "broker down" in warned[0] and "do not exist" in warned[1]
    assert len(refusals) >= 6 and [level for level, _ in refusals].count("INFO") == len(refusals) - 2
    spool.close()
