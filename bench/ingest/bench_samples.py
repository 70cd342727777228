"""What folding request-level latency samples costs the ingest write path.

No Kafka: N interaction events (the generator of ``bench_ingest.py``) are written in batches
through ``analytics.ingest.write.ingest_raw`` on one connection, runs interleaved *with*
the samples fold (``analytics.ingest.samples.fold``: the bounded per-variant reservoir the
``mann_whitney`` guardrail reads) and *without* it (the fold replaced by a no-op), so load
drifts hit both alike. Prints the median events/s of each, their ratio, the fold's own
share of the time, the rows kept in ``latency_samples`` and the load average.

    .venv/bin/python bench/ingest/bench_samples.py --events 200000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import add_write_args, make_events, scratch_database

from analytics.ingest import samples, write
from contracts.events import encode

FOLD_S: list[float] = []
_real_fold = samples.fold


def _timed_fold(pg: psycopg.Connection[Any], statement: str) -> None:
    t = time.perf_counter()
    _real_fold(pg, statement)
    FOLD_S[-1] += time.perf_counter() - t


def _no_fold(pg: psycopg.Connection[Any], statement: str) -> None:
    return None


def run(url: str, events: list[Any], batch: int, with_samples: bool) -> tuple[float, int]:
    """Events per second of one pass over ``events``, and the sample rows kept."""
    samples.fold = _timed_fold if with_samples else _no_fold  # type: ignore[assignment]
    FOLD_S.append(0.0)
    n = len(events)
    with psycopg.connect(url) as pg:
        pg.execute(
            b"TRUNCATE interactions, unit_rollups, segment_rollups, latency_histograms, latency_samples"
        )
        pg.commit()
        raws = [write.Raw(encode(e), "bench", 0, i, e.key, e) for i, e in enumerate(events)]
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            write.ingest_raw(pg, raws[i : i + batch], ())
        total = time.perf_counter() - t0
        kept = int(pg.execute(b"SELECT count(*) FROM latency_samples").fetchone()[0])  # type: ignore[index]
    return n / total, kept


def main() -> None:
    ap = argparse.ArgumentParser()
    add_write_args(ap)
    args = ap.parse_args()
    with scratch_database(args.admin_url, "lg_bench_samples") as url:
        events = make_events(args.events, args.units)
        rates: dict[bool, list[float]] = {True: [], False: []}
        fold_share: list[float] = []
        kept = 0
        load = [os.getloadavg()[0]]
        for _ in range(args.runs):
            for with_samples in (True, False):
                rate, rows = run(url, events, args.batch, with_samples)
                rates[with_samples].append(rate)
                if with_samples:
                    kept = rows
                    fold_share.append(FOLD_S[-1] * rate / len(events))
                load.append(os.getloadavg()[0])
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"events {args.events:,} × {args.runs} runs each, batches of {args.batch:,}")
        print(f"with samples:    {on:,.0f} ev/s (runs {', '.join(f'{r:,.0f}' for r in rates[True])})")
        print(f"without samples: {off:,.0f} ev/s (runs {', '.join(f'{r:,.0f}' for r in rates[False])})")
        print(
            f"ratio with/without: {on / off:.3f}; fold share of the write time {statistics.median(fold_share):.1%}"
        )
        print(f"latency_samples rows kept: {kept:,}; load average 1 min {min(load):.1f}–{max(load):.1f}")


if __name__ == "__main__":
    main()
