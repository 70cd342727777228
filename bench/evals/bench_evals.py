"""Benchmark the offline evals: runner throughput, cached reruns, the code sandbox's cost.

    .venv/bin/python bench/evals/bench_evals.py --admin-url postgresql://postgres@127.0.0.1:15432/postgres

1. **runner throughput** — the built-in math, json and instruction-following suites
   replicated to ``--items`` items (new ids, so new cache keys), run against one simulated
   model (``--latency-ms``, skills set, so its answers are scorable) at ``--concurrency``:
   items per second, calls + scoring + result writes included;
2. **cached rerun** — the same dataset for a second experiment on the same upstream and
   model: every output and verifiable score comes from the cache (no call), results are
   written for the new run; and the same command again (the completed run is reused);
3. **sandbox cost** — ``--sandbox-runs`` sequential runs of the code suite's reference
   solutions (median and p90 ms per item), then the code suite with two workers.

A scratch database (``liftgate_bench_evals``) is created, migrated and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
from sqlalchemy import create_engine, insert

from contracts.tables import Experiment, Upstream, Variant
from evals import store
from evals.datasets import load_dataset
from evals.datasets.builtin import builtin_suite
from evals.datasets.loaders import Dataset
from evals.runner import RunnerSettings, RunSummary, run_experiment
from evals.scorers import score
from liftgate import db as dbmod
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

DB = "liftgate_bench_evals"
SKILLS = "math:0.8/json:0.8/instruction_following:0.8/code:0.8"


def _dataset(n: int) -> Dataset:
    base = [
        *load_dataset("math").items,
        *load_dataset("json").items,
        *load_dataset("instruction_following").items,
    ]
    items = [b.model_copy(update={"id": f"{b.id}-r{i // len(base)}"}) for i, b in
             ((i, base[i % len(base)]) for i in range(n))]  # fmt: skip
    return Dataset(f"bench-{n}", "bench", tuple(items))


def _experiment(engine: object, name: str, url: str) -> store.ExperimentInfo:
    with engine.begin() as conn:  # type: ignore[attr-defined]
        eid = conn.execute(
            insert(Experiment).values(name=name, route=name, mode="ab", salt="s").returning(Experiment.id)
        ).scalar_one()
        uid = conn.execute(
            insert(Upstream).values(name=name, base_url=url).returning(Upstream.id)
        ).scalar_one()
        conn.execute(insert(Variant).values(experiment_id=eid, name="baseline", upstream_id=uid, model="m",
                                            is_control=True, weight=100))  # fmt: skip
        return store.experiment(conn, name)


def _run(
    engine: object, data: Dataset, exp: store.ExperimentInfo, concurrency: int
) -> tuple[float, RunSummary]:
    settings = RunnerSettings(concurrency=concurrency)
    started = time.perf_counter()
    (summary,) = asyncio.run(run_experiment(engine, data, exp.targets, settings, experiment_id=exp.id))  # type: ignore[arg-type]
    return time.perf_counter() - started, summary


def bench_runner(admin_url: str, items: int, concurrency: int, latency_ms: float) -> None:
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    url = f"{base}/{DB}"
    dbmod.upgrade(url)
    engine = create_engine(url, pool_size=5, max_overflow=10)
    model = SimulatorModel(name="m", latency_ms=latency_ms, latency_sd=latency_ms / 4, ttft_ms=1, ttft_sd=0,
                           skills=SKILLS, seed=3)  # fmt: skip
    try:
        with SimulatorProcess([model]) as sim:
            data = _dataset(items)
            data.fingerprint()
            first = _experiment(engine, "bench-first", sim.url + "/v1")
            cold, s1 = _run(engine, data, first, concurrency)
            print(f"runner, {items} non-code items, concurrency {concurrency}, simulator {latency_ms:g} ms: "
                  f"{cold:.2f} s = {items / cold:.0f} items/s (called {s1.called}, {s1.errors} errors, "
                  f"{s1.passed} passed); floor set by latency: {concurrency * 1000 / latency_ms:.0f} items/s")  # fmt: skip
            second = _experiment(engine, "bench-second", sim.url + "/v1")
            warm, s2 = _run(engine, data, second, concurrency)
            print(f"cached rerun (new run, every output from the cache): {warm:.2f} s "
                  f"(called {s2.called}, cached {s2.cached})")  # fmt: skip
            reuse, s3 = _run(engine, data, second, concurrency)
            print(f"same command again (completed run reused): {reuse:.2f} s (reused={s3.reused})")
    finally:
        engine.dispose()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def bench_sandbox(runs: int) -> None:
    suite = builtin_suite("code")
    score(suite[0].item, suite[0].item.reference or "")  # warm: bytecode written, imports done
    times = []
    for i in range(runs):
        b = suite[i % len(suite)]
        started = time.perf_counter()
        assert score(b.item, b.item.reference or "").passed
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    print(f"sandboxed code scorer, {runs} sequential items (3–5 tests each): median {statistics.median(times):.1f} ms, "
          f"p90 {times[int(0.9 * len(times))]:.1f} ms, min {times[0]:.1f} ms")  # fmt: skip
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        passed = sum(pool.map(lambda b: score(b.item, b.item.reference or "").passed, suite))
    elapsed = time.perf_counter() - started
    print(f"code suite ({len(suite)} items, 2 workers): {elapsed:.2f} s = {len(suite) / elapsed:.1f} items/s "
          f"({passed} passed)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--admin-url", default=os.environ.get("LIFTGATE_TEST_PG_ADMIN_URL",
                                                             "postgresql://postgres@127.0.0.1:15432/postgres"))  # fmt: skip
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--sandbox-runs", type=int, default=100)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    bench_sandbox(args.sandbox_runs)
    bench_runner(args.admin_url, args.items, args.concurrency, args.latency_ms)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
