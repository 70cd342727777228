"""The route's recent traffic and baselines for the plan check (real PostgreSQL and ingest)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy import Connection, Engine, text

from analytics.report.catalogue import BUILTINS, Metric
from analytics.rollout.baseline import Evidence, EvidenceCache, route_evidence
from tests.analytics.rollout.synthetic import Clock, Profile, create_rollout, make_traffic


def test_a_routes_traffic_and_control_baselines_are_read_from_its_latest_experiment(engine: Engine) -> None:
    eid, _, salt = create_rollout(engine, None)
    with engine.begin() as conn:  # serve 50/50 so both arms have data
        conn.execute(text("UPDATE variants SET weight = 50 WHERE experiment_id = :e"), {"e": eid})
        route = str(
            conn.execute(text("SELECT route FROM experiments WHERE id = :e"), {"e": eid}).scalar_one()
        )
    control = Profile(error_p=0.02, latency_ms=400.0)
    traffic = make_traffic(
        engine, eid, salt, Profile(error_p=0.02), control=control, seed=41, fresh_units=True
    )
    clock = Clock()
    for _ in range(200):  # 400 s at 10 requests/s, one request per new unit
        clock.step(2.0)
        traffic.step(clock.now, 20)
    metrics = [BUILTINS["error_rate"], BUILTINS["latency_mean"], BUILTINS["latency_p95"]]
    with engine.connect() as conn:
        seen, baselines = route_evidence(conn, route, metrics)
        nothing = route_evidence(conn, "no-such-route", metrics)
    assert seen is not None and "experiment" in seen.source
    assert seen.requests_per_s == pytest.approx(10.0, rel=0.02)
    # windows no longer than the data: 60 s and 300 s, each with 10 new units per second
    assert [w for w, _ in seen.windows] == [60.0, 300.0]
    assert seen.units_in(60) == pytest.approx(600, rel=0.05) and seen.units_in(300) == pytest.approx(
        3000, rel=0.02
    )
    assert baselines["error_rate"].mean == pytest.approx(0.02, abs=0.01)
    assert baselines["latency_mean"].mean == pytest.approx(
        400 * 1.08, rel=0.1
    )  # lognormal(log 400, 0.4) mean
    assert baselines["latency_mean"].sd is not None and baselines["latency_mean"].sd > 50
    assert "latency_p95" not in baselines  # quantiles have no per-unit baseline
    assert nothing == (None, {})


def test_the_evidence_cache_reads_a_route_once_per_minute() -> None:
    calls: list[str] = []
    now = [0.0]

    def source(conn: Connection, route: str, metrics: Sequence[Metric], prefer: int | None) -> Evidence:
        calls.append(route)
        return None, {}

    cache = EvidenceCache(ttl_s=60.0, clock=lambda: now[0], source=source)
    conn = object()
    metrics = [BUILTINS["error_rate"]]
    for _ in range(5):
        cache(conn, "r", metrics, 1)  # type: ignore[arg-type]
    now[0] = 61.0
    cache(conn, "r", metrics, 1)  # type: ignore[arg-type]
    cache(conn, "other", metrics, 1)  # type: ignore[arg-type]
    assert calls == ["r", "r", "other"]
