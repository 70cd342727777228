"""The Kafka sink delivers every event, in order per unit, through broker outages and restarts."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from contracts.events import Event, FeedbackEvent, JudgeEvent, encode
from eventbus import Bus, ConsumerOptions
from gateway.__main__ import make_sink
from gateway.kafka_sink import KafkaSink, SinkConfig, Topics, ensure_topics
from gateway.settings import GatewaySettings
from gateway.spool import Spool
from tests.gateway.kafka_helpers import (
    PrivateBroker,
    check_complete_and_ordered,
    consume,
    dead_bootstrap,
    event,
    wait_until,
)

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)

FAST = SinkConfig(flush_timeout_s=2.0, probe_timeout_s=1.0, backoff_initial_s=0.1, backoff_max_s=1.0)


def unique_topics(name: str) -> Topics:
    return Topics(interactions=f"{name}.interactions", feedback=f"{name}.feedback")


def feedback(i: int) -> FeedbackEvent:
    return FeedbackEvent(request_id=f"req-{i}", unit_id=f"unit-{i % 20}", kind="thumbs_up")


async def deliver_all(sink: KafkaSink, sent: list[Event]) -> None:
    """Start ``sink``, wait until it is connected, emit ``sent`` and wait until all of it is delivered."""
    await sink.start()
    await wait_until(lambda: sink.live, 30, "connected")
    for ev in sent:
        sink.emit(ev)
    await wait_until(lambda: sink.stats()["delivered"] == len(sent), 30, "delivery")


async def test_events_reach_kafka_keyed_by_unit_and_in_order(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, bus: Bus
) -> None:
    topics = unique_topics(unique_name)
    ensure_topics(kafka_bootstrap, 6, topics, bus=bus)
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=FAST, bus=bus)
    sent: list[Event] = []
    for i in range(2_000):
        sent.append(event(i))
        if i % 10 == 0:
            sent.append(feedback(i))
    await deliver_all(sink, sent)
    assert sink.healthy() and sink.live
    await sink.close()
    received = consume(kafka_bootstrap, [topics.interactions, topics.feedback], len(sent))
    check_complete_and_ordered(received, sent, max_duplicates=0)
    stats = sink.stats()
    # Every event went through the spool; none had to be read back from it.
    assert stats["spooled"] == len(sent) and stats["replayed"] == 0 and stats["dropped"] == 0, stats
    assert stats["spool_pending"] == 0 and not list(tmp_path.glob("*/*.seg"))  # delivered segments deleted


async def test_a_sink_creates_the_judgement_topic_too_so_judge_events_never_stall_delivery(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, bus: Bus
) -> None:
    # The sink's own topic creation (create_topics_partitions, on by default) once covered
    # the interaction and feedback topics only: with judge sampling on and no judgement
    # topic, the first judge event timed out in the client, every later event waited behind
    # it in the spool for ever, and the log blamed an "unreachable or slow" bus.
    topics = Topics(f"{unique_name}.interactions", f"{unique_name}.feedback", f"{unique_name}.judgements")
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=FAST, bus=bus)
    sent: list[Event] = []
    for i in range(300):
        sent.append(event(i))
        if i % 20 == 0:
            sent.append(JudgeEvent(f"req-{i}", f"unit-{i % 20}", "judge", "primary", "ok", 12.0, score=0.5))
    await deliver_all(sink, sent)
    await sink.close()
    judged = [ev for ev in sent if isinstance(ev, JudgeEvent)]
    received = consume(kafka_bootstrap, [topics.judgements], len(judged))
    assert sorted(r.event_id for r in received) == sorted(ev.event_id for ev in judged)


async def test_a_sink_that_may_not_create_topics_names_the_missing_judgement_topic(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    topics = Topics(f"{unique_name}.interactions", f"{unique_name}.feedback", f"{unique_name}.judgements")
    bus.ensure_topics(kafka_bootstrap, (topics.interactions, topics.feedback), 3, 30)  # not the judgements'
    config = dataclasses.replace(FAST, create_topics_partitions=None)
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=config, bus=bus)
    await sink.start()
    sink.emit(event(1))

    def named() -> list[str]:  # the delivery thread's warnings naming the topic
        return [
            r.getMessage() for r in caplog.records
            if r.name == "gateway.delivery" and r.levelname == "WARNING" and topics.judgements in r.getMessage()
        ]  # fmt: skip

    await wait_until(lambda: bool(named()), 30, "the missing topic named")
    assert "do not exist" in named()[0]
    assert not sink.live and sink.healthy()  # spooling: nothing is lost
    await sink.close()
    assert sink.stats()["spool_pending"] == 1 and sink.stats()["delivered"] == 0


def test_ensure_topics_creates_both_topics_once_with_the_given_partitions(
    kafka_bootstrap: str, unique_name: str, bus: Bus
) -> None:
    topics = unique_topics(unique_name)
    ensure_topics(kafka_bootstrap, 3, topics, bus=bus)
    ensure_topics(kafka_bootstrap, 3, topics, bus=bus)  # idempotent
    consumer = bus.consumer(ConsumerOptions(kafka_bootstrap, group_id=None))
    try:
        assert consumer.partition_count(topics.interactions, 10) == 3
        assert consumer.partition_count(topics.feedback, 10) == 3
    finally:
        consumer.close()


async def test_a_started_sink_is_healthy_at_once_though_the_broker_is_unreachable(
    tmp_path: Path, bus: Bus
) -> None:
    # start() returns once the spool is held: /readyz does not flap at start-up, and a
    # busy machine cannot leave the writer thread unscheduled past it (a CI failure).
    sink = KafkaSink(dead_bootstrap(), tmp_path, config=FAST, bus=bus)
    await sink.start()
    assert sink.healthy() and not sink.live
    await sink.close()


async def test_emit_never_blocks_while_the_broker_is_unreachable(tmp_path: Path, bus: Bus) -> None:
    sink = KafkaSink(dead_bootstrap(), tmp_path, config=FAST, bus=bus)
    await sink.start()
    events = [event(i) for i in range(100_000)]
    started = time.perf_counter()
    for ev in events:
        sink.emit(ev)
    elapsed = time.perf_counter() - started
    assert elapsed < 2.0, f"100k emits took {elapsed:.2f}s"
    assert not sink.live and sink.healthy()  # spooling: nothing is lost
    await sink.close()
    stats = sink.stats()
    assert stats["spool_pending"] == 100_000 and stats["dropped"] == 0 and stats["delivered"] == 0


async def test_a_sink_restart_while_kafka_is_down_loses_nothing(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path, bus: Bus
) -> None:
    topics = unique_topics(unique_name)
    ensure_topics(kafka_bootstrap, 6, topics, bus=bus)
    down = dead_bootstrap()
    sent = [event(i) for i in range(3_000)]
    first = KafkaSink(down, tmp_path, topics=topics, config=FAST, bus=bus)
    await first.start()
    for ev in sent[:1_500]:
        first.emit(ev)
    await first.close()
    second = KafkaSink(down, tmp_path, topics=topics, config=FAST, bus=bus)  # the gateway restarted
    await second.start()
    for ev in sent[1_500:]:
        second.emit(ev)
    await second.close()
    assert second.stats()["spool_pending"] == 3_000
    third = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=FAST, bus=bus)  # Kafka is back
    await third.start()
    await wait_until(lambda: third.live and third.stats()["spool_pending"] == 0, 30, "replay")
    await third.close()
    assert third.stats()["replayed"] == 3_000
    check_complete_and_ordered(consume(kafka_bootstrap, [topics.interactions], 3_000), sent, 0)


async def test_a_burst_of_many_batches_is_spooled_and_delivered_in_order(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    topics = unique_topics(unique_name)  # not created here: the sink creates missing topics itself
    config = SinkConfig(batch_max=50, flush_timeout_s=2.0)
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=config)
    sent = [event(i) for i in range(5_000)]
    for ev in sent:  # queued before the background threads run: 100 batches
        sink.emit(ev)
    await sink.start()
    await wait_until(lambda: sink.stats()["delivered"] == 5_000 and sink.live, 30, "delivery")
    await sink.close()
    assert sink.stats()["spooled"] == 5_000 and sink.stats()["dropped"] == 0
    check_complete_and_ordered(consume(kafka_bootstrap, [topics.interactions], 5_000), sent, 0)


async def test_a_corrupt_spool_tail_is_skipped_and_the_rest_delivered(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    topics = unique_topics(unique_name)
    ensure_topics(kafka_bootstrap, 6, topics)
    sent = [event(i) for i in range(100)]
    offline = KafkaSink(dead_bootstrap(), tmp_path, topics=topics, config=FAST)
    await offline.start()
    for ev in sent:
        offline.emit(ev)
    await offline.close()
    segment = next(tmp_path.glob("*/*.seg"))
    segment.write_bytes(segment.read_bytes() + b"\x40\x00\x00\x00garbage-from-a-crash")
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=FAST)
    await sink.start()
    await wait_until(lambda: sink.live and sink.stats()["replayed"] == 100, 30, "replay")
    await sink.close()
    assert sink.stats()["spool_corrupt"] == 1
    check_complete_and_ordered(consume(kafka_bootstrap, [topics.interactions], 100), sent, 0)


async def test_a_full_spool_drops_and_counts_instead_of_filling_the_disk(tmp_path: Path) -> None:
    config = dataclasses.replace(FAST, max_spool_bytes=50_000, segment_bytes=10_000, batch_max=50)
    sink = KafkaSink(dead_bootstrap(), tmp_path, config=config)
    await sink.start()
    for i in range(1_000):
        sink.emit(event(i))
    await wait_until(lambda: sink.stats()["queued"] == 0, 30, "spilling")
    assert not sink.healthy()  # now events are being lost: /readyz must say so
    await sink.close()
    stats = sink.stats()
    assert 50_000 <= stats["spool_bytes"] < 50_000 + 50 * 1_000  # at most one batch over
    assert stats["dropped"] > 0 and stats["dropped"] + stats["spool_pending"] == 1_000
    assert len(list(tmp_path.glob("*/*.seg"))) > 1  # the configured segment size is used


async def test_emit_drops_and_counts_only_beyond_the_hard_limit(tmp_path: Path) -> None:
    sink = KafkaSink(dead_bootstrap(), tmp_path, config=SinkConfig(hard_max_queue=10))
    for i in range(15):
        sink.emit(event(i))
    assert sink.stats()["queued"] == 10 and sink.stats()["dropped"] == 5
    await sink.close()  # never started: what was queued is still persisted
    assert sink.stats()["spool_pending"] == 10 and sink.stats()["queued"] == 0


async def test_spool_replay_after_the_broker_is_stopped_and_restarted(tmp_path: Path, bus: Bus) -> None:
    broker = PrivateBroker(tmp_path / "state")
    broker.up()
    try:
        topics = Topics()
        ensure_topics(broker.bootstrap, 6, topics, bus=bus)
        sent = [event(i) for i in range(3_500)]
        sink = KafkaSink(broker.bootstrap, tmp_path / "spool", topics=topics, config=FAST, bus=bus)
        await sink.start()
        for ev in sent[:500]:
            sink.emit(ev)
        await wait_until(lambda: sink.stats()["delivered"] == 500, 30, "live delivery")
        broker.down()
        for ev in sent[500:2_000]:  # while down: some hit in-flight sends, the rest the spool
            sink.emit(ev)
        await wait_until(lambda: not sink.live and sink.stats()["queued"] == 0, 30, "spooling")
        await sink.close()
        assert sink.stats()["send_failures"] >= 1  # the live path noticed the outage itself
        restarted = KafkaSink(broker.bootstrap, tmp_path / "spool", topics=topics, config=FAST, bus=bus)
        await restarted.start()  # the gateway restarts while Kafka is still down
        for ev in sent[2_000:]:
            restarted.emit(ev)
        await wait_until(lambda: restarted.stats()["spool_pending"] >= 1_500, 30, "spooling after restart")
        broker.up()
        await wait_until(
            lambda: restarted.live and restarted.stats()["spool_pending"] == 0,
            60,
            "replay after restart",
        )
        await restarted.close()
        received = consume(broker.bootstrap, [topics.interactions], len(sent))
        check_complete_and_ordered(received, sent, max_duplicates=FAST.batch_max)
    finally:
        broker.down()


async def test_a_live_sink_delivers_the_spool_a_vanished_worker_left_behind(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    topics = unique_topics(unique_name)
    left = [event(i) for i in range(300)]
    orphan = Spool(tmp_path / "3")  # e.g. worker 3 of a gateway since scaled down to one worker
    orphan.append([(topics.interactions, ev.key, encode(ev)) for ev in left])
    orphan.close()
    sink = KafkaSink(
        kafka_bootstrap, tmp_path, topics=topics, config=dataclasses.replace(FAST, adopt_interval_s=0.1)
    )
    await sink.start()
    await wait_until(lambda: sink.stats()["adopted"] == 300, 30, "adoption")
    await sink.close()
    check_complete_and_ordered(consume(kafka_bootstrap, [topics.interactions], 300), left, 0)
    reopened = Spool(tmp_path / "3")
    assert reopened.empty()
    reopened.close()


async def test_a_failing_spool_write_makes_the_sink_unhealthy_keeps_the_events_and_recovers(
    tmp_path: Path,
) -> None:
    config = dataclasses.replace(FAST, segment_bytes=1_000)
    sink = KafkaSink(dead_bootstrap(), tmp_path, config=config)
    await sink.start()
    sent = [event(i) for i in range(40)]
    for ev in sent[:20]:
        sink.emit(ev)
    await wait_until(lambda: sink.stats()["spooled"] == 20, 10, "the first events spooled")
    # The next append opens a new segment (the first is over 1,000 bytes): make it a full disk.
    next_segment = tmp_path / "0" / f"{sink.stats()['spool_bytes']:020d}.seg"
    next_segment.symlink_to("/dev/full")
    for ev in sent[20:]:
        sink.emit(ev)
    await wait_until(lambda: sink.stats()["write_failures"] >= 1, 10, "a failed write")
    assert not sink.healthy()  # events are not durable: /readyz must say so
    assert sink.stats()["queued"] == 20 and sink.stats()["dropped"] == 0
    next_segment.unlink()
    await wait_until(lambda: sink.healthy() and sink.stats()["queued"] == 0, 10, "writes succeeding again")
    await sink.close()
    spool = Spool(tmp_path / "0")
    stored = spool.read(100)
    spool.close()
    assert [value for (_, _, value), _ in stored] == [encode(ev) for ev in sent]


async def test_with_fsync_interval_zero_every_spool_write_is_fsynced(tmp_path: Path) -> None:
    sink = KafkaSink(dead_bootstrap(), tmp_path, config=dataclasses.replace(FAST, fsync_interval_s=0))
    await sink.start()

    def fsynced(n: int) -> Callable[[], bool]:
        return lambda: sink.stats()["fsyncs"] >= n

    for burst in range(1, 4):
        for i in range(10):
            sink.emit(event(burst * 10 + i))
        # An fsync follows each write (a periodic one, e.g. every 60 s, would time out here).
        await wait_until(fsynced(burst), 10, f"the fsync of burst {burst}")
    await sink.close()
    assert sink.stats()["spool_pending"] == 30


def test_the_gateway_passes_its_spool_fsync_interval_to_the_sink_and_refuses_a_negative_one(
    tmp_path: Path,
) -> None:
    token, bootstrap = "k3y-Of-Sufficient-Length-42", dead_bootstrap()
    settings = GatewaySettings(
        admin_token=token, kafka_bootstrap=bootstrap, spool_dir=str(tmp_path), spool_fsync_interval_s=0.25
    )
    sink = make_sink(settings)
    assert isinstance(sink, KafkaSink) and sink.config.fsync_interval_s == 0.25
    assert sink.spool_root == tmp_path
    with pytest.raises(ValidationError):
        GatewaySettings(admin_token=token, kafka_bootstrap=bootstrap, spool_fsync_interval_s=-1)


async def test_a_graceful_close_delivers_what_was_just_emitted_and_leaves_no_spool_behind(
    kafka_bootstrap: str, unique_name: str, tmp_path: Path
) -> None:
    topics = unique_topics(unique_name)
    ensure_topics(kafka_bootstrap, 6, topics)
    sink = KafkaSink(kafka_bootstrap, tmp_path, topics=topics, config=FAST)
    await sink.start()
    await wait_until(lambda: sink.live, 30, "connected")
    sent = [event(i) for i in range(1_000)]
    for ev in sent:
        sink.emit(ev)
    await sink.close()  # at once: still queued in memory or in the spool
    assert sink.stats()["delivered"] == 1_000 and sink.stats()["spool_pending"] == 0
    assert not list(tmp_path.glob("*/*.seg"))
    check_complete_and_ordered(consume(kafka_bootstrap, [topics.interactions], 1_000), sent, 0)
