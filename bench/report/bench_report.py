"""Benchmark: ``build_report`` on an experiment with 10M interactions from 1M units.

Generates the data with SQL ``generate_series`` in a scratch database (created and
migrated here, kept for reruns with ``--reuse``): the raw ``interactions`` rows, then the
rollups they imply (``unit_rollups``, ``segment_rollups`` per ``task`` tag, and the
latency/TTFT histograms), built with ``INSERT … SELECT … GROUP BY`` from those rows.
Then times ``build_report`` (median of ``--repeats`` runs) with the built-in metrics:
the full report (segments, time series from stored snapshots) and the overall table only.

    .venv/bin/python bench/report/bench_report.py --admin-url postgresql://postgres@127.0.0.1:15432/postgres

Feedback signals (thumbs, copies, ratings …) are derived per interaction from its own
random columns inside the rollup query instead of writing feedback rows: the report
reads only rollups, so this changes the generation time, not what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg
from sqlalchemy import create_engine, text

from analytics.report.assembly import ReportOptions, build_report
from analytics.report.snapshots import latest_snapshot, load_timeseries, save_snapshot
from bench.report.scratch import log, scratch_database

DB_NAME = "liftgate_bench_report"
CHUNK = 1_000_000

INTERACTIONS_SQL = """
INSERT INTO interactions (event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source,
    role, mode, endpoint, model, upstream, status, http_status, error_type, latency_ms, ttft_ms,
    prompt_tokens, completion_tokens, response_chars, finish_reason, stream, fallback, conversation_id, tags)
SELECT md5(i::text)::uuid, TIMESTAMPTZ '2026-01-01' + i * INTERVAL '50 ms', 'req-' || i, 'assistant', %(eid)s,
       v, 'u' || u, 'header', 'primary', 'ab', 'chat', v || '-model', v || '-upstream',
       CASE WHEN r1 < 0.02 THEN 'error' ELSE 'ok' END, CASE WHEN r1 < 0.02 THEN 502 ELSE 200 END,
       CASE WHEN r1 < 0.02 THEN 'http_5xx' END,
       (200 + 800 * r2) * (CASE WHEN v = 'candidate' THEN 1.05 ELSE 1.0 END),
       CASE WHEN r3 < 0.5 THEN 50 + 200 * r3 END,
       20 + (r4 * 200)::int,
       ((100 + 300 * r5) * (CASE WHEN v = 'candidate' THEN 1.2 ELSE 1.0 END))::int,
       ((400 + 1200 * r5) * (CASE WHEN v = 'candidate' THEN 1.2 ELSE 1.0 END))::int,
       'stop', r3 < 0.5, false, 'c' || u || '-' || (i / 7) %% 3,
       jsonb_build_object('task', (ARRAY['code', 'math', 'chat'])[1 + (u + (r6 < 0.2)::int) %% 3])
FROM (
    SELECT i, u, CASE WHEN abs(hashtext('u' || u)) %% 2 = 0 THEN 'control' ELSE 'candidate' END AS v,
           random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r5, random() AS r6
    FROM (
        -- every unit once, then heavy-tailed: a few units send most requests
        SELECT i, CASE WHEN i < %(units)s THEN i ELSE floor(%(units)s * power(random(), 3))::int END AS u
        FROM generate_series(%(lo)s, %(hi)s - 1) AS i
    ) g
) s
"""

# Per-interaction feedback derived from its own random columns (see module doc).
_MEASURES = """
    min(ts), max(ts), count(*), count(*) FILTER (WHERE status = 'error'), count(*) FILTER (WHERE fallback),
    sum(latency_ms), count(ttft_ms), coalesce(sum(ttft_ms), 0), sum(prompt_tokens), sum(completion_tokens),
    sum(response_chars), count(DISTINCT conversation_id), count(*),
    count(*) FILTER (WHERE response_chars %% 100 < CASE WHEN variant = 'candidate' THEN 21 ELSE 20 END),
    count(*) FILTER (WHERE response_chars %% 100 >= 95),
    count(*) FILTER (WHERE prompt_tokens %% 10 = 0), sum(CASE WHEN prompt_tokens %% 10 = 0 THEN 1 + prompt_tokens %% 5 ELSE 0 END),
    count(*) FILTER (WHERE completion_tokens %% 20 = 0), count(*) FILTER (WHERE completion_tokens %% 20 = 1),
    count(*) FILTER (WHERE completion_tokens %% 50 = 2), count(*) FILTER (WHERE latency_ms::int %% 3 = 0),
    count(*) FILTER (WHERE latency_ms::int %% 25 = 0), count(*) FILTER (WHERE latency_ms::int %% 50 = 0)
"""
_COLUMNS = """first_ts, last_ts, requests, errors, fallbacks, latency_sum, ttft_n, ttft_sum, prompt_tokens,
    completion_tokens, response_chars, conversations, turns, thumbs_up, thumbs_down, ratings_n, ratings_sum,
    regenerates, copies, edits, continued, task_success_n, task_success_sum"""

ROLLUPS_SQL = f"""
INSERT INTO unit_rollups (experiment_id, variant, unit_id, {_COLUMNS})
SELECT experiment_id, variant, unit_id, {_MEASURES}
FROM interactions WHERE experiment_id = %(eid)s AND role = 'primary' GROUP BY experiment_id, variant, unit_id
"""
SEGMENTS_SQL = f"""
INSERT INTO segment_rollups (experiment_id, segment, variant, unit_id, {_COLUMNS})
SELECT experiment_id, 'task=' || (tags ->> 'task'), variant, unit_id, {_MEASURES}
FROM interactions WHERE experiment_id = %(eid)s AND role = 'primary'
GROUP BY experiment_id, 'task=' || (tags ->> 'task'), variant, unit_id
"""
HISTOGRAMS_SQL = """
INSERT INTO latency_histograms (experiment_id, metric, segment, variant, bucket, count)
SELECT experiment_id, m, seg, variant, b, count(*) FROM (
    SELECT experiment_id, variant, 'latency' AS m, floor(20 * ln(greatest(latency_ms, 0.01)))::int AS b,
           tags ->> 'task' AS task FROM interactions WHERE experiment_id = %(eid)s
    UNION ALL
    SELECT experiment_id, variant, 'ttft', floor(20 * ln(greatest(ttft_ms, 0.01)))::int, tags ->> 'task'
    FROM interactions WHERE experiment_id = %(eid)s AND ttft_ms IS NOT NULL
) x CROSS JOIN LATERAL (VALUES (''), ('task=' || task)) AS s(seg)
GROUP BY experiment_id, m, seg, variant, b
"""


def prepare(admin_url: str, interactions: int, units: int, reuse: bool) -> str:
    url = scratch_database(admin_url, DB_NAME, reuse)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM experiments WHERE name = 'bench'").fetchone()
        if row is not None:
            n = conn.execute("SELECT count(*) FROM interactions").fetchone()
            if n is not None and n[0] == interactions:
                log(f"reusing {interactions} interactions in {DB_NAME}")
                return url
            raise SystemExit(f"{DB_NAME} holds other data; run without --reuse")
        up = conn.execute(
            "INSERT INTO upstreams (name, base_url) VALUES ('sim', 'http://127.0.0.1:8001') RETURNING id"
        )
        up_id = up.fetchone()[0]  # type: ignore[index]
        eid = conn.execute(
            "INSERT INTO experiments (name, route, mode, status, salt, started_at)"
            " VALUES ('bench', 'assistant', 'ab', 'running', 's', '2026-01-01') RETURNING id"
        ).fetchone()[0]  # type: ignore[index]
        for name, control in (("control", True), ("candidate", False)):
            conn.execute(
                "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                " VALUES (%s, %s, %s, 'm', 50, %s)",
                (eid, name, up_id, control),
            )
        started = time.perf_counter()
        for lo in range(0, interactions, CHUNK):
            conn.execute(
                INTERACTIONS_SQL, {"eid": eid, "units": units, "lo": lo, "hi": min(interactions, lo + CHUNK)}
            )
            log(f"interactions {min(interactions, lo + CHUNK):,} ({time.perf_counter() - started:.0f} s)")
        conn.execute("ANALYZE interactions")
        for label, sql in (("unit_rollups", ROLLUPS_SQL), ("segment_rollups", SEGMENTS_SQL),
                           ("latency_histograms", HISTOGRAMS_SQL)):  # fmt: skip
            t = time.perf_counter()
            conn.execute("SET work_mem = '256MB'")
            conn.execute(sql, {"eid": eid})
            log(f"{label} built in {time.perf_counter() - t:.0f} s")
        conn.execute("VACUUM ANALYZE unit_rollups")
        conn.execute("VACUUM ANALYZE segment_rollups")
        conn.execute("VACUUM ANALYZE latency_histograms")
        log(f"data ready in {time.perf_counter() - started:.0f} s")
    return url


def _proc_cpu(pid: int) -> float:
    """user + system CPU seconds of a local process (a PostgreSQL backend)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, repeats: int, snapshots: int) -> dict[str, object]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    results: dict[str, object] = {}
    with engine.begin() as conn:
        eid = conn.execute(text("SELECT id FROM experiments WHERE name = 'bench'")).scalar_one()
        counts = conn.execute(
            text("SELECT (SELECT count(*) FROM interactions), (SELECT count(*) FROM unit_rollups),"
                 " (SELECT count(*) FROM segment_rollups)")
        ).one()  # fmt: skip
        results["interactions"], results["unit_rollups"], results["segment_rollups"] = (
            int(c) for c in counts
        )
        have = conn.execute(
            text("SELECT count(*) FROM analysis_snapshots WHERE experiment_id = :e"), {"e": eid}
        )
        for _ in range(max(0, snapshots - int(have.scalar_one()))):
            save_snapshot(
                conn, build_report(conn, eid, options=ReportOptions(segments=False, timeseries=False))
            )
    variants = {
        "full (segments + time series)": ReportOptions(),
        "overall table only": ReportOptions(segments=False, timeseries=False),
    }
    for label, opts in variants.items():
        times: list[float] = []
        report = None
        load_before = os.getloadavg()[0]
        for _ in range(repeats):
            with engine.connect() as conn:
                t = time.perf_counter()
                report = build_report(conn, eid, options=opts)
                times.append(time.perf_counter() - t)
        assert report is not None
        results[label] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                          "runs": len(times), "units": report.units, "metrics": len(report.metrics),
                          "segments": len(report.segments), "verdict": report.headline(),
                          "loadavg_1m": [load_before, os.getloadavg()[0]]}  # fmt: skip
        log(f"{label}: median {statistics.median(times):.3f} s over {len(times)} runs")
    # Load-independent figure: CPU seconds spent, serially (no parallel workers), by the
    # database backend (from /proc, so the DB must be on this machine) and by this process.
    for label, opts in variants.items():
        cpu: list[tuple[float, float]] = []
        for _ in range(repeats):
            with engine.connect() as conn:
                conn.execute(text("SET max_parallel_workers_per_gather = 0"))
                pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                b0, p0 = _proc_cpu(pid), time.process_time()
                build_report(conn, eid, options=opts)
                cpu.append((_proc_cpu(pid) - b0, time.process_time() - p0))
        entry = results[label]
        assert isinstance(entry, dict)
        entry["serial_cpu_s"] = {"database": statistics.median(c[0] for c in cpu),
                                 "python": statistics.median(c[1] for c in cpu)}  # fmt: skip
        log(f"{label}: CPU database {entry['serial_cpu_s']['database']:.2f} s, python "
             f"{entry['serial_cpu_s']['python']:.2f} s (serial)")  # fmt: skip
    # What GET /report does while the latest snapshot is fresh: read it + the time series.
    times = []
    for _ in range(repeats):
        with engine.connect() as conn:
            t = time.perf_counter()
            snap = latest_snapshot(conn, eid)
            assert snap is not None
            load_timeseries(conn, eid, ReportOptions().max_timeseries_points)
            times.append(time.perf_counter() - t)
    results["served from snapshot"] = {"median_s": statistics.median(times), "runs": len(times)}
    log(f"served from snapshot: median {statistics.median(times):.3f} s")
    engine.dispose()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:15432/postgres")
    ap.add_argument("--interactions", type=int, default=10_000_000)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--snapshots", type=int, default=20, help="stored snapshots feeding the time series")
    ap.add_argument("--reuse", action="store_true", help="keep an existing benchmark database")
    ap.add_argument("--drop", action="store_true", help="drop the benchmark database afterwards")
    args = ap.parse_args()
    url = prepare(args.admin_url, args.interactions, args.units, args.reuse)
    results = measure(url, args.repeats, args.snapshots)
    sys.stdout.write(json.dumps(results, indent=2) + "\n")
    if args.drop:
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    main()
