"""Prototype measurement (not product code): the latency-samples statement given a cached cut.

A group's cut (its k-th smallest ``sample_key``) only falls as requests arrive, so a cut read
after an earlier batch is an upper bound of the current one: dropping a batch's rows at or
above it, in the first scan of ``lg_fold``, drops no row the statement would insert. Here the
largest cut of the stored groups is read after ``--events`` minus one batch are ingested (the
bench's groups: '' segment × 2 variants × 2 metrics, no stages), and the last batch's samples
statement is timed as it is and with that filter, alternated, in savepoints rolled back (the
inserted samples are compared by a hash of their rows). A product version would cache one cut
per group in the consumer, filter a row by the larger of its '' and stage groups' cuts, and
leave rows of groups it has no cut for unfiltered.

    .venv/bin/python bench/ingest/proto_cached_cut.py --events 220000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from bench_ingest import add_write_args, make_events, scratch_database

from analytics.ingest import copy_text, rollups, samples, write
from analytics.ingest.write import Raw
from contracts.events import encode

_LARGEST_CUT = f"""
SELECT max(cut) FROM (
    SELECT (SELECT l.sample_key FROM latency_samples l
        WHERE l.experiment_id = g.experiment_id AND l.metric = g.metric AND l.segment = g.segment
            AND l.variant = g.variant
        ORDER BY l.sample_key OFFSET {samples.SAMPLE_SIZE - 1} LIMIT 1) AS cut
    FROM (SELECT DISTINCT experiment_id, metric, segment, variant FROM latency_samples) g
) x""".encode()
_SAMPLES_DIGEST = (
    b"SELECT count(*), sum(hashtextextended(metric || segment || variant || sample_key::text || batch::text"
    b" || value::text, 0) % 1000003) FROM latency_samples"
)


def with_cut(cut: int) -> bytes:
    """The product's samples statement, each metric's rows filtered by ``cut`` in the first scan."""
    sql = rollups.SAMPLES.decode()
    for col in ("latency_ms", "ttft_ms"):
        where = f"FROM lg_fold WHERE {col} IS NOT NULL"
        assert where in sql, col
        sql = sql.replace(where, f"{where} AND {samples.sample_key_sql(col)} < {cut}")
    return sql.encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    add_write_args(ap)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    events = make_events(args.events, args.units)
    stored, last = events[: -args.batch], events[-args.batch :]
    with scratch_database(args.admin_url, "lg_proto_cut") as url, psycopg.connect(url) as pg:
        for i in range(0, len(stored), args.batch):
            write.ingest_raw(pg, [Raw(encode(e), event=e) for e in stored[i : i + args.batch]], [])
            pg.commit()
        row = pg.execute(_LARGEST_CUT).fetchone()
        assert row is not None and row[0] is not None, "fewer stored requests than the sample size"
        statements = {"as it is": rollups.SAMPLES, "cached cut": with_cut(int(row[0]))}
        times: dict[str, list[float]] = {k: [] for k in statements}
        digests = {}
        with pg.transaction():
            write._prepare(pg, True)
            copy_text.insert_interactions(pg, last, declared=rollups.declared_segments(pg))
            pg.execute(rollups.FOLD)
            for _ in range(args.repeats):
                for name, sql in statements.items():
                    pg.execute(b"SAVEPOINT s")
                    t = time.perf_counter()
                    pg.execute(sql)
                    times[name].append(time.perf_counter() - t)
                    digests[name] = pg.execute(_SAMPLES_DIGEST).fetchone()
                    pg.execute(b"ROLLBACK TO SAVEPOINT s")
            raise psycopg.Rollback()  # nothing of the last batch is kept
    assert len(set(digests.values())) == 1, digests  # the same samples either way
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"{name:10s} median {med * 1e3:7.1f} ms, {med / len(last) * 1e6:5.1f} µs per event of the batch"
        )


if __name__ == "__main__":
    main()
