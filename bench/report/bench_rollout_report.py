"""Benchmark: what a rollout's report costs over the same data read as an A/B experiment.

A rollout's report adds the controller's evidence (a live look on the current stage's
window and the controller's guardrail test on cumulative data: two ``measure`` calls), the
per-stage SRM (one count over the ``rollout_stage`` segments) and its last decisions. The
data: ``--units`` units ramped 5% → 25% → 50% (assignment monotone by a hash of the unit),
each unit active in a stage with probability 0.6, written straight as rollups in SQL
(``unit_rollups`` per unit and variant, ``segment_rollups`` per stage tag; the report reads
only rollups). Times ``build_report`` with the built-in metrics, overall table only
(segments off), interleaving the two modes (the experiment's ``mode`` flipped between
runs), median of ``--repeats`` runs each.

    .venv/bin/python bench/report/bench_rollout_report.py --admin-url postgresql://postgres@127.0.0.1:15432/postgres
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime

import orjson
import psycopg
from sqlalchemy import create_engine, text

from analytics.report.assembly import ReportOptions, build_report
from analytics.rollout import view
from bench.report.scratch import log, scratch_database

DB_NAME = "liftgate_bench_rollout_report"
PLAN = {"stages": [5, 25, 50, 100], "planned_units": 10_000}

# One row per (stage, unit) active in that stage, with the unit's variant in the stage.
_ACTIVE = """
    SELECT s.stage, s.pct, u, 'u' || u AS unit_id,
           CASE WHEN (abs(hashtext('a' || u)) %% 10000) < s.pct * 100 THEN 'candidate' ELSE 'control' END AS variant,
           TIMESTAMPTZ '2026-01-01' + s.stage * INTERVAL '1 hour' + random() * INTERVAL '50 minutes' AS ts,
           1 + floor(random() * 6)::int AS req, random() AS r
    FROM generate_series(0, %(units)s - 1) AS u
    CROSS JOIN (VALUES (0, 5.0), (1, 25.0), (2, 50.0)) AS s(stage, pct)
    WHERE random() < 0.6
"""
_MEASURES = """min(ts), max(ts), sum(req), sum(floor(req * r * 0.04)), sum(req * (300 + 400 * r)),
    sum(req * (100 + 60 * r)), sum(req * 20), sum(req * (r < 0.05)::int), sum(req), sum(req)"""
_COLS = "first_ts, last_ts, requests, errors, latency_sum, completion_tokens, prompt_tokens, thumbs_down, turns, conversations"
SEGMENTS_SQL = f"""
INSERT INTO segment_rollups (experiment_id, segment, variant, unit_id, {_COLS})
SELECT %(eid)s, 'rollout_stage=' || stage, variant, unit_id, {_MEASURES}
FROM ({_ACTIVE}) a GROUP BY stage, variant, unit_id
"""
UNITS_SQL = f"""
INSERT INTO unit_rollups (experiment_id, variant, unit_id, {_COLS})
SELECT %(eid)s, variant, unit_id, min(first_ts), max(last_ts), sum(requests), sum(errors), sum(latency_sum),
       sum(completion_tokens), sum(prompt_tokens), sum(thumbs_down), sum(turns), sum(conversations)
FROM segment_rollups WHERE experiment_id = %(eid)s GROUP BY variant, unit_id
"""


def prepare(admin_url: str, units: int, reuse: bool) -> str:
    url = scratch_database(admin_url, DB_NAME, reuse)
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM experiments WHERE name = 'bench-rollout'").fetchone() is not None:
            log(f"reusing the data in {DB_NAME}")
            return url
        up = conn.execute(
            "INSERT INTO upstreams (name, base_url) VALUES ('sim', 'http://127.0.0.1:9') RETURNING id"
        )
        up_id = up.fetchone()[0]  # type: ignore[index]
        eid = conn.execute(
            "INSERT INTO experiments (name, route, mode, status, salt, rollout_plan, rollout_stage, stage_started_at,"
            " started_at) VALUES ('bench-rollout', 'assistant', 'rollout', 'running', 's', %s, 2,"
            " TIMESTAMPTZ '2026-01-01 02:00', '2026-01-01') RETURNING id",
            (orjson.dumps(PLAN).decode(),),
        ).fetchone()[0]  # type: ignore[index]
        for name, weight, control in (("control", 50.0, True), ("candidate", 50.0, False)):
            conn.execute(
                "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                " VALUES (%s, %s, %s, 'm', %s, %s)",
                (eid, name, up_id, weight, control),
            )
        started = time.perf_counter()
        conn.execute("SET work_mem = '256MB'")
        conn.execute(SEGMENTS_SQL, {"eid": eid, "units": units})
        log(f"segment_rollups ({time.perf_counter() - started:.0f} s)")
        conn.execute(UNITS_SQL, {"eid": eid})
        log(f"unit_rollups ({time.perf_counter() - started:.0f} s)")
        conn.execute("VACUUM ANALYZE segment_rollups")
        conn.execute("VACUUM ANALYZE unit_rollups")
    return url


def measure(url: str, repeats: int) -> dict[str, object]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    opts = ReportOptions(segments=False, timeseries=False, rollout=view.report_part)
    now = datetime(2026, 1, 1, 3, tzinfo=UTC)
    times: dict[str, list[float]] = {"ab": [], "rollout": []}
    with engine.connect() as conn:
        eid = conn.execute(text("SELECT id FROM experiments WHERE name = 'bench-rollout'")).scalar_one()
        counts = conn.execute(
            text("SELECT (SELECT count(*) FROM unit_rollups), (SELECT count(*) FROM segment_rollups)")
        ).one()
    for _ in range(repeats):
        for mode in ("ab", "rollout"):
            with engine.begin() as conn:
                conn.execute(text("UPDATE experiments SET mode = :m WHERE id = :e"), {"m": mode, "e": eid})
            with engine.connect() as conn:
                t = time.perf_counter()
                report = build_report(conn, eid, now=now, options=opts)
                times[mode].append(time.perf_counter() - t)
            assert report.mode == mode
    with engine.begin() as conn:
        conn.execute(text("UPDATE experiments SET mode = 'rollout' WHERE id = :e"), {"e": eid})
    engine.dispose()
    ab, ro = statistics.median(times["ab"]), statistics.median(times["rollout"])
    return {"unit_rollups": int(counts[0]), "segment_rollups": int(counts[1]), "ab_median_s": round(ab, 3),
            "rollout_median_s": round(ro, 3), "ratio": round(ro / ab, 2), "repeats": repeats}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:15432/postgres")
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reuse", action="store_true", help="keep the data of a previous run")
    ap.add_argument("--drop", action="store_true", help="drop the scratch database afterwards")
    args = ap.parse_args()
    url = prepare(args.admin_url, args.units, args.reuse)
    print(json.dumps(measure(url, args.repeats), indent=2))
    if args.drop:
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


if __name__ == "__main__":
    main()
