"""A client's log line repeated over and over passes once per interval, with a count (pure logic)."""

from __future__ import annotations

import logging

import pytest

from eventbus.repeats import RepeatedLines, RepeatsAdapter

REFUSED = "FAIL [rdkafka#consumer-{n}] [thrd:127.0.0.1:{port}/bootstrap]: Connect failed: Connection refused (after {ms}ms)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_line_passes_and_its_repeats_within_the_interval_are_held_back() -> None:
    clock = Clock()
    r = RepeatedLines(interval_s=30, clock=clock)
    first = REFUSED.format(n=1, port=19092, ms=0)
    assert r.admit(logging.ERROR, first) == first
    for i in range(417):
        clock.now += 0.05
        # Only numbers differ: the same line.
        assert r.admit(logging.ERROR, REFUSED.format(n=1, port=19092, ms=i % 7)) is None
    clock.now = 1000.0 + 30
    line = REFUSED.format(n=1, port=19092, ms=3)
    assert r.admit(logging.ERROR, line) == f"{line} (and 417 more like it in the last 30 s)"
    clock.now += 1
    assert r.admit(logging.ERROR, line) is None  # a new interval started with the line let through


def test_different_lines_and_levels_pass_on_their_own() -> None:
    r = RepeatedLines(interval_s=30, clock=Clock())
    assert r.admit(logging.ERROR, "Connection refused") is not None
    assert r.admit(logging.WARNING, "Connection refused") is not None
    assert r.admit(logging.ERROR, "Broker: Not coordinator") is not None
    assert r.admit(logging.ERROR, "Connection refused") is None


def test_a_line_seen_again_after_a_quiet_interval_passes_without_a_count() -> None:
    clock = Clock()
    r = RepeatedLines(interval_s=30, clock=clock)
    assert r.admit(logging.ERROR, "down") == "down"
    clock.now += 31
    assert r.admit(logging.ERROR, "down") == "down"


def test_the_lines_remembered_are_bounded() -> None:
    clock = Clock()
    r = RepeatedLines(interval_s=30, clock=clock, max_lines=3)
    for word in ("a", "b", "c", "d"):  # the fourth empties the memory
        assert r.admit(logging.ERROR, word) == word
    assert r.admit(logging.ERROR, "a") == "a"  # forgotten, so let through again
    assert r.admit(logging.ERROR, "d") is None
    with pytest.raises(ValueError):
        RepeatedLines(interval_s=0)


def test_the_adapter_logs_what_passes_and_skips_disabled_levels(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.eventbus.repeats")
    clock = Clock()
    adapter = RepeatsAdapter(logger, RepeatedLines(interval_s=30, clock=clock))
    caplog.set_level(logging.INFO, logger="tests.eventbus.repeats")
    for _ in range(5):  # as confluent-kafka calls its logger
        adapter.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connection refused")
    adapter.log(logging.DEBUG, "%s [%s] %s", "CGRPOP", "rdkafka#consumer-1", "not logged at INFO")
    clock.now += 30
    adapter.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connection refused")
    assert [r.getMessage() for r in caplog.records] == [
        "FAIL [rdkafka#consumer-1] Connection refused",
        "FAIL [rdkafka#consumer-1] Connection refused (and 4 more like it in the last 30 s)",
    ]
    assert all(r.levelno == logging.ERROR for r in caplog.records)
