"""Shadow experiments: candidate vs baseline on the same prompts.

A shadow call carries ``pair_id`` = the request id of the primary call the user saw, so
joining ``interactions`` on it gives pairs answered by both models. The read is bounded:
the most recent ``max_pairs`` shadow calls of one candidate inside a time window (index
range on ``(experiment_id, variant, ts)`` + the request-id index for the primary).
Sums are formed in SQL and handed to the statistics engine's paired tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection, text

from analytics.report.comparison import error
from analytics.report.schema import Interval, PairedComparison, PairedMetric
from analytics.stats.paired import agreement, mcnemar, paired_test
from analytics.stats.sufficient import SampleStats

_VALUES = {
    "latency_ms": ("s.latency_ms", "p.latency_ms"),
    "response_chars": ("s.response_chars::float8", "p.response_chars::float8"),
    "completion_tokens": (
        "coalesce(s.completion_tokens, 0)::float8",
        "coalesce(p.completion_tokens, 0)::float8",
    ),
    "error": ("(s.status <> 'ok')::int::float8", "(p.status <> 'ok')::int::float8"),
}


def _pairs_sql() -> str:
    cols = []
    for name, (x, y) in _VALUES.items():
        cols += [f"{x} AS {name}_x", f"{y} AS {name}_y"]
    sums = ["count(*)", "min(ts)", "max(ts)"]
    for name in _VALUES:
        x, y = f"{name}_x", f"{name}_y"
        sums += [f"sum({x})", f"sum({x}*{x})", f"sum({y})", f"sum({y}*{y})", f"sum({x}*{y})"]
    sums += [
        "count(*) FILTER (WHERE error_x = 1 AND error_y = 0)",
        "count(*) FILTER (WHERE error_x = 0 AND error_y = 1)",
        "count(*) FILTER (WHERE same_content IS NOT NULL)",
        "count(*) FILTER (WHERE same_content)",
        "count(*) FILTER (WHERE same_outcome)",
    ]
    return f"""
        WITH pairs AS (
            SELECT s.ts, {", ".join(cols)},
                   CASE WHEN s.response IS NOT NULL AND p.response IS NOT NULL
                        THEN s.response = p.response END AS same_content,
                   (s.status = p.status AND coalesce(s.finish_reason, '') = coalesce(p.finish_reason, ''))
                       AS same_outcome
            FROM interactions s
            JOIN interactions p ON p.request_id = s.pair_id AND p.role = 'primary'
                                AND p.experiment_id = s.experiment_id AND p.variant = :baseline
            WHERE s.experiment_id = :e AND s.variant = :v AND s.role = 'shadow'
              AND s.ts > :since AND s.ts <= :until
            ORDER BY s.ts DESC
            LIMIT :limit
        )
        SELECT {", ".join(sums)} FROM pairs
    """


_SQL = text(_pairs_sql())


def _iv(lo: float | None, hi: float | None) -> Interval | None:
    return None if lo is None or hi is None else Interval(lower=lo, upper=hi)


def paired_comparison(
    conn: Connection, experiment_id: int, baseline: str, variant: str, until: datetime,
    window_s: float, max_pairs: int, alpha: float,
) -> PairedComparison:  # fmt: skip
    since = until - timedelta(seconds=window_s)
    row = conn.execute(
        _SQL,
        {
            "e": experiment_id,
            "v": variant,
            "baseline": baseline,
            "since": since,
            "until": until,
            "limit": max_pairs,
        },
    ).one()
    n, first, last = int(row[0]), row[1], row[2]
    vals = [float(v or 0.0) for v in row[3:]]
    metrics: list[PairedMetric] = []
    for i, name in enumerate(_VALUES):
        sx, sx2, sy, sy2, sxy = vals[i * 5 : i * 5 + 5]
        res = paired_test(SampleStats(n=n, sum_x=sx, sum_x2=sx2, sum_y=sy, sum_y2=sy2, sum_xy=sxy), alpha)
        p = res.difference.p_value if res.difference is not None else None
        if name == "error":
            cand_only, base_only = int(vals[20]), int(vals[21])
            p = mcnemar(base_only, cand_only).p_value
        metrics.append(
            PairedMetric(
                name=name, pairs=n,
                baseline_mean=res.baseline_mean if res.baseline_mean is not None else (sy / n if n else None),
                candidate_mean=res.candidate_mean if res.candidate_mean is not None else (sx / n if n else None),
                mean_difference=res.difference.estimate if res.difference else ((sx - sy) / n if n else None),
                ci=_iv(res.difference.lower, res.difference.upper) if res.difference else None,
                p_value=p,
                error=error(str(res.error), res.message) if res.error is not None and name != "error" else None,
            )
        )  # fmt: skip
    content_n, content_same, outcome_same = int(vals[22]), int(vals[23]), int(vals[24])
    if content_n:
        agree, basis = agreement(content_same, content_n, alpha).rate, "identical response content"
    elif n:
        agree, basis = (
            agreement(outcome_same, n, alpha).rate,
            "same status and finish reason (no content logged)",
        )
    else:
        agree, basis = None, None
    return PairedComparison(
        variant=variant, baseline=baseline, window_start=first, window_end=last, pairs=n,
        sampled=n >= max_pairs, metrics=metrics, agreement=agree, agreement_basis=basis,
        error=None if n else error("no_data", "no shadow pairs in the window"),
    )  # fmt: skip


def paired_comparisons(
    conn: Connection, experiment_id: int, baseline: str | None, candidates: Sequence[str], until: datetime,
    window_s: float, max_pairs: int, alpha: float,
) -> list[PairedComparison]:  # fmt: skip
    if baseline is None:
        return []
    return [
        paired_comparison(conn, experiment_id, baseline, v, until, window_s, max_pairs, alpha)
        for v in candidates
    ]
