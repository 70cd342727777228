"""CPU per event of the gateway's Kafka sink: emit() on the request path, and the background producer.

    .venv/bin/python bench/gateway/sink_bench.py [--bootstrap 127.0.0.1:19092] [--events 50000] [--runs 3]

Prints medians over ``--runs`` runs (numbers, not pass/fail):

* ``emit``: wall time per call on the caller's thread (the gateway's event loop);
* ``encode``: contracts.events.encode alone;
* ``spool write``: encode + spool append (one write per batch, no fsync): what the spool
  writer thread does with every event; ``+ fsync``: the same with an fsync per batch, the
  cost of ``fsync_interval_s=0``;
* ``background``: process CPU per delivered event (spool writer, delivery and fsync threads
  + kafka-python's sender thread), for a burst and for a steady paced rate, per producer
  configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.events import InteractionEvent, encode
from eventbus import ClientChoice, open_bus
from gateway.kafka_sink import KafkaSink, SinkConfig, Topics, ensure_topics
from gateway.spool import Spool


def make_events(n: int) -> list[InteractionEvent]:
    return [
        InteractionEvent(
            request_id=str(uuid.uuid4()),
            route="assistant",
            unit_id=f"user-{i % 5000}",
            unit_source="header",
            role="primary",
            mode="ab",
            endpoint="chat",
            model="qwen2.5-7b",
            upstream="vllm-candidate",
            status="ok",
            http_status=200,
            latency_ms=412.5,
            experiment_id=3,
            experiment="assistant-v2",
            variant="candidate",
            ttft_ms=38.2,
            prompt_tokens=210,
            completion_tokens=148,
            response_chars=690,
            finish_reason="stop",
            stream=True,
            tags={"task": "code", "lang": "en"},
        )
        for i in range(n)
    ]


def background_cpu() -> float:
    """CPU seconds of every thread but the main one (Linux schedstat: nanosecond run time)."""
    main = threading.main_thread().native_id
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == main:
            continue
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9


def median_us(fn: Callable[[], float], runs: int) -> float:
    return statistics.median(fn() for _ in range(runs)) * 1e6


def bench_emit(events: list[InteractionEvent]) -> float:
    sink = KafkaSink("127.0.0.1:1", Path(tempfile.mkdtemp()), config=SinkConfig(hard_max_queue=10**9))
    emit = sink.emit
    started = time.perf_counter()
    for ev in events:
        emit(ev)
    return (time.perf_counter() - started) / len(events)


def bench_encode(events: list[InteractionEvent]) -> float:
    started = time.process_time()
    for ev in events:
        encode(ev)
    return (time.process_time() - started) / len(events)


def bench_spool(events: list[InteractionEvent], batch: int = 5000, fsync: bool = False) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        spool = Spool(Path(tmp))
        started = time.process_time()
        for i in range(0, len(events), batch):
            spool.append([("liftgate.interactions", e.key, encode(e)) for e in events[i : i + batch]])
            if fsync:
                spool.sync()
        cpu = time.process_time() - started
        spool.close()
    return cpu / len(events)


async def bench_background(
    bootstrap: str,
    events: list[InteractionEvent],
    config: SinkConfig,
    client: ClientChoice,
    options: dict[str, Any],
    rate: float | None,
) -> float:
    """CPU of the sink's threads and the Kafka client's own threads per delivered event."""
    name = f"sinkbench-{uuid.uuid4().hex[:8]}"
    topics = Topics(interactions=f"{name}.i", feedback=f"{name}.f")
    ensure_topics(bootstrap, 6, topics)
    with tempfile.TemporaryDirectory() as tmp:
        sink = KafkaSink(
            bootstrap, Path(tmp), topics=topics, config=config, bus=open_bus(client), producer_options=options
        )
        await sink.start()
        for _ in range(200):  # connected and live, before measuring
            if sink.live:
                break
            await asyncio.sleep(0.05)
        cpu0 = background_cpu()
        if rate is None:
            for ev in events:
                sink.emit(ev)
        else:
            per_tick = max(1, int(rate / 1000))
            for i in range(0, len(events), per_tick):
                for ev in events[i : i + per_tick]:
                    sink.emit(ev)
                await asyncio.sleep(0.001)
        deadline = time.monotonic() + 120
        while sink.stats()["delivered"] < len(events) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        cpu = background_cpu() - cpu0
        delivered = sink.stats()["delivered"]
        await sink.close()
    assert delivered == len(events), f"only {delivered} of {len(events)} delivered"
    return cpu / len(events)


async def loop_lag(bootstrap: str | None, events: list[InteractionEvent], rate: float) -> list[float]:
    """Overshoot (ms) of 1 ms timers on the emitting loop while the sink delivers ``rate`` events/s.

    The sink's thread and kafka-python's thread share the GIL with the gateway's event loop;
    this shows what that costs the loop. ``bootstrap=None`` measures the loop alone.
    """
    sink = None
    tmp = tempfile.TemporaryDirectory()
    if bootstrap is not None:
        name = f"sinkbench-{uuid.uuid4().hex[:8]}"
        topics = Topics(interactions=f"{name}.i", feedback=f"{name}.f")
        ensure_topics(bootstrap, 6, topics)
        sink = KafkaSink(bootstrap, Path(tmp.name), topics=topics)
        await sink.start()
        for _ in range(200):
            if sink.live:
                break
            await asyncio.sleep(0.05)
    lags: list[float] = []
    per_tick = max(1, int(rate / 1000))
    index = 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        for ev in events[index : index + per_tick]:
            if sink is not None:
                sink.emit(ev)
        index = (index + per_tick) % max(len(events) - per_tick, 1)
        before = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - before - 0.001) * 1000)
    if sink is not None:
        await sink.close()
    tmp.cleanup()
    return lags


def _quantiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49]:6.3f} ms  p99 {q[98]:6.3f} ms  max {max(values):6.3f} ms"


# (label, sink config, client, producer options as that client names them)
VARIANTS: list[tuple[str, SinkConfig, ClientChoice, dict[str, Any]]] = [
    ("confluent, default (batch 5000, linger 2 ms)", SinkConfig(), "confluent", {}),
    ("confluent, batch_max 500", SinkConfig(batch_max=500), "confluent", {}),
    ("confluent, linger 0 ms", SinkConfig(linger_ms=0), "confluent", {}),
    ("python, default (batch 5000, linger 2 ms)", SinkConfig(), "python", {}),
    ("python, batch_max 500", SinkConfig(batch_max=500), "python", {}),
    ("python, idempotent, 1 in flight", SinkConfig(), "python", {"max_in_flight_requests_per_connection": 1}),
]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=5_000.0, help="events/s of the paced run")
    args = parser.parse_args()
    events = make_events(args.events)
    print(f"events per run: {args.events}, runs: {args.runs}, threads: {threading.active_count()}")
    print(f"emit (caller thread, wall)    {median_us(lambda: bench_emit(events), args.runs):8.3f} µs/event")
    print(f"encode (orjson)               {median_us(lambda: bench_encode(events), args.runs):8.3f} µs/event")
    print(f"spool write (encode+write)    {median_us(lambda: bench_spool(events), args.runs):8.3f} µs/event")
    print(
        f"spool write + fsync per batch {median_us(lambda: bench_spool(events, fsync=True), args.runs):8.3f} µs/event"
    )
    for label, config, client, options in VARIANTS:
        burst = [
            await bench_background(args.bootstrap, events, config, client, options, None)
            for _ in range(args.runs)
        ]
        print(f"background, burst, {label:46s} {statistics.median(burst) * 1e6:8.2f} µs/event")
    print(
        f"event-loop timer overshoot, no sink:          {_quantiles(await loop_lag(None, events, args.rate))}"
    )
    lags = await loop_lag(args.bootstrap, events, args.rate)
    print(f"event-loop timer overshoot, sink at {args.rate:.0f} ev/s: {_quantiles(lags)}")
    for rate, client in (
        (1_000.0, "confluent"),
        (args.rate, "confluent"),
        (1_000.0, "python"),
        (args.rate, "python"),
    ):
        paced_events = events[: int(rate * 4)]  # four seconds at the paced rate
        paced = [
            await bench_background(args.bootstrap, paced_events, SinkConfig(), client, {}, rate)  # type: ignore[arg-type]
            for _ in range(args.runs)
        ]
        label = f"paced {rate:.0f} events/s, {client}, default config"
        print(f"background, {label:52s} {statistics.median(paced) * 1e6:8.2f} µs/event")


if __name__ == "__main__":
    asyncio.run(main())
