"""The consumer's feedback sweep: full vs incremental (no Kafka).

Feedback on traffic outside experiments stays unattributed for ever. This stores N such
feedback rows (ingested two days ago, with their non-experiment interactions) and 3·N
experiment interactions, then times ``attribute_pending`` over everything (a process's
first sweep) and over the last hour (every later sweep), alternated, median of 5.

    .venv/bin/python bench/ingest/bench_sweep.py --feedback 1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import ADMIN_URL, scratch_database

from analytics.ingest import write

_ROW = "'u' || (g % 1000), 'header', 'primary', '{mode}', 'chat', 'm', 'u', 'ok', 200, 10, 5, false, false, '{{}}'"
_COLS = (
    "event_id, ts, request_id, route, {exp}unit_id, unit_source, role, mode, endpoint, model, upstream, status,"
    " http_status, latency_ms, response_chars, stream, fallback, tags"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--feedback", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = args.feedback
    with scratch_database(args.admin_url, "lg_bench_sweep") as url, psycopg.connect(url) as pg:
        cols_exp = _COLS.format(exp="experiment_id, variant, ")
        pg.execute(
            f"INSERT INTO interactions ({cols_exp}) SELECT gen_random_uuid(), now(), 'x' || g, 'a', 1, 'control',"
            f" {_ROW.format(mode='ab')} FROM generate_series(1, {3 * n}) g".encode()
        )
        pg.execute(
            f"INSERT INTO interactions ({_COLS.format(exp='')}) SELECT gen_random_uuid(), now(), 'r' || g, 'a',"
            f" {_ROW.format(mode='none')} FROM generate_series(1, {n}) g".encode()
        )
        pg.execute(
            b"INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, tags, ingested_at)"
            b" SELECT gen_random_uuid(), now(), 'r' || g, 'u', 'thumbs_up', 1, '{}', now() - interval '2 days'"
            b" FROM generate_series(1, %s) g",
            (n,),
        )
        pg.commit()
        pg.autocommit = True
        pg.execute(b"VACUUM ANALYZE")
        pg.autocommit = False
        full, recent = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            sweep = write.attribute_pending(pg)
            full.append(time.perf_counter() - t)
            t = time.perf_counter()
            write.attribute_pending(pg, since=sweep.started - timedelta(hours=1))
            recent.append(time.perf_counter() - t)
        print(
            f"{n:,} unattributed feedback, {3 * n:,} experiment interactions: full sweep"
            f" {statistics.median(full) * 1e3:.1f} ms, incremental (last hour) {statistics.median(recent) * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
