"""Snapshots accumulate into the report's time series; the mSPRT p-value is a running minimum."""

from __future__ import annotations

import importlib.util
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from analytics.report.assembly import ReportOptions, build_report
from analytics.report.schema import Report
from analytics.report.snapshots import (
    latest_snapshot,
    load_timeseries,
    prune_snapshots,
    save_snapshot,
    series_points,
)
from tests.analytics.report_data import T0, create_experiment, insert_units, simulate_units


def test_snapshots_accumulate_into_a_time_series_of_cumulative_lift(db: Session) -> None:
    rng = np.random.default_rng(21)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    opts = ReportOptions(segments=False)
    for step in range(4):
        # each look sees more units, as a running experiment does
        insert_units(conn, eid, "control", simulate_units(rng, 200, thumbs_p=0.2, tokens=100, error_p=0.05),
                     prefix=f"c{step}")  # fmt: skip
        insert_units(conn, eid, "candidate", simulate_units(rng, 200, thumbs_p=0.3, tokens=100, error_p=0.05),
                     prefix=f"t{step}")  # fmt: skip
        save_snapshot(conn, build_report(conn, eid, now=T0 + timedelta(minutes=step), options=opts))
    series = load_timeseries(conn, eid, max_points=100)
    assert [(s.metric, s.variant) for s in series] == [("thumbs_up_rate", "candidate")]
    points = series[0].points
    assert [p.units for p in points] == [200, 400, 600, 800]
    assert [p.t for p in points] == [T0 + timedelta(minutes=i) for i in range(4)]
    widths = [p.ci_relative.upper - p.ci_relative.lower for p in points if p.ci_relative]
    assert widths == sorted(widths, reverse=True)  # more units, narrower interval
    # the report built next carries the stored points plus its own, newest last
    report = build_report(conn, eid, now=T0 + timedelta(minutes=10), options=opts)
    assert [p.units for p in report.timeseries[0].points] == [200, 400, 600, 800, 800]
    # stored snapshots keep no time series (it is rebuilt from them)
    stored = latest_snapshot(conn, eid)
    assert stored is not None and stored.timeseries == []


def _two_arm_report(conn: Connection, seed: int, units: int, p_candidate: float) -> tuple[int, Report]:
    """An experiment with ``units`` units per arm (thumbs-up 0.2 vs ``p_candidate``), reported once."""
    rng = np.random.default_rng(seed)
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    for variant, p in (("control", 0.2), ("candidate", p_candidate)):
        insert_units(conn, eid, variant, simulate_units(rng, units, thumbs_p=p, tokens=100, error_p=0.05))
    return eid, build_report(conn, eid, options=ReportOptions(segments=False, timeseries=False))


def test_time_series_is_thinned_to_the_point_bound_keeping_the_newest(db: Session) -> None:
    conn = db.connection()
    eid, report = _two_arm_report(conn, seed=2, units=50, p_candidate=0.2)
    for i in range(25):
        save_snapshot(conn, report.model_copy(update={"generated_at": T0 + timedelta(seconds=i)}))
    points = load_timeseries(conn, eid, max_points=10)[0].points
    assert len(points) == 10
    assert points[-1].t == T0 + timedelta(seconds=24)
    assert [p.t for p in points] == sorted(p.t for p in points)


def test_sequential_p_value_never_increases_across_snapshots(db: Session) -> None:
    rng = np.random.default_rng(8)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    opts = ReportOptions(segments=False, timeseries=False)
    ps: list[float] = []
    for step in range(5):
        insert_units(conn, eid, "control", simulate_units(rng, 150, thumbs_p=0.2, tokens=100, error_p=0.05),
                     prefix=f"c{step}")  # fmt: skip
        insert_units(conn, eid, "candidate", simulate_units(rng, 150, thumbs_p=0.24, tokens=100, error_p=0.05),
                     prefix=f"t{step}")  # fmt: skip
        report = build_report(conn, eid, now=T0 + timedelta(minutes=step), options=opts)
        save_snapshot(conn, report)
        row = report.result("thumbs_up_rate", "candidate")
        assert row is not None and row.p_value_sequential is not None
        ps.append(row.p_value_sequential)
    assert ps == sorted(ps, reverse=True)


def _snapshot_rows(conn: Connection, eid: int) -> list[tuple[datetime, str, bool]]:
    rows = conn.execute(
        text(
            "SELECT created_at, source, report IS NOT NULL FROM analysis_snapshots"
            " WHERE experiment_id = :e ORDER BY created_at, id"
        ),
        {"e": eid},
    )
    return [(r[0], r[1], r[2]) for r in rows]


def test_old_periodic_snapshots_keep_their_points_and_one_report_an_hour(db: Session) -> None:
    conn = db.connection()
    eid, report = _two_arm_report(conn, seed=5, units=80, p_candidate=0.3)
    times = [T0 + timedelta(minutes=20 * i) for i in range(3 * 72)]  # three days, every 20 min
    for t in times:
        save_snapshot(conn, report.model_copy(update={"generated_at": t}))
    api_at = T0 + timedelta(minutes=20 * 5 + 1)
    save_snapshot(conn, report.model_copy(update={"generated_at": api_at}), source="api")
    now = times[-1] + timedelta(minutes=1)
    series_before = load_timeseries(conn, eid, max_points=1000)

    pruned = prune_snapshots(conn, eid, keep_full_s=86_400, now=now)

    rows = _snapshot_rows(conn, eid)
    cutoff = now - timedelta(days=1)
    kept_old = [t for t, source, full in rows if full and t < cutoff and source == "periodic"]
    old_hours = {t.replace(minute=0, second=0, microsecond=0) for t in times if t < cutoff}
    # exactly the newest periodic snapshot of each old hour keeps its body...
    assert kept_old == [max(t for t in times if t.replace(minute=0) == h) for h in sorted(old_hours)]
    # ...every recent one and the API-requested one keep theirs
    assert all(full for t, source, full in rows if t >= cutoff or source == "api")
    assert pruned == sum(1 for t in times if t < cutoff) - len(old_hours)
    # the time series still has every point, unchanged
    assert load_timeseries(conn, eid, max_points=1000) == series_before
    assert len(series_before[0].points) == len(times) + 1
    latest = latest_snapshot(conn, eid)
    assert latest is not None and latest.generated_at == times[-1]
    # idempotent; 0 keeps everything
    assert prune_snapshots(conn, eid, keep_full_s=86_400, now=now) == 0
    assert prune_snapshots(conn, eid, keep_full_s=0, now=now + timedelta(days=30)) == 0


def test_the_migration_backfills_series_points_of_existing_snapshots(db: Session) -> None:
    rng = np.random.default_rng(6)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("a", 1), ("b", 1)], metrics=["thumbs_up_rate"])
    for v, p in (("control", 0.2), ("a", 0.25), ("b", 0.3)):
        insert_units(conn, eid, v, simulate_units(rng, 60, thumbs_p=p, tokens=100, error_p=0.05))
    report = build_report(conn, eid, options=ReportOptions(segments=False, timeseries=False))
    sid = save_snapshot(conn, report)
    written = conn.execute(
        text("SELECT points FROM analysis_snapshots WHERE id = :i"), {"i": sid}
    ).scalar_one()
    assert written == orjson.loads(orjson.dumps(series_points(report)))
    assert {(p["metric"], p["variant"]) for p in written} == {(r.metric, r.variant) for r in report.results
                                                              if not r.is_control}  # fmt: skip
    conn.execute(text("UPDATE analysis_snapshots SET points = '[]' WHERE id = :i"), {"i": sid})
    spec = importlib.util.spec_from_file_location(
        "m0002", Path(__file__).resolve().parents[3] / "migrations/versions/0002_snapshot_points.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    conn.execute(text(module._BACKFILL + " WHERE s.id = :i"), {"i": sid})
    backfilled = conn.execute(
        text("SELECT points FROM analysis_snapshots WHERE id = :i"), {"i": sid}
    ).scalar_one()
    assert backfilled == written
