"""Benchmark: the report's RL-risks section (``analytics.report.risks.rl_risks``) on N interactions.

Generates, with SQL ``generate_series`` in a scratch database (created and migrated here,
kept for reruns with ``--reuse``), one A/B experiment's raw rows — what the section reads:
N primary ``interactions`` from N/10 units (every unit once, then heavy-tailed), each with a
category (code 35 %, math 20 %, chat 45 %) and completion tokens (the candidate 80 % longer);
a thumbs-up or thumbs-down ``feedback`` row for 35 % of them (thumbs-up with probability
0.60 control / 0.56 candidate); a ``judgements`` row for 10 %; and a stored response text for
the most recent 20,000 (the phrase table reads the latest 5,000 per arm). The RL-risk rollup
(``rl_rollups``) is then built from those rows as the ingest path appends it: a row per
counted response and a row per counted thumb (``APPENDED``); ``--reuse`` on a database
of an older revision migrates it (revision 0013 backfills the rollup, timed). Then times the
section (median of ``--repeats``) and records the load average; ``--profile`` prints a
cProfile of one more run (where the time goes: each query's wait, the statistics).

    .venv/bin/python bench/report/bench_rl_risks.py --admin-url postgresql://postgres@127.0.0.1:15432/postgres --n 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from sqlalchemy import create_engine, text

from analytics.ingest.rollups import compact_rl_rollups, length_bin_sql
from analytics.report.risks import RiskOptions, rl_risks
from liftgate import db as dbmod

CHUNK = 1_000_000

INTERACTIONS = """
INSERT INTO interactions (event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source, role,
    mode, endpoint, model, upstream, status, http_status, latency_ms, completion_tokens, response_chars, stream,
    fallback, tags, category, response)
SELECT md5(i::text)::uuid, TIMESTAMPTZ '2026-01-01' + i * INTERVAL '50 ms', 'req-' || i, 'assistant', %(eid)s,
       v, 'u' || u, 'header', 'primary', 'ab', 'chat', 'm', 'up', 'ok', 200, 300,
       ((60 + 120 * r1) * (CASE WHEN v = 'candidate' THEN 1.8 ELSE 1.0 END))::int, 500, false, false, '{}'::jsonb,
       CASE WHEN r2 < 0.35 THEN 'code' WHEN r2 < 0.55 THEN 'math' ELSE 'chat' END,
       CASE WHEN i >= %(n)s - 20000 THEN
         (CASE WHEN v = 'candidate' THEN 'Great question! ' ELSE '' END)
         || 'the answer is ' || (i %% 97) || ' then check the list and return value ' || (i %% 13) END
FROM (
    SELECT i, u, CASE WHEN abs(hashtext('u' || u)) %% 2 = 0 THEN 'control' ELSE 'candidate' END AS v,
           random() AS r1, random() AS r2
    FROM (
        SELECT i, CASE WHEN i < %(units)s THEN i ELSE floor(%(units)s * power(random(), 3))::int END AS u
        FROM generate_series(%(lo)s, %(hi)s - 1) AS i
    ) g
) s
"""

FEEDBACK = """
INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, experiment_id, variant, tags)
SELECT md5('f' || request_id)::uuid, ts, request_id, unit_id,
       CASE WHEN random() < (CASE WHEN variant = 'candidate' THEN 0.56 ELSE 0.60 END)
            THEN 'thumbs_up' ELSE 'thumbs_down' END, 1, experiment_id, variant, '{}'::jsonb
FROM interactions WHERE experiment_id = %(eid)s AND random() < 0.35
"""

JUDGEMENTS = """
INSERT INTO judgements (event_id, ts, request_id, unit_id, judge, role, status, latency_ms, experiment_id, variant,
    category, score)
SELECT md5('j' || request_id)::uuid, ts, request_id, unit_id, 'judge', 'primary', 'ok', 150, experiment_id, variant,
       category, least(10, greatest(1, 6.4 + (CASE WHEN variant = 'candidate' THEN 1.5 ELSE 0 END)
                                    + 1.5 * (random() + random() + random() - 1.5)))
FROM interactions WHERE experiment_id = %(eid)s AND random() < 0.10
"""


# What ingest appends to rl_rollups for the stored rows (analytics.ingest.rollups.RL_FOLD and
# RL_FEEDBACK_FOLD): a row per primary ok response, and a row per counted thumb (the first
# with a value > 0 per response and kind) with its response's key.
_BIN = length_bin_sql("i.completion_tokens")
APPENDED = f"""
INSERT INTO rl_rollups (experiment_id, variant, unit_id, category, lbin, responses, tokens, thumbs_up, thumbs_down)
SELECT i.experiment_id, i.variant, i.unit_id, coalesce(i.category, 'other'), {_BIN}, 1,
    greatest(coalesce(i.completion_tokens, 0), 0), 0, 0
FROM interactions i
WHERE i.experiment_id = %(eid)s AND i.role = 'primary' AND i.status = 'ok' AND i.variant IS NOT NULL
UNION ALL
SELECT i.experiment_id, i.variant, i.unit_id, coalesce(i.category, 'other'), {_BIN}, 0, 0,
    (f.kind = 'thumbs_up')::int, (f.kind = 'thumbs_down')::int
FROM (SELECT DISTINCT request_id, kind FROM feedback
      WHERE experiment_id = %(eid)s AND kind IN ('thumbs_up', 'thumbs_down') AND value > 0) f
JOIN interactions i USING (request_id)
WHERE i.experiment_id = %(eid)s AND i.role = 'primary' AND i.status = 'ok' AND i.variant IS NOT NULL
"""


def _proc_cpu(pid: int) -> float:
    """user + system CPU seconds of a local process (a PostgreSQL backend)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _generate(pg: psycopg.Connection, n: int) -> int:
    eid = pg.execute(
        "INSERT INTO experiments (name, route, mode, status, salt) VALUES ('bench-rl', 'assistant', 'ab', 'running',"
        " 's') RETURNING id"
    ).fetchone()[0]  # type: ignore[index]
    up = pg.execute(
        "INSERT INTO upstreams (name, base_url) VALUES ('bench', 'http://127.0.0.1:9') RETURNING id"
    )
    up_id = up.fetchone()[0]  # type: ignore[index]
    for i, name in enumerate(("control", "candidate")):
        pg.execute(
            "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
            " VALUES (%s, %s, %s, 'm', 50, %s)",
            (eid, name, up_id, i == 0),
        )
    pg.commit()
    for lo in range(0, n, CHUNK):
        started = time.perf_counter()
        pg.execute(INTERACTIONS, {"eid": eid, "units": n // 10, "lo": lo, "hi": min(n, lo + CHUNK), "n": n})
        pg.commit()
        print(f"interactions {min(n, lo + CHUNK):,} ({time.perf_counter() - started:.1f} s)", flush=True)
    for sql in (FEEDBACK, JUDGEMENTS):
        started = time.perf_counter()
        pg.execute(sql, {"eid": eid})
        pg.commit()
        print(f"{sql.split()[2]} ({time.perf_counter() - started:.1f} s)", flush=True)
    pg.execute("ANALYZE")  # the join below is planned on the generated rows, not on empty-table guesses
    pg.commit()
    started = time.perf_counter()
    pg.execute(APPENDED, {"eid": eid})
    pg.commit()
    print(f"rl_rollups ({time.perf_counter() - started:.1f} s)", flush=True)
    pg.execute("ANALYZE")
    pg.commit()
    return int(eid)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:15432/postgres")
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile one more run (top 25 by cumulative time)"
    )
    ap.add_argument("--drop", action="store_true", help="drop the scratch database at the end")
    ap.add_argument(
        "--compact",
        action="store_true",
        help="before timing: compact rl_rollups (analytics.ingest.rollups.compact_rl_rollups, timed) and VACUUM it",
    )
    args = ap.parse_args()
    db = f"liftgate_bench_rl_risks_{args.n}"
    with psycopg.connect(args.admin_url, autocommit=True) as admin:
        if not args.reuse:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{db}"')
    base = args.admin_url.rsplit("/", 1)[0]
    url = f"{base}/{db}"
    sa_url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    started = time.perf_counter()
    dbmod.upgrade(sa_url)  # on --reuse: migrates an older database (0013 backfills rl_rollups)
    print(f"migrated in {time.perf_counter() - started:.1f} s", flush=True)
    if not args.reuse:
        with psycopg.connect(url) as pg:
            started = time.perf_counter()
            _generate(pg, args.n)
            print(f"generated in {time.perf_counter() - started:.0f} s", flush=True)
    engine = create_engine(sa_url)
    with engine.connect() as conn:
        eid = conn.execute(text("SELECT id FROM experiments WHERE name = 'bench-rl'")).scalar_one()
    compaction = None
    if args.compact:
        # What the analytics service's rl-compaction worker does, all at once: wall time and
        # the database backend's CPU, then the VACUUM autovacuum would run after it.
        with psycopg.connect(url) as pg:
            pid = pg.info.backend_pid
            b0, w0 = _proc_cpu(pid), time.perf_counter()
            moved = compact_rl_rollups(pg, eid)
            compaction = {
                "rows": moved,
                "wall_s": time.perf_counter() - w0,
                "database_cpu_s": _proc_cpu(pid) - b0,
            }
        with psycopg.connect(url, autocommit=True) as pg:
            w0 = time.perf_counter()
            pg.execute("VACUUM (ANALYZE) rl_rollups")
            compaction["vacuum_s"] = time.perf_counter() - w0
        print(f"compaction: {compaction}", flush=True)
    with engine.connect() as conn:
        counts = {
            t: conn.execute(
                text(f"SELECT count(*) FROM {t} WHERE experiment_id = :e"), {"e": eid}
            ).scalar_one()
            for t in ("interactions", "feedback", "judgements", "rl_rollups")
        }
    print(counts, flush=True)
    # Load-independent figure: CPU seconds of the database backend (from /proc: the database
    # must run on this machine) and of this process, serially (no parallel workers).
    serial = []
    for _ in range(args.repeats):
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            conn.execute(text("SET max_parallel_workers_per_gather = 0"))
            b0, p0, w0 = _proc_cpu(pid), time.process_time(), time.perf_counter()
            rl_risks(conn, eid, "control", ["candidate"], RiskOptions())
            serial.append((_proc_cpu(pid) - b0, time.process_time() - p0, time.perf_counter() - w0))
        print(f"serial: database {serial[-1][0]:.2f} s + Python {serial[-1][1]:.2f} s CPU"
              f" ({serial[-1][2]:.2f} s wall, load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    times, cpu, loads = [], [], []
    section = None
    for _ in range(args.repeats):
        loads.append(os.getloadavg()[0])
        with engine.connect() as conn:
            started, c0 = time.perf_counter(), time.process_time()
            section = rl_risks(conn, eid, "control", ["candidate"], RiskOptions())
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - c0)
        print(
            f"rl_risks {times[-1]:.2f} s wall, {cpu[-1]:.2f} s Python CPU, load {loads[-1]:.1f}", flush=True
        )
    assert section is not None
    if args.profile:
        import cProfile
        import pstats

        with engine.connect() as conn, cProfile.Profile() as prof:
            rl_risks(conn, eid, "control", ["candidate"], RiskOptions())
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    r = section[0]
    result = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"), "n": args.n, "counts": counts,
        "compaction": compaction,
        "wall_s": times, "median_wall_s": statistics.median(times), "python_cpu_s": cpu, "load": loads,
        "serial_cpu_s": {"database": [c[0] for c in serial], "python": [c[1] for c in serial]},
        "units": [r.units_control, r.units_candidate], "units_share": r.units_share,
        "judged_share": r.judge.judged_share,
        "alarms": {a.name: [a.firing, a.state] for a in r.alarms},
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    out = Path(__file__).with_name("rl_risks_results.json")
    previous = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps([result, *previous], indent=1) + "\n")
    engine.dispose()
    if args.drop:
        with psycopg.connect(args.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
