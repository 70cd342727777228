"""Prototype measurement (not product code): rollups from a delta log compacted later.

The design question behind issue 4's "≥ 0.5 × plain COPY": would moving the rollup upserts
out of the ingest transaction pay? Here each batch COPYs its interactions as the consumer
does but appends the rollup input rows to a logged, index-free ``fold_log`` table instead
of folding them; every C batches one transaction moves the log (DELETE … RETURNING) into
the temp table and runs the product's own FOLD and HISTOGRAMS statements. Rollups end up
identical (checked: units, requests and latency sums printed per run). One connection, no
Kafka; wall time per event of the statements (server work plus overlapping client
formatting), like ``bench_write_path.py``. Not counted: vacuuming the deleted log rows.

    .venv/bin/python bench/ingest/proto_delta_log.py --runs 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import add_write_args, make_events, scratch_database

from analytics.ingest import copy_text, rollups, write

FOLD_LOG = b"""CREATE TABLE fold_log (
    experiment_id int, variant text, unit_id text, ts timestamptz, status text, fallback bool,
    latency_ms float8, ttft_ms float8, prompt_tokens int, completion_tokens int, response_chars int,
    segments text, conv bool, category text)"""


def run(url: str, events: list[Any], batch: int, every: int | None) -> None:
    """``every`` None: the product's inline fold; else compact the log every that many batches."""
    copy = copy_text._COPY_FOLD_BINARY
    n = len(events)
    with psycopg.connect(url) as pg:
        pg.execute(b"TRUNCATE interactions, unit_rollups, segment_rollups, latency_histograms, fold_log")
        pg.commit()
        t_ingest = t_compact = 0.0
        for k, i in enumerate(range(0, n, batch), 1):
            try:
                if every is not None:
                    copy_text._COPY_FOLD_BINARY = copy.replace(b"COPY lg_fold", b"COPY fold_log")  # type: ignore[misc]
                t = time.perf_counter()
                with pg.transaction():
                    write._prepare(pg, True)
                    counted = copy_text.insert_interactions(
                        pg, events[i : i + batch], declared=rollups.NONE_DECLARED
                    ).attributable
                    if every is None and counted:
                        rollups.fold_interactions(pg)
                t_ingest += time.perf_counter() - t
            finally:
                copy_text._COPY_FOLD_BINARY = copy  # type: ignore[misc]
            if every is not None and (k % every == 0 or i + batch >= n):
                t = time.perf_counter()
                with pg.transaction():
                    write._prepare(pg, True)
                    pg.execute(
                        b"WITH d AS (DELETE FROM fold_log RETURNING *) INSERT INTO lg_fold ("
                        + rollups.FOLD_COLUMNS.encode()
                        + b") SELECT * FROM d"
                    )
                    pg.execute(rollups.FOLD)
                    pg.execute(rollups.HISTOGRAMS)
                t_compact += time.perf_counter() - t
        check = pg.execute(
            b"SELECT count(*), sum(requests), round(sum(latency_sum)) FROM unit_rollups"
        ).fetchone()
    label = "inline fold (product)" if every is None else f"delta log, compacted every {every} batches"
    print(
        f"{label:42s} ingest {t_ingest / n * 1e6:5.1f} + compaction {t_compact / n * 1e6:5.1f}"
        f" = {(t_ingest + t_compact) / n * 1e6:5.1f} µs/event   (rollups {check})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    add_write_args(ap)
    args = ap.parse_args()
    with scratch_database(args.admin_url, "lg_proto_delta") as url:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(FOLD_LOG)
        events = make_events(args.events, args.units)
        batches = -(-args.events // args.batch)
        for _ in range(args.runs):
            for every in (None, 1, max(1, batches // 2), batches):
                run(url, events, args.batch, every)


if __name__ == "__main__":
    main()
