"""What folding the RL-risk rollup (``rl_rollups``) costs the ingest write path.

No Kafka: N interaction events (the generator of ``bench_ingest.py``: a task category on
each) are written in batches through ``analytics.ingest.write.ingest_raw`` on one
connection, runs interleaved *with* the RL-risk fold (``analytics.ingest.rollups.RL_FOLD``)
and *without* it (the statement replaced by ``SELECT 1``), so load drifts hit both alike.
Prints the median events/s of each, their ratio, the rollup rows and the load average.

    .venv/bin/python bench/ingest/bench_rl_fold.py --events 200000 --runs 3
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

from analytics.ingest import rollups, write
from contracts.events import encode

_REAL = rollups.RL_FOLD


def run(url: str, events: list[Any], batch: int, with_fold: bool) -> tuple[float, int]:
    """Events per second of one pass over ``events``, and the rollup rows written."""
    rollups.RL_FOLD = _REAL if with_fold else b"SELECT 1"  # type: ignore[misc]
    n = len(events)
    with psycopg.connect(url) as pg:
        pg.execute(b"TRUNCATE interactions, unit_rollups, segment_rollups, rl_rollups, latency_histograms")
        pg.commit()
        raws = [write.Raw(encode(e), "bench", 0, i, e.key, e) for i, e in enumerate(events)]
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            write.ingest_raw(pg, raws[i : i + batch], ())
        total = time.perf_counter() - t0
        rows = int(pg.execute(b"SELECT count(*) FROM rl_rollups").fetchone()[0])  # type: ignore[index]
    return n / total, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    add_write_args(ap)
    args = ap.parse_args()
    with scratch_database(args.admin_url, "lg_bench_rl_fold") as url:
        events = make_events(args.events, args.units)
        rates: dict[bool, list[float]] = {True: [], False: []}
        rows = 0
        load = [os.getloadavg()[0]]
        for _ in range(args.runs):
            for with_fold in (True, False):
                rate, n_rows = run(url, events, args.batch, with_fold)
                rates[with_fold].append(rate)
                rows = max(rows, n_rows)
                load.append(os.getloadavg()[0])
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"events {args.events:,} × {args.runs} runs each, batches of {args.batch:,}")
        print(f"with the RL fold:    {on:,.0f} ev/s (runs {', '.join(f'{r:,.0f}' for r in rates[True])})")
        print(f"without the RL fold: {off:,.0f} ev/s (runs {', '.join(f'{r:,.0f}' for r in rates[False])})")
        print(f"ratio with/without: {on / off:.3f}; rl_rollups rows {rows:,}")
        print(f"load average 1 min {min(load):.1f}–{max(load):.1f}", flush=True)


if __name__ == "__main__":
    main()
