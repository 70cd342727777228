"""CPU per request of the model simulator (so benchmarks know how much of a core it takes).

    .venv/bin/python bench/liftgate/simulator_bench.py [--requests 5000] [--concurrency 32] [--runs 3]

Starts one simulator child process with a zero-latency model, drives it with aiohttp at the
given concurrency and reports the child's CPU per request (median of runs) and throughput,
for non-streamed chat, streamed chat (120 tokens, 4 per chunk = 30 chunks) and embeddings.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import aiohttp
import psutil

from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat, JSON": ("/v1/chat/completions", {"stream": False}),
    "chat, SSE (30 chunks)": ("/v1/chat/completions", {"stream": True}),
    "embeddings": ("/v1/embeddings", {"input": "a short text to embed"}),
}


async def drive(url: str, path: str, extra: dict[str, Any], requests: int, concurrency: int) -> float:
    body = {"model": "zero", "messages": [{"role": "user", "content": "hello"}], **extra}
    counter = iter(range(requests))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            for i in counter:
                body["messages"][0]["content"] = f"hello {i}"  # distinct prompts, distinct answers
                async with session.post(url + path, json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    model = SimulatorModel(
        name="zero", latency_ms=0, latency_sd=0, ttft_ms=0, ttft_sd=0, tokens=120, tokens_sd=0
    )
    with SimulatorProcess([model]) as sim:
        assert sim.pid is not None
        proc = psutil.Process(sim.pid)
        await drive(sim.url, "/v1/chat/completions", {}, 500, args.concurrency)  # warm up
        for label, (path, extra) in CASES.items():
            cpu, rates = [], []
            for _ in range(args.runs):
                before = proc.cpu_times()
                wall = await drive(sim.url, path, extra, args.requests, args.concurrency)
                after = proc.cpu_times()
                used = (after.user + after.system) - (before.user + before.system)
                cpu.append(used / args.requests)
                rates.append(args.requests / wall)
            print(
                f"{label:24s} simulator CPU {statistics.median(cpu) * 1e6:7.1f} µs/request, "
                f"{statistics.median(rates):7.0f} requests/s (client on the same machine)"
            )


if __name__ == "__main__":
    asyncio.run(main())
