"""Judge sampler isolation: what users wait for when every response goes to a 2 s judge.

Two real gateways (``bench.gateway.serve`` subprocesses, null sink) in front of the same
simulator model (``fake``, ~20 ms): one without a judge, one judging 100 % of primary
responses with a simulated judge that takes 2 s per score (queue 1,000, 4 workers: it
saturates at once and the rest is dropped and counted, as designed). Rounds alternate
between the two; each round sends ``--requests`` chat completions, ``--concurrency`` at a
time, and records the user-facing latency. Prints per-round p50s, their medians and the
ratio judge/no-judge (target ≤ 1.10).

  python -m bench.gateway.judge_bench [--rounds 6] [--requests 400] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time

import aiohttp

from bench.gateway.serve import BENCH_KEY, free_port
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

BODY = {
    "model": "fake",
    "messages": [{"role": "user", "content": "Write a Python function."}],
    "max_tokens": 32,
}


def start_gateway(upstream: str, judge: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "bench.gateway.serve", "--port", str(port), "--upstream", upstream]
    if judge is not None:
        cmd += ["--judge-url", judge, "--judge-model", "slowjudge", "--judge-rate", "1.0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("gateway did not start")


async def round_p50(url: str, requests: int, concurrency: int) -> float:
    times: list[float] = []
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                t0 = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", json={**BODY, "user": f"u{i}"}) as r:
                    await r.read()
                    assert r.status == 200, r.status
                times.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(i) for i in range(requests)))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args()
    models = [
        SimulatorModel("fake", latency_ms=20.0, latency_sd=2.0, tokens=32.0),
        SimulatorModel("slowjudge", judge=True, latency_ms=2000.0, latency_sd=1.0),
    ]
    with SimulatorProcess(models) as sim:
        base = sim.url + "/v1"
        plain, plain_url = start_gateway(base, None)
        judged, judged_url = start_gateway(base, base)
        try:
            p50s: dict[str, list[float]] = {"no judge": [], "judge 100%, 2 s": []}
            asyncio.run(round_p50(plain_url, 50, a.concurrency))  # warm-up
            asyncio.run(round_p50(judged_url, 50, a.concurrency))
            for _ in range(a.rounds):
                p50s["no judge"].append(asyncio.run(round_p50(plain_url, a.requests, a.concurrency)))
                p50s["judge 100%, 2 s"].append(asyncio.run(round_p50(judged_url, a.requests, a.concurrency)))
        finally:
            for p in (plain, judged):
                p.terminate()
                p.wait(timeout=10)
    for name, values in p50s.items():
        print(f"{name:18} p50 per round (ms): {' '.join(f'{v * 1000:.1f}' for v in values)}")
    m0, m1 = statistics.median(p50s["no judge"]), statistics.median(p50s["judge 100%, 2 s"])
    ratios = [b / c for b, c in zip(p50s["judge 100%, 2 s"], p50s["no judge"], strict=True)]
    print(f"median p50: no judge {m0 * 1000:.1f} ms, judge {m1 * 1000:.1f} ms, ratio {m1 / m0:.3f}")
    print(
        f"per-round ratios: {' '.join(f'{r:.3f}' for r in ratios)} (median {statistics.median(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
