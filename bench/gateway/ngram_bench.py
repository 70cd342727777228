"""CPU cost of the hashed n-gram sampler (content logging ``hashed``, ``gateway.ngrams``).

Part 1, in isolation (one process, interleaved rounds, medians): ``NgramKey.hashes`` on answers
of 50, 120 and 220 words and on a long answer cut at 4,000 characters; the same 220-word
answer with HMAC-SHA-256 instead of keyed BLAKE2b (the alternative); and what it costs per
request averaged at sample rates 1 % and 5 % (the draw plus the rate times a 220-word answer).

Part 1b, on an event loop (one process, interleaved rounds, medians): the CPU of hashing the
220-word and the long answer in loop steps (``gateway.ngrams.hashes``, as the sampler does)
against in one go; the longest event-loop stall while the long answer is hashed, seen by a
probe task that yields in a loop (in one go vs in steps); and the request path's share, one
``NgramSampler.offer``.

Part 2, end to end: three real gateways (``bench.gateway.serve`` subprocesses, null sink,
content logging ``hashed``) in front of one simulator model answering ~220 tokens: n-grams
off, at the default rate 1 %, and at 100 %. Rounds alternate between them at concurrency 1
and 32; each gateway's CPU time (user + system, from /proc) per request is recorded per round.
Prints the per-round figures, their medians and the load average.

  python -m bench.gateway.ngram_bench [--rounds 5] [--requests 600] [--calls 2000] [--no-end-to-end]
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import random
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp

from bench.gateway.serve import BENCH_KEY, free_port
from contracts.ngrams import NgramKey, grams
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

_TICK = os.sysconf("SC_CLK_TCK")
BODY = {"model": "fake", "messages": [{"role": "user", "content": "Explain the steps."}], "max_tokens": 400}


def _answer(rng: random.Random, words: int) -> str:
    """English-like: 2,000 distinct words of 2–9 letters, a sentence every ~12 words."""
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    vocab = ["".join(rng.choice(letters[:18]) for _ in range(rng.randint(2, 9))) for _ in range(2000)]
    out = [rng.choice(vocab) + ("." if rng.random() < 0.08 else "") for _ in range(words)]
    return "Great question! " + " ".join(out)


def isolation(calls: int, rounds: int) -> None:
    key = NgramKey(secrets.token_urlsafe(24))
    raw = secrets.token_bytes(32)
    rng = random.Random(1)
    texts = {n: _answer(rng, n) for n in (50, 120, 220, 2000)}

    def hmac_hashes(text: str) -> list[int]:
        return sorted(
            {
                int.from_bytes(hmac.digest(raw, g.encode(), "sha256")[:8], "big", signed=True)
                for g in grams(text)
            }
        )

    draw = random.random
    cases: dict[str, tuple[Callable[[], object], int]] = {
        "50 words": (lambda: key.hashes(texts[50]), calls),
        "120 words": (lambda: key.hashes(texts[120]), calls),
        "220 words": (lambda: key.hashes(texts[220]), calls),
        "long answer (cut at 4,000 chars)": (lambda: key.hashes(texts[2000]), calls // 4),
        "220 words, HMAC-SHA-256": (lambda: hmac_hashes(texts[220]), calls),
        "220 words, tokenising only": (lambda: grams(texts[220]), calls),
        "sample draw (rng < rate)": (lambda: draw() < 0.01, calls * 50),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (fn, n) in cases.items():
            t0 = time.process_time()
            for _ in range(n):
                fn()
            samples[name].append((time.process_time() - t0) / n * 1e6)
    print(f"{'case':34} {'median µs':>10} {'min µs':>9}   grams")
    for name, values in samples.items():
        size = {"50": 50, "120": 120, "220": 220, "long": 2000}.get(name.split()[0])
        count = len(grams(texts[size])) if size and "only" not in name and "HMAC" not in name else ""
        print(f"{name:34} {statistics.median(values):10.2f} {min(values):9.2f}   {count}")
    per = statistics.median(samples["220 words"])
    d = statistics.median(samples["sample draw (rng < rate)"])
    for rate in (0.01, 0.05):
        print(f"averaged per request at rate {rate:.0%} (220-word answers): {d + rate * per:.2f} µs")


def on_loop(calls: int, rounds: int) -> None:
    from prometheus_client import CollectorRegistry

    from gateway.ngrams import NgramConfig, NgramJob, NgramSampler, hashes
    from gateway.null_sink import NullSink
    from gateway.recorder import Recorder
    from gateway.telemetry import GatewayMetrics

    key = NgramKey(secrets.token_urlsafe(24))
    rng = random.Random(1)
    texts = {n: _answer(rng, n) for n in (220, 2000)}
    metrics = GatewayMetrics(CollectorRegistry())
    recorder = Recorder(NullSink(), metrics)

    async def stepped(text: str, n: int) -> float:
        t0 = time.process_time()
        for _ in range(n):
            await hashes(key, text)
        return (time.process_time() - t0) / n * 1e6

    async def whole(text: str, n: int) -> float:
        t0 = time.process_time()
        for _ in range(n):
            key.hashes(text)
            await asyncio.sleep(0)
        return (time.process_time() - t0) / n * 1e6

    async def stall(job: Callable[[], Awaitable[object]]) -> float:
        done, longest = False, 0.0

        async def probe() -> None:
            nonlocal longest
            while not done:
                t0 = time.perf_counter()
                await asyncio.sleep(0)
                longest = max(longest, time.perf_counter() - t0)

        task = asyncio.create_task(probe())
        await asyncio.sleep(0)
        await job()
        done = True
        await task
        return longest * 1e6

    async def in_one_go() -> None:
        key.hashes(texts[2000])

    async def offer(n: int) -> float:
        sampler = NgramSampler(NgramConfig(key, 1.0, n + 1, 10**9), recorder, metrics)
        jobs = [NgramJob(f"r{i}", "u", 1, "exp", "route", "cand", None, texts[220]) for i in range(n)]
        t0 = time.process_time()
        for job in jobs:
            sampler.offer(job)
        return (time.process_time() - t0) / n * 1e6

    async def one_round() -> dict[str, float]:
        return {
            "220 words, in one go": await whole(texts[220], calls),
            "220 words, in loop steps": await stepped(texts[220], calls),
            "long answer, in one go": await whole(texts[2000], calls // 4),
            "long answer, in loop steps": await stepped(texts[2000], calls // 4),
            "longest loop stall, long answer in one go": await stall(in_one_go),
            "longest loop stall, long answer in steps": await stall(lambda: hashes(key, texts[2000])),
            "offer to the sampler (request path)": await offer(calls * 10),
        }

    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, value in asyncio.run(one_round()).items():
            samples.setdefault(name, []).append(value)
    print(f"\n{'on an event loop':42} {'median µs':>10} {'min µs':>9}")
    for name, values in samples.items():
        print(f"{name:42} {statistics.median(values):10.2f} {min(values):9.2f}")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def _load(url: str, requests: int, concurrency: int) -> None:
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem, session.post(url + "/v1/chat/completions", json={**BODY, "user": f"u{i}"}) as r:
                await r.read()
                assert r.status == 200, r.status

        await asyncio.gather(*(one(i) for i in range(requests)))


def end_to_end(rounds: int, requests: int) -> None:
    import socket
    import subprocess
    import sys

    models = [SimulatorModel("fake", latency_ms=1.0, latency_sd=0.1, ttft_ms=0.5, ttft_sd=0.1, tokens=220.0)]
    setups = {"n-grams off": 0.0, "n-grams 1 %": 0.01, "n-grams 100 %": 1.0}
    with SimulatorProcess(models) as sim:
        procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        try:
            for name, rate in setups.items():
                port = free_port()
                cmd = [sys.executable, "-m", "bench.gateway.serve", "--port", str(port), "--upstream",
                       sim.url + "/v1", "--content-logging", "hashed", "--ngram-rate", str(rate)]  # fmt: skip
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + 30
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise RuntimeError("gateway did not start") from None
                        time.sleep(0.05)
                procs[name] = (proc, f"http://127.0.0.1:{port}")
            for _, url in procs.values():
                asyncio.run(_load(url, 200, 8))  # warm-up
            results: dict[tuple[str, int], list[float]] = {}
            for _ in range(rounds):
                for conc in (1, 32):
                    for name, (proc, url) in procs.items():
                        c0 = _cpu(proc.pid)
                        asyncio.run(_load(url, requests, conc))
                        per = (_cpu(proc.pid) - c0) / requests * 1e6
                        results.setdefault((name, conc), []).append(per)
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(timeout=10)
    print(f"\n{'gateway':16} {'c':>3} {'median CPU µs/req':>18}   per round")
    for (name, conc), values in results.items():
        print(
            f"{name:16} {conc:3d} {statistics.median(values):18.0f}   {' '.join(f'{v:.0f}' for v in values)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--no-end-to-end", action="store_true")
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    isolation(a.calls, a.rounds)
    on_loop(a.calls, a.rounds)
    if not a.no_end_to_end:
        end_to_end(a.rounds, a.requests)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
