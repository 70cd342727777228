"""Snapshots accumulate into the report's time series; the mSPRT p-value is a running minimum."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from sqlalchemy.orm import Session

from analytics.report import ReportOptions, build_report
from analytics.snapshot import latest_snapshot, load_timeseries, save_snapshot
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


def test_time_series_is_thinned_to_the_point_bound_keeping_the_newest(db: Session) -> None:
    rng = np.random.default_rng(2)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    insert_units(conn, eid, "control", simulate_units(rng, 50, thumbs_p=0.2, tokens=100, error_p=0.05))
    insert_units(conn, eid, "candidate", simulate_units(rng, 50, thumbs_p=0.2, tokens=100, error_p=0.05))
    report = build_report(conn, eid, options=ReportOptions(segments=False, timeseries=False))
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
