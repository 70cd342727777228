"""variant_stats & co. against numpy on the raw per-unit arrays (real PostgreSQL)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from analytics.ingest.preperiod import compute_preperiod, ensure_preperiod
from analytics.ingest.write import ingest
from analytics.report.aggregate import histogram_quantile, histograms, segments, unit_counts, variant_stats
from analytics.report.catalogue import BUILTINS, Metric, parse_spec
from analytics.stats.sufficient import SampleStats
from contracts.events import Event, InteractionEvent
from tests.analytics.ingest_helpers import (
    connect,
    declared_experiment,
    expected_rollups,
    feedback,
    interaction,
    new_experiment_id,
    random_events,
)


def _value(expr: str, m: dict[str, Any]) -> float:
    """Evaluate a catalogue expression on one unit's measures, in Python (independent of SQL)."""
    env = {k: v for k, v in m.items() if k != "counters"}
    counters = m.get("counters", {})

    class _C:
        def __getitem__(self, k: str) -> float:
            return float(counters.get(k, 0.0))

    # Python's own arithmetic on the same expression; x / 0 counts as 0, like the SQL.
    try:
        return float(eval(expr, {"counters": _C()}, env))
    except ZeroDivisionError:
        return 0.0


def _unit_arrays(metric: Metric, units: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray | None]:
    assert metric.numerator is not None
    x = np.array([_value(metric.numerator, u) for u in units])
    if metric.kind == "proportion":
        x = (x > 0).astype(float)
    y = np.array([_value(metric.denominator, u) for u in units]) if metric.denominator else None
    return x, y


def _assert_stats(got: SampleStats, x: np.ndarray, y: np.ndarray | None) -> None:
    assert got.n == len(x)

    def approx(v: Any) -> Any:
        return pytest.approx(float(v), rel=1e-9, abs=1e-6)

    assert got.sum_x == approx(x.sum())
    assert got.sum_x2 == approx((x * x).sum())
    if y is not None:
        assert got.sum_y == approx(y.sum())
        assert got.sum_y2 == approx((y * y).sum())
        assert got.sum_xy == approx((x * y).sum())


def _by_variant(exp: int, events: list[Event], segment: str = "") -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for (e, seg, variant, _unit), m in expected_rollups(events).items():
        if e == exp and seg == segment:
            out.setdefault(variant, []).append(m)
    return out


USER_METRICS = [
    parse_spec(
        {
            "name": "signal_per_request",
            "kind": "ratio",
            "numerator": "counters['my_signal']",
            "denominator": "requests",
        }
    ),
    parse_spec(
        {"name": "chars_per_token", "kind": "mean", "numerator": "response_chars / (completion_tokens + 1)"}
    ),
    parse_spec({"name": "any_error", "kind": "proportion", "numerator": "errors - 0.5 * fallbacks"}),
]


@pytest.mark.parametrize("segment", ["", "task=code"])
def test_variant_stats_equal_numpy_sums_over_units(database_url: str, segment: str) -> None:
    exp = declared_experiment(database_url)
    events = random_events(exp, 3000, random.Random(11), units=400)
    metrics = [*BUILTINS.values(), *USER_METRICS]
    with connect(database_url) as conn:
        ingest(conn, events)
        stats = variant_stats(conn, exp, metrics, segment)
    want = _by_variant(exp, events, segment)
    assert set(stats) == {m.name for m in metrics if m.kind != "quantile"}
    for m in metrics:
        if m.kind == "quantile":
            continue
        assert set(stats[m.name]) == set(want), m.name
        for variant, units in want.items():
            x, y = _unit_arrays(m, units)
            _assert_stats(stats[m.name][variant], x, y)


def test_unit_counts_segments_and_histogram_quantiles(database_url: str) -> None:
    exp = declared_experiment(database_url)
    rng = random.Random(5)
    events: list[Event] = [
        interaction(
            exp, v, f"{v}-{i % 40}", latency_ms=rng.lognormvariate(6, 0.7), tags={"lang": rng.choice("ab")}
        )
        for i in range(2000)
        for v in ("control", "candidate")
    ]
    with connect(database_url) as conn:
        ingest(conn, events)
        counts = unit_counts(conn, exp)
        segs = segments(conn, exp)
        hist = histograms(conn, exp, BUILTINS["latency_p95"])
    assert counts == {"control": 40, "candidate": 40}
    assert segs == ["", "lang=a", "lang=b"]
    for v in ("control", "candidate"):
        lat = np.array([e.latency_ms for e in events if isinstance(e, InteractionEvent) and e.variant == v])
        assert sum(c for _, c in hist[v]) == len(lat)
        for q in (0.5, 0.95):
            est = histogram_quantile(hist[v], q)
            assert est is not None
            assert est == pytest.approx(float(np.quantile(lat, q)), rel=0.06)


def test_until_keeps_only_units_first_seen_by_then(database_url: str) -> None:
    exp = new_experiment_id()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    early = interaction(exp, "control", "early", ts=t0.timestamp())
    late = interaction(exp, "control", "late", ts=(t0 + timedelta(hours=1)).timestamp())
    with connect(database_url) as conn:
        ingest(conn, [early, late])
        stats = variant_stats(conn, exp, [BUILTINS["error_rate"]], until=t0 + timedelta(minutes=30))
    assert stats["error_rate"]["control"].n == 1


def test_cuped_sums_use_each_units_own_pre_period_history(database_url: str) -> None:
    rng = random.Random(9)
    route = f"route-{new_experiment_id()}"
    started = datetime(2026, 3, 1, tzinfo=UTC)
    with connect(database_url) as conn:
        row = conn.execute(
            b"INSERT INTO experiments (name, route, mode, status, salt, started_at)"
            b" VALUES (%s, %s, 'ab', 'running', 's', %s) RETURNING id",
            (route, route, started),
        ).fetchone()
        assert row is not None
        exp = int(row[0])
        pre: list[Event] = []
        for i in range(300):
            ev = interaction(
                None,
                None,
                f"u{i % 60}",
                route=route,
                ts=(started - timedelta(hours=1 + i)).timestamp(),
                completion_tokens=rng.randrange(1, 100),
            )
            pre.append(ev)
            if rng.random() < 0.5:
                pre.append(feedback(ev, "thumbs_up"))
        other_route = interaction(
            None, None, "u1", route="elsewhere", ts=(started - timedelta(hours=2)).timestamp()
        )
        during: list[Event] = [
            interaction(
                exp,
                "control" if i % 2 else "candidate",
                f"u{i % 80}",
                route=route,
                ts=(started + timedelta(minutes=i)).timestamp(),
                completion_tokens=rng.randrange(1, 100),
            )
            for i in range(400)
        ]
        ingest(conn, [*pre, other_route, *during])
        conn.commit()
        assert ensure_preperiod(conn, exp) is True
        assert compute_preperiod(conn, exp) == 60
        metrics = [BUILTINS["completion_tokens_per_response"], BUILTINS["thumbs_up_units"]]
        stats = variant_stats(conn, exp, metrics, with_covariate=True)
    # Pre-period rollups per unit, computed in Python.
    pre_m: dict[str, dict[str, float]] = {}
    by_req = {e.request_id: e for e in pre if isinstance(e, InteractionEvent)}
    for e in pre:
        if isinstance(e, InteractionEvent):
            m = pre_m.setdefault(e.unit_id, {"completion_tokens": 0.0, "requests": 0.0, "thumbs_up": 0.0})
            m["completion_tokens"] += e.completion_tokens or 0
            m["requests"] += 1
        else:
            pre_m[by_req[e.request_id].unit_id]["thumbs_up"] += 1
    unit_of = {
        (variant, unit): m for (_, seg, variant, unit), m in expected_rollups(during).items() if seg == ""
    }
    for variant in ("control", "candidate"):
        units = sorted(u for (v, u) in unit_of if v == variant)
        x = np.array([unit_of[(variant, u)]["completion_tokens"] for u in units])
        y = np.array([unit_of[(variant, u)]["requests"] for u in units])
        c = np.array([pre_m.get(u, {}).get("completion_tokens", 0.0) for u in units])
        got = stats["completion_tokens_per_response"][variant]
        assert got.sum_c == pytest.approx(c.sum())
        assert got.sum_c2 == pytest.approx((c * c).sum())
        assert got.sum_xc == pytest.approx((x * c).sum())
        assert got.sum_yc == pytest.approx((y * c).sum())
        cp = np.array([float(pre_m.get(u, {}).get("thumbs_up", 0.0) > 0) for u in units])
        assert stats["thumbs_up_units"][variant].sum_c == pytest.approx(cp.sum())
