"""What one fold statement costs the ingest write path: with it vs without it.

No Kafka: N interaction events (the generator of ``bench_ingest.py``: a task tag and
category on each) are written in batches through ``analytics.ingest.write.ingest_raw`` on
one connection, runs interleaved *with* the statement and *without* it (replaced by
``SELECT 1``), so load drifts hit both alike. ``--fold`` names the statement of
``analytics.ingest.rollups``: ``rl`` (``RL_FOLD``, the RL-risk rollup ``rl_rollups``) or
``samples`` (``SAMPLES``, the latency reservoir ``latency_samples`` the ``mann_whitney``
guardrail reads). Prints the median events/s of each, their ratio, the rows the statement
keeps and the load average.

    .venv/bin/python bench/ingest/bench_fold.py --fold rl --events 200000 --runs 3
    .venv/bin/python bench/ingest/bench_fold.py --fold samples --events 200000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import TABLES, add_write_args, make_events, scratch_database, write_pass

from analytics.ingest import rollups

#: --fold: (the statement's name in analytics.ingest.rollups, the table it writes)
FOLDS = {"rl": ("RL_FOLD", "rl_rollups"), "samples": ("SAMPLES", "latency_samples")}


def run(url: str, events: list[Any], batch: int, fold: str, real: bytes, on: bool) -> tuple[float, int]:
    """Events per second of one pass over ``events``, and the rows the fold's table holds."""
    name, table = FOLDS[fold]
    setattr(rollups, name, real if on else b"SELECT 1")
    with psycopg.connect(url) as pg:
        total = write_pass(pg, events, batch, TABLES)
        rows = int(pg.execute(f"SELECT count(*) FROM {table}".encode()).fetchone()[0])  # type: ignore[index]
    return len(events) / total, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    add_write_args(ap)
    ap.add_argument("--fold", choices=sorted(FOLDS), required=True)
    args = ap.parse_args()
    real: bytes = getattr(rollups, FOLDS[args.fold][0])
    with scratch_database(args.admin_url, f"lg_bench_fold_{args.fold}") as url:
        events = make_events(args.events, args.units)
        rates: dict[bool, list[float]] = {True: [], False: []}
        rows = 0
        load = [os.getloadavg()[0]]
        for _ in range(args.runs):
            for on in (True, False):
                rate, n_rows = run(url, events, args.batch, args.fold, real, on)
                rates[on].append(rate)
                rows = max(rows, n_rows)
                load.append(os.getloadavg()[0])
        with_, without = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"events {args.events:,} × {args.runs} runs each, batches of {args.batch:,}; fold {args.fold}")
        print(f"with the fold:    {with_:,.0f} ev/s (runs {', '.join(f'{r:,.0f}' for r in rates[True])})")
        print(f"without the fold: {without:,.0f} ev/s (runs {', '.join(f'{r:,.0f}' for r in rates[False])})")
        print(f"ratio with/without: {with_ / without:.3f}; {FOLDS[args.fold][1]} rows {rows:,}")
        print(f"load average 1 min {min(load):.1f}–{max(load):.1f}", flush=True)


if __name__ == "__main__":
    main()
