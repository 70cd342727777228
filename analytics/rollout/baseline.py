"""What a route's recent traffic says, for the plan check: units and requests per second and
each guardrail's control baseline (mean, per-unit standard deviation).

Read from the most recent experiment on the route that has data (the rollout itself once it
runs): requests and distinct units over the last ``WINDOW_S`` of its primary calls (through
the ``(experiment_id, variant, ts)`` index), and the control variant's per-unit sufficient
statistics over the whole experiment.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import Connection, text

from analytics.report.aggregate import variant_stats
from analytics.report.catalogue import Metric
from analytics.rollout.check import BaselineStat, Traffic
from analytics.stats import MetricKind, estimate

Evidence = tuple[Traffic | None, dict[str, BaselineStat]]
EvidenceSource = Callable[[Connection, str, Sequence[Metric], int | None], Evidence]

WINDOW_S = 900.0
WINDOWS = (60.0, 300.0, 900.0)
MIN_REQUESTS = 50


def _latest_with_data(conn: Connection, route: str, prefer: int | None) -> tuple[int, str] | None:
    row = conn.execute(
        text(
            "SELECT e.id, e.name FROM experiments e WHERE e.route = :r AND EXISTS"
            " (SELECT 1 FROM unit_rollups u WHERE u.experiment_id = e.id)"
            " ORDER BY (e.id = :p) DESC, coalesce(e.started_at, e.created_at) DESC, e.id DESC LIMIT 1"
        ),
        {"r": route, "p": -1 if prefer is None else prefer},
    ).first()
    return None if row is None else (int(row[0]), str(row[1]))


def route_evidence(
    conn: Connection, route: str, metrics: Sequence[Metric], *, prefer: int | None = None
) -> tuple[Traffic | None, dict[str, BaselineStat]]:
    """(traffic, baselines) from the route's latest experiment with data; (None, {}) without."""
    found = _latest_with_data(conn, route, prefer)
    if found is None:
        return None, {}
    eid, name = found
    last = conn.execute(
        text("SELECT max(last_ts) FROM unit_rollups WHERE experiment_id = :e"), {"e": eid}
    ).scalar_one()
    # Distinct units over windows of several lengths (returning users make them grow slower
    # than time), in one pass over the last WINDOW_S through the experiment/ts index.
    cols = ", ".join(f"count(DISTINCT unit_id) FILTER (WHERE ts >= :t{i})" for i in range(len(WINDOWS)))
    params: dict[str, Any] = {"e": eid, "t": last - timedelta(seconds=WINDOW_S)}
    params.update({f"t{i}": last - timedelta(seconds=w) for i, w in enumerate(WINDOWS)})
    row = conn.execute(
        text(
            f"SELECT count(*), min(ts), {cols} FROM interactions"
            " WHERE experiment_id = :e AND role = 'primary' AND ts >= :t"
        ),
        params,
    ).one()
    requests, first, distinct = int(row[0]), row[1], [int(v) for v in row[2:]]
    traffic = None
    if requests >= MIN_REQUESTS and first is not None:
        span = max(10.0, min(WINDOW_S, (last - first).total_seconds()))
        windows = tuple((w, float(u)) for w, u in zip(WINDOWS, distinct, strict=True) if w <= span)
        # beyond the longest full window, units keep arriving at that window's rate
        per_s = windows[-1][1] / windows[-1][0] if windows else distinct[-1] / span
        source = f"route {route}: experiment {name}, last {span:.0f} s"
        traffic = Traffic(per_s, requests / span, source, windows)
    control = conn.execute(
        text("SELECT name FROM variants WHERE experiment_id = :e AND is_control"), {"e": eid}
    ).scalar()
    baselines: dict[str, BaselineStat] = {}
    usable = [m for m in metrics if m.kind != "quantile"]
    if control is None or not usable:
        return traffic, baselines
    pg = conn.connection.driver_connection
    assert isinstance(pg, psycopg.Connection)
    stats = variant_stats(pg, eid, usable)
    for m in usable:
        s = stats.get(m.name, {}).get(str(control))
        if s is None:
            continue
        est = estimate(s, MetricKind(m.kind))
        if est.mean is not None and est.unit_variance is not None:
            baselines[m.name] = BaselineStat(est.mean, math.sqrt(est.unit_variance), "route")
    return traffic, baselines


def fresh_evidence(conn: Connection, route: str, metrics: Sequence[Metric], prefer: int | None) -> Evidence:
    return route_evidence(conn, route, metrics, prefer=prefer)


class EvidenceCache:
    """:func:`route_evidence` remembered for ``ttl_s`` per (route, experiment, metrics).

    The rollout page polls its API every few seconds, and a route's traffic and baselines
    barely move within a minute, while reading them scans up to 15 minutes of calls.
    """

    def __init__(
        self,
        ttl_s: float = 60.0,
        max_entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
        source: EvidenceSource = fresh_evidence,
    ) -> None:
        self.ttl_s, self.max_entries, self.clock, self.source = ttl_s, max_entries, clock, source
        self._lock = threading.Lock()
        self._items: dict[tuple[str, int | None, tuple[str, ...]], tuple[float, Evidence]] = {}

    def __call__(
        self, conn: Connection, route: str, metrics: Sequence[Metric], prefer: int | None
    ) -> Evidence:
        key = (route, prefer, tuple(sorted(m.name for m in metrics)))
        now = self.clock()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
        value = self.source(conn, route, metrics, prefer)
        with self._lock:
            if len(self._items) >= self.max_entries:
                self._items = {k: v for k, v in self._items.items() if now - v[0] < self.ttl_s}
                if len(self._items) >= self.max_entries:
                    self._items.clear()
            self._items[key] = (now, value)
        return value
