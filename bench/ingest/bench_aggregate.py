"""Time ``variant_stats`` (all built-in metrics, one SQL pass) on 1M units' rollups.

Creates a scratch database, migrates it, fills ``unit_rollups`` with generate_series
(1M units in segment '' plus two tag segments of 1M units together), ANALYZEs, then
times ``variant_stats`` (and with the CUPED covariate) a few times; prints medians.

    .venv/bin/python bench/ingest/bench_aggregate.py --admin-url postgresql://postgres@127.0.0.1:15432/postgres
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import psycopg

from analytics.report.aggregate import segments, unit_counts, variant_stats
from analytics.report.catalogue import BUILTINS
from liftgate import db as dbmod

FILL = """
INSERT INTO {table} (experiment_id, {segcol}variant, unit_id, first_ts, last_ts, requests, errors,
    fallbacks, latency_sum, ttft_n, ttft_sum, prompt_tokens, completion_tokens, response_chars,
    conversations, turns, thumbs_up, thumbs_down, ratings_n, ratings_sum, regenerates, copies, edits,
    continued, task_success_n, task_success_sum)
SELECT 1, {segval}CASE WHEN g %% 2 = 0 THEN 'control' ELSE 'candidate' END, 'u' || g, now(), now(),
    q, floor(q * random() * 0.05), 0, q * (400 + 100 * random()), q, q * 150, q * 300, q * 200,
    q * 800, 1 + floor(q / 4), q, floor(q * random() * 0.3), floor(q * random() * 0.1),
    floor(q * random() * 0.2), floor(q * random() * 0.2) * 4, floor(q * random() * 0.1),
    floor(q * random() * 0.1), 0, floor(q * random() * 0.5), 0, 0
FROM (SELECT g, 1 + floor(-ln(random()) * 10) AS q FROM generate_series(%(lo)s, %(hi)s) g) s
"""

# Pre-period history for half of the units (CUPED covariate).
PRE = """
INSERT INTO preperiod_rollups (experiment_id, unit_id, requests, errors, latency_sum, ttft_n, ttft_sum,
    prompt_tokens, completion_tokens, thumbs_up, thumbs_down, regenerates, copies, turns, conversations)
SELECT 1, 'u' || g, q, 0, q * 450, q, q * 150, q * 300, q * 200, floor(q * random() * 0.3),
    floor(q * random() * 0.1), 0, 0, q, 1
FROM (SELECT g, 1 + floor(-ln(random()) * 10) AS q FROM generate_series(1, %(hi)s, 2) g) s
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:15432/postgres")
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    name = f"lg_bench_agg_{secrets.token_hex(3)}"
    with psycopg.connect(args.admin_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"'.encode())
    base = args.admin_url.rsplit("/", 1)[0]
    url = f"{base}/{name}"
    try:
        dbmod.upgrade(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with psycopg.connect(url, autocommit=True) as conn:
            t0 = time.perf_counter()
            overall = FILL.format(table="unit_rollups", segcol="", segval="")
            seg = FILL.format(table="segment_rollups", segcol="segment, ", segval="%(seg)s, ")
            conn.execute(overall.encode(), {"lo": 1, "hi": args.units})
            conn.execute(seg.encode(), {"seg": "task=code", "lo": 1, "hi": args.units // 2})
            conn.execute(seg.encode(), {"seg": "task=chat", "lo": args.units // 2 + 1, "hi": args.units})
            conn.execute(PRE.encode(), {"hi": args.units})
            conn.execute(b"VACUUM ANALYZE unit_rollups")
            conn.execute(b"VACUUM ANALYZE segment_rollups")
            conn.execute(b"VACUUM ANALYZE preperiod_rollups")
            print(f"filled {3 * args.units // 1:,} rollup rows in {time.perf_counter() - t0:.1f}s")
            metrics = list(BUILTINS.values())
            for label, cov in (("variant_stats", False), ("variant_stats+cuped", True)):
                times = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    variant_stats(conn, 1, metrics, with_covariate=cov)
                    times.append(time.perf_counter() - t)
                print(
                    f"{label}: median {statistics.median(times) * 1000:.0f} ms  (runs: "
                    + ", ".join(f"{x * 1000:.0f}" for x in times)
                    + ")"
                )
            for label, fn in (
                ("segments", lambda: segments(conn, 1)),
                ("unit_counts", lambda: unit_counts(conn, 1)),
            ):
                times = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t)
                print(f"{label}: median {statistics.median(times) * 1000:.1f} ms")
    finally:
        if not args.keep:
            with psycopg.connect(args.admin_url, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


if __name__ == "__main__":
    main()
