"""Sufficient statistics per variant, computed in SQL from the per-unit rollups.

``variant_stats`` builds ONE aggregate query over ``unit_rollups`` (or ``segment_rollups``
for a tag segment) grouped by variant: every metric's Σx, Σx², Σy, Σy², Σxy (and the
CUPED sums with the pre-period covariate) in one SELECT. Each (x, y) pair is one shared
``regr_*`` transition state, identical pairs are computed once, all rollup measures are
float8 and no JSONB is touched unless a user metric reads ``counters`` — on 1M units the
query is a parallel seq scan of a few hundred ms (bench/ingest/README.md).

Quantile metrics have no per-unit sums here: ``histograms`` returns their request-level
log-bucketed counts (``bucket_bounds`` maps a bucket to its ms range).

A metric whose SQL the database cannot evaluate on this data (a float overflow: a user
expression multiplying large sums, or rollups stored before values were bounded) must not
take the others down: given a ``failed`` dict, ``isolated`` reruns each metric alone in a
savepoint after such an error, records why the failing ones failed, and computes the rest.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from analytics.db import AnyConn, fetch_all
from analytics.report.catalogue import Metric, expression_sql

# The histograms' one bucket rule (re-exported: the report reads its buckets with it).
from analytics.stats.quantile import BUCKETS_PER_E as BUCKETS_PER_E
from analytics.stats.quantile import bucket_bounds as bucket_bounds
from analytics.stats.quantile import bucket_of as bucket_of
from analytics.stats.sufficient import SampleStats

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a metric's expression can make the database refuse: data errors (numeric overflow,
# class 22) and, for a definition stored by an older version, SQL it cannot run (class 42).
_METRIC_ERRORS = (psycopg.DataError, psycopg.ProgrammingError)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The regr_* aggregate pairs making up each metric's SampleStats."""

    pairs: list[tuple[str, str]]  # distinct (a, b) SQL expressions, in SELECT order
    fields: dict[str, list[tuple[str, int]]]  # metric -> [(role, pair index)]


def _x_sql(metric: Metric, alias: str, coalesce: bool) -> str:
    assert metric.numerator is not None
    num = expression_sql(metric.numerator, alias, coalesce=coalesce)
    if metric.kind == "proportion":
        return f"(CASE WHEN {num} > 0 THEN 1.0::float8 ELSE 0.0::float8 END)"
    return num


def _plan(metrics: Sequence[Metric], with_covariate: bool) -> _Plan:
    pairs: list[tuple[str, str]] = []
    index: dict[tuple[str, str], int] = {}

    def add(a: str, b: str) -> int:
        if (a, b) not in index:
            index[(a, b)] = len(pairs)
            pairs.append((a, b))
        return index[(a, b)]

    fields: dict[str, list[tuple[str, int]]] = {}
    for m in metrics:
        if m.kind == "quantile":
            continue
        x = _x_sql(m, "r", False)
        y = expression_sql(m.denominator, "r") if m.kind == "ratio" and m.denominator else None
        c = _x_sql(m, "p", True) if with_covariate else None
        roles: list[tuple[str, int]] = [("xy" if y else "xx", add(x, y or x))]
        if c is not None:
            roles.append(("xc", add(x, c)))
            if y is not None:
                roles.append(("yc", add(y, c)))
        fields[m.name] = roles
    return _Plan(pairs, fields)


# regr_*(Y, X) over one (a, b) pair share a single transition state (float8_regr_accum:
# N, Σb, Σb², Σa, Σa², Σab in one call per row), so each pair costs one call per row
# instead of five sum() calls. Sums are recovered from the centred moments.
_REGR = ("regr_avgx", "regr_avgy", "regr_sxx", "regr_syy", "regr_sxy")


def _moments(n: int, v: Sequence[object]) -> tuple[float, float, float, float, float]:
    """(Σa, Σa², Σb, Σb², Σab) from regr_avgx/avgy/sxx/syy/sxy of regr(b, a)."""
    ma, mb, saa, sbb, sab = (float(x) if isinstance(x, int | float) else 0.0 for x in v)
    return n * ma, saa + n * ma * ma, n * mb, sbb + n * mb * mb, sab + n * ma * mb


def _stats(n: int, roles: list[tuple[str, int]], pair_values: Sequence[Sequence[object]]) -> SampleStats:
    kw: dict[str, float] = {}
    for role, i in roles:
        sa, saa, sb, sbb, sab = _moments(n, pair_values[i])
        if role == "xx":
            kw |= {"sum_x": sa, "sum_x2": saa}
        elif role == "xy":
            kw |= {"sum_x": sa, "sum_x2": saa, "sum_y": sb, "sum_y2": sbb, "sum_xy": sab}
        elif role == "xc":
            kw |= {"sum_c": sb, "sum_c2": sbb, "sum_xc": sab}
        else:  # yc
            kw["sum_yc"] = sab
    return SampleStats(n=n, **kw)


@contextlib.contextmanager
def _savepoint(conn: AnyConn) -> Iterator[None]:
    """A savepoint in the caller's transaction (an Engine runs each query in its own)."""
    if isinstance(conn, psycopg.Connection):
        with conn.transaction():
            yield
    elif isinstance(conn, Connection | Session):
        with conn.begin_nested():
            yield
    else:
        assert isinstance(conn, Engine)
        yield


def _reason(exc: Exception) -> str:
    diag = getattr(exc, "diag", None)
    text = diag.message_primary if diag is not None and diag.message_primary else str(exc).splitlines()[0]
    return f"the database could not compute it: {text}"


def isolated(
    conn: AnyConn,
    metrics: Sequence[Metric],
    run: Callable[[Sequence[Metric]], T],
    failed: dict[str, str] | None,
) -> T:
    """``run(metrics)``; with ``failed`` given, a metric the database cannot compute is
    dropped (its reason recorded in ``failed``) instead of failing the whole call."""
    if failed is None:
        return run(metrics)
    try:
        with _savepoint(conn):
            return run(metrics)
    except _METRIC_ERRORS as exc:
        log.warning("metric statistics failed (%s); computing each metric alone", type(exc).__name__)
    ok: list[Metric] = []
    for m in metrics:
        try:
            with _savepoint(conn):
                run([m])
            ok.append(m)
        except _METRIC_ERRORS as exc:
            failed[m.name] = _reason(exc)
    return run(ok)


def variant_stats(
    conn: AnyConn,
    experiment_id: int,
    metrics: Sequence[Metric],
    segment: str = "",
    *,
    with_covariate: bool = False,
    until: datetime | None = None,
    failed: dict[str, str] | None = None,
) -> dict[str, dict[str, SampleStats]]:
    """metric name -> variant -> SampleStats over units (quantile metrics are skipped).

    One query: ``unit_rollups`` for segment '', ``segment_rollups`` for 'tag=value'.
    ``with_covariate`` adds the CUPED sums: c_i is the metric's per-unit numerator value
    (the indicator for proportions) from the unit's pre-period rollup, 0 for units
    without history (see ``analytics.ingest.preperiod``). ``until`` keeps only units first seen
    at or before it (their sums still include later activity — the exact time series
    comes from stored snapshots). ``failed``: see ``isolated``.
    """
    return isolated(
        conn,
        metrics,
        lambda ms: _variant_stats(conn, experiment_id, ms, segment, with_covariate, until),
        failed,
    )


def _variant_stats(
    conn: AnyConn,
    experiment_id: int,
    metrics: Sequence[Metric],
    segment: str,
    with_covariate: bool,
    until: datetime | None,
) -> dict[str, dict[str, SampleStats]]:
    plan = _plan(metrics, with_covariate)
    cols = ", ".join(["count(*)", *(f"{f}({b}, {a})" for a, b in plan.pairs for f in _REGR)])
    join = (
        " LEFT JOIN preperiod_rollups p ON p.experiment_id = r.experiment_id AND p.unit_id = r.unit_id"
        if with_covariate
        else ""
    )
    params: list[object] = [experiment_id]
    if segment:
        table, where = "segment_rollups", "r.experiment_id = %s AND r.segment = %s"
        params.append(segment)
    else:
        table, where = "unit_rollups", "r.experiment_id = %s"
    if until is not None:
        where += " AND r.first_ts <= %s"
        params.append(until)
    sql = f"SELECT r.variant, {cols} FROM {table} r{join} WHERE {where} GROUP BY r.variant"
    out: dict[str, dict[str, SampleStats]] = {name: {} for name in plan.fields}
    k = len(_REGR)
    for row in fetch_all(conn, sql, params):
        variant, n, values = str(row[0]), int(row[1]), row[2:]
        pair_values = [values[i * k : (i + 1) * k] for i in range(len(plan.pairs))]
        for name, roles in plan.fields.items():
            out[name][variant] = _stats(n, roles, pair_values)
    return out


def unit_counts(conn: AnyConn, experiment_id: int) -> dict[str, int]:
    """Units per variant (whole experiment), for the SRM check."""
    rows = fetch_all(
        conn,
        "SELECT variant, count(*) FROM unit_rollups WHERE experiment_id = %s GROUP BY variant",
        (experiment_id,),
    )
    return {str(v): int(n) for v, n in rows}


def segments(conn: AnyConn, experiment_id: int) -> list[str]:
    """Segments with data: '' then 'tag=value' sorted (a loose index scan of segment_rollups)."""
    rows = fetch_all(
        conn,
        """
        WITH RECURSIVE s(segment) AS (
            (SELECT segment FROM segment_rollups WHERE experiment_id = %(e)s ORDER BY segment LIMIT 1)
            UNION ALL
            SELECT (SELECT u.segment FROM segment_rollups u
                    WHERE u.experiment_id = %(e)s AND u.segment > s.segment ORDER BY u.segment LIMIT 1)
            FROM s WHERE s.segment IS NOT NULL
        )
        SELECT segment FROM s WHERE segment IS NOT NULL
        """,
        {"e": experiment_id},
    )
    exists = fetch_all(conn, "SELECT 1 FROM unit_rollups WHERE experiment_id = %s LIMIT 1", (experiment_id,))
    return ([""] if exists else []) + [str(r[0]) for r in rows]


def histograms(
    conn: AnyConn, experiment_id: int, metric: str | Metric, segment: str = ""
) -> dict[str, list[tuple[int, int]]]:
    """variant -> [(bucket, count)] sorted by bucket, for ``latency`` or ``ttft``.

    ``metric`` may be the histogram name or a quantile Metric.
    """
    name = metric.histogram if isinstance(metric, Metric) else metric
    rows = fetch_all(
        conn,
        "SELECT variant, bucket, count FROM latency_histograms"
        " WHERE experiment_id = %s AND metric = %s AND segment = %s ORDER BY variant, bucket",
        (experiment_id, name, segment),
    )
    out: dict[str, list[tuple[int, int]]] = {}
    for variant, bucket, count in rows:
        out.setdefault(str(variant), []).append((int(bucket), int(count)))
    return out


def histogram_quantile(buckets: Sequence[tuple[int, int]], q: float) -> float | None:
    """The q-quantile (ms) of a bucketed histogram, interpolated geometrically inside the bucket."""
    total = sum(c for _, c in buckets)
    if total == 0:
        return None
    target = q * total
    seen = 0.0
    for bucket, count in buckets:
        if seen + count >= target:
            lo, hi = bucket_bounds(bucket)
            frac = (target - seen) / count if count else 0.0
            return float(lo * (hi / lo) ** frac)
        seen += count
    return bucket_bounds(buckets[-1][0])[1]
