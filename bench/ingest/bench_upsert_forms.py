"""What a rollup row's update costs in PostgreSQL: ``INSERT … ON CONFLICT DO UPDATE`` against a
plain ``UPDATE … FROM`` (as the planner picks it, and as a nested loop of index probes) and a
``MERGE`` (index probes), on rows that exist already (the common case of a unit seen before).
The index-probe forms are what a rollup table of millions of rows needs; on this small table
the planner's own choice for the ``UPDATE`` is a hash join over all of it.

A scratch table shaped like ``unit_rollups`` (the key, first/last seen, the rollup measures,
``counters``; fillfactor 80) holds ``--units`` rows; each round groups ``--events`` random
events of those units into a temp table and adds them once per form, in one transaction
each, alternating the forms. Prints µs per updated row per round. No Kafka, no migrations:
only the server at ``--admin-url`` (the table lives in a scratch database, dropped after).

    .venv/bin/python bench/ingest/bench_upsert_forms.py --rounds 6
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

import psycopg

from contracts.tables import INTERACTION_MEASURES, ROLLUP_MEASURES

ADMIN_URL = "postgresql://postgres@127.0.0.1:15432/postgres"
KEY = "experiment_id, variant, unit_id"


#: Index probes only (a nested loop), as a rollup table of millions of rows needs.
_PROBES = "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;"


def _statements() -> dict[str, str]:
    m = INTERACTION_MEASURES
    ts_excluded = (
        "first_ts = least(t.first_ts, EXCLUDED.first_ts), last_ts = greatest(t.last_ts, EXCLUDED.last_ts)"
    )
    add_g = (
        "first_ts = least(t.first_ts, g.first_ts), last_ts = greatest(t.last_ts, g.last_ts), "
        + ", ".join(f"{c} = t.{c} + g.{c}" for c in m)
    )
    on_key = "t.experiment_id = g.experiment_id AND t.variant = g.variant AND t.unit_id = g.unit_id"
    update = f"UPDATE ur AS t SET {add_g} FROM g WHERE {on_key}"
    return {
        "on conflict do update": (
            f"INSERT INTO ur AS t ({KEY}, first_ts, last_ts, {', '.join(m)}) SELECT * FROM g ORDER BY 1, 2, 3"
            f" ON CONFLICT ({KEY}) DO UPDATE SET {ts_excluded}, {', '.join(f'{c} = t.{c} + EXCLUDED.{c}' for c in m)}"
        ),
        "update from": update,
        "update from, nested loop": f"{_PROBES} {update}",
        "merge, nested loop": (
            f"{_PROBES} MERGE INTO ur AS t USING (SELECT * FROM g ORDER BY 1, 2, 3) g ON {on_key}"
            f" WHEN MATCHED THEN UPDATE SET {add_g}"
            f" WHEN NOT MATCHED THEN INSERT ({KEY}, first_ts, last_ts, {', '.join(m)})"
            f" VALUES (g.experiment_id, g.variant, g.unit_id, g.first_ts, g.last_ts, {', '.join(f'g.{c}' for c in m)})"
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default=ADMIN_URL)
    ap.add_argument("--units", type=int, default=50_000)
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    db = f"lg_bench_upsert_{secrets.token_hex(3)}"
    with psycopg.connect(args.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"'.encode())
    try:
        url = args.admin_url.rsplit("/", 1)[0] + "/" + db
        with psycopg.connect(url, autocommit=True) as pg:
            cols = ", ".join(f"{c} float8 NOT NULL DEFAULT 0" for c in ROLLUP_MEASURES)
            pg.execute(
                f"CREATE TABLE ur (experiment_id int NOT NULL, variant varchar(64) NOT NULL,"
                f" unit_id varchar(256) NOT NULL, first_ts timestamptz, last_ts timestamptz, {cols},"
                f" counters jsonb NOT NULL DEFAULT '{{}}', PRIMARY KEY ({KEY})) WITH (fillfactor = 80)".encode()
            )
            pg.execute(
                f"INSERT INTO ur ({KEY}, first_ts, last_ts, requests) SELECT 1, CASE WHEN u % 2 = 1 THEN"
                f" 'candidate' ELSE 'control' END, 'user-' || u, now(), now(), 1"
                f" FROM generate_series(0, {args.units - 1}) u".encode()
            )
            pg.execute(b"VACUUM ANALYZE ur")
            sums = ", ".join(f"sum(random()) AS {c}" for c in INTERACTION_MEASURES)
            results: dict[str, list[float]] = {name: [] for name in _statements()}
            for _ in range(args.rounds):
                for name, statement in _statements().items():
                    pg.execute(b"DROP TABLE IF EXISTS g")
                    pg.execute(
                        f"CREATE TEMP TABLE g AS SELECT 1 AS experiment_id, CASE WHEN u % 2 = 1 THEN 'candidate'"
                        f" ELSE 'control' END AS variant, 'user-' || u AS unit_id, now() AS first_ts,"
                        f" now() AS last_ts, {sums} FROM (SELECT (random() * {args.units - 1})::int AS u"
                        f" FROM generate_series(1, {args.events})) e GROUP BY u".encode()
                    )
                    pg.execute(b"ANALYZE g")
                    rows = pg.execute(b"SELECT count(*) FROM g").fetchone()
                    n = int(rows[0]) if rows else 0
                    with pg.transaction():
                        t = time.perf_counter()
                        pg.execute(statement.encode())
                        results[name].append((time.perf_counter() - t) / n * 1e6)
            for name, per_row in results.items():
                rounds = ", ".join(f"{v:.2f}" for v in per_row)
                print(f"{name}: {rounds} µs per row (median {statistics.median(per_row):.2f})")
    finally:
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'.encode())


if __name__ == "__main__":
    main()
