"""Analysis snapshots: stored reports, the lift time series read back from them, and the
snapshotter that writes one per running experiment every interval.

A snapshot stores the report without its time series (the series is rebuilt from the
snapshots themselves), so storage grows linearly with the number of snapshots.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import Connection, Engine, text

from analytics.ingest.preperiod import ensure_preperiod
from analytics.report.schema import Interval, Report, TimePoint, TimeSeries

log = logging.getLogger(__name__)


def series_points(report: Report) -> list[dict[str, Any]]:
    """What the time series (and the next report's sequential p-value) read of a snapshot:
    the candidates' rows of the overall table, a few hundred bytes each."""
    return [
        {
            "metric": r.metric,
            "variant": r.variant,
            "units": r.units,
            "lift_relative": r.lift_relative,
            "ci_relative": r.ci_relative.model_dump() if r.ci_relative else None,
            "sequential_ci_relative": r.sequential_ci_relative.model_dump()
            if r.sequential_ci_relative
            else None,
            "p_value_sequential": r.p_value_sequential,
        }
        for r in report.results
        if not r.is_control
    ]


def save_snapshot(conn: Connection, report: Report, source: str = "periodic") -> int:
    """Insert ``report`` (time series stripped) and its series points; return the snapshot id.

    ``source``: "periodic" (the snapshotter; its old bodies are pruned) or "api" (kept).
    """
    body = report.model_copy(update={"timeseries": []}).model_dump_json()
    row = conn.execute(
        text(
            "INSERT INTO analysis_snapshots (experiment_id, report, points, source, created_at)"
            " VALUES (:eid, CAST(:body AS jsonb), CAST(:points AS jsonb), :source, :at) RETURNING id"
        ),
        {
            "eid": report.experiment_id,
            "body": body,
            "points": orjson.dumps(series_points(report)).decode(),
            "source": source,
            "at": report.generated_at,
        },
    ).one()
    return int(row[0])


def latest_snapshot(conn: Connection, experiment_id: int) -> Report | None:
    row = conn.execute(
        text(
            "SELECT report::text FROM analysis_snapshots WHERE experiment_id = :eid AND report IS NOT NULL"
            " ORDER BY created_at DESC, id DESC LIMIT 1"
        ),
        {"eid": experiment_id},
    ).first()
    if row is None:
        return None
    return Report.model_validate_json(row[0])


# Periodic snapshots older than the window keep their series points but lose the report
# body, except the newest of each hour (and the experiment's newest snapshot): storage
# grows by ~1 kB per snapshot instead of tens of kB (a report with tag segments).
_PRUNE_SQL = text(
    """
    UPDATE analysis_snapshots SET report = NULL
    WHERE experiment_id = :eid AND source = 'periodic' AND report IS NOT NULL AND created_at < :before
      AND id NOT IN (
        SELECT DISTINCT ON (date_trunc('hour', created_at AT TIME ZONE 'UTC')) id FROM analysis_snapshots
        WHERE experiment_id = :eid AND source = 'periodic' AND report IS NOT NULL AND created_at < :before
        ORDER BY date_trunc('hour', created_at AT TIME ZONE 'UTC'), created_at DESC, id DESC)
      AND id <> (SELECT id FROM analysis_snapshots WHERE experiment_id = :eid
                 ORDER BY created_at DESC, id DESC LIMIT 1)
    """
)


def prune_snapshots(
    conn: Connection, experiment_id: int, keep_full_s: float, now: datetime | None = None
) -> int:
    """Drop the report bodies of periodic snapshots older than ``keep_full_s`` (one an hour
    stays); returns how many. The time series is unchanged: it reads the points."""
    if keep_full_s <= 0:
        return 0
    before = (now or datetime.now(UTC)) - timedelta(seconds=keep_full_s)
    return int(conn.execute(_PRUNE_SQL, {"eid": experiment_id, "before": before}).rowcount or 0)


# Picks at most :n snapshots evenly spread over the experiment's history (always the
# newest), then unpacks their series points (not the report bodies).
_SERIES_SQL = text(
    """
    WITH ranked AS (
        SELECT id, created_at,
               row_number() OVER (ORDER BY created_at, id) AS rn,
               count(*) OVER () AS cnt
        FROM analysis_snapshots WHERE experiment_id = :eid
    ), chosen AS (
        SELECT id, created_at FROM ranked
        WHERE cnt <= :n OR rn = cnt OR (rn * :n) / cnt <> ((rn - 1) * :n) / cnt
    )
    SELECT c.created_at, r->>'metric', r->>'variant', (r->>'units')::bigint, (r->>'lift_relative')::float8,
           (r->'ci_relative'->>'lower')::float8, (r->'ci_relative'->>'upper')::float8,
           (r->'sequential_ci_relative'->>'lower')::float8, (r->'sequential_ci_relative'->>'upper')::float8
    FROM chosen c
    JOIN analysis_snapshots s ON s.id = c.id
    CROSS JOIN LATERAL jsonb_array_elements(s.points) AS r
    ORDER BY c.created_at, c.id
    """
)


def _interval(lower: float | None, upper: float | None) -> Interval | None:
    if lower is None or upper is None:
        return None
    return Interval.model_construct(lower=lower, upper=upper)


def load_timeseries(conn: Connection, experiment_id: int, max_points: int) -> list[TimeSeries]:
    """Cumulative relative lift and CIs per (metric, candidate) from stored snapshots.

    The points are built without validation (``model_construct``): they come from reports
    this service validated when it stored them, and validating ~4,000 points (200 snapshots
    × 19 metrics) cost more than reading them.
    """
    series: dict[tuple[str, str], list[TimePoint]] = {}
    for at, metric, variant, units, lift, lo, hi, seq_lo, seq_hi in conn.execute(
        _SERIES_SQL, {"eid": experiment_id, "n": max_points}
    ):
        series.setdefault((metric, variant), []).append(
            TimePoint.model_construct(
                t=at,
                units=int(units or 0),
                lift_relative=lift,
                ci_relative=_interval(lo, hi),
                sequential_ci_relative=_interval(seq_lo, seq_hi),
            )
        )
    return [TimeSeries.model_construct(metric=m, variant=v, points=pts) for (m, v), pts in series.items()]


def with_current_point(series: list[TimeSeries], report: Report) -> list[TimeSeries]:
    """Append the report's own estimate (when it is newer than the last stored point)."""
    by_key = {(s.metric, s.variant): list(s.points) for s in series}
    for r in report.results:
        if r.is_control:
            continue
        points = by_key.setdefault((r.metric, r.variant), [])
        if points and points[-1].t >= report.generated_at:
            continue
        points.append(
            TimePoint(
                t=report.generated_at,
                units=r.units,
                lift_relative=r.lift_relative,
                ci_relative=r.ci_relative,
                sequential_ci_relative=r.sequential_ci_relative,
            )
        )
    return [TimeSeries(metric=m, variant=v, points=p) for (m, v), p in by_key.items()]


def running_experiments(conn: Connection) -> list[int]:
    rows = conn.execute(text("SELECT id FROM experiments WHERE status = 'running' ORDER BY id"))
    return [int(r[0]) for r in rows]


@dataclass(frozen=True, slots=True)
class Snapshotter:
    """Snapshots every running experiment each ``interval_s`` until ``stop`` is set."""

    engine: Engine
    build: Callable[[Connection, int, datetime | None], Report]
    interval_s: float
    on_built: Callable[[float, bool], None] = lambda seconds, ok: None
    keep_full_s: float = 86_400.0  # report bodies older than this: one an hour is kept

    def snapshot_all(self) -> int:
        """One round; returns how many snapshots were written. Errors are per experiment."""
        with self.engine.connect() as conn:
            ids = running_experiments(conn)
        written = 0
        for eid in ids:
            started = time.perf_counter()
            try:
                with self.engine.begin() as conn:
                    # CUPED covariates: computed once per experiment, then one indexed lookup.
                    ensure_preperiod(conn, eid)
                with self.engine.begin() as conn:
                    save_snapshot(conn, self.build(conn, eid, None))
                    prune_snapshots(conn, eid, self.keep_full_s)
                written += 1
                self.on_built(time.perf_counter() - started, True)
            except Exception:
                # One broken experiment must not stop snapshots of the others.
                log.exception("snapshot of experiment %s failed", eid)
                self.on_built(time.perf_counter() - started, False)
        return written

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.snapshot_all()
            except Exception:
                log.exception("snapshot round failed; retrying after the interval")
            stop.wait(self.interval_s)
