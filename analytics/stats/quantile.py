"""Quantile metrics (latency p50/p95/p99) from log-bucketed histograms.

Histogram: bucket k holds values in [e^{k/s}, e^{(k+1)/s}) with s = ``BUCKETS_PER_E``
= 20 (the ingest's ``floor(20·ln(ms))``; each bucket is ≈5.1% wide). Within a bucket
values are interpolated geometrically, so the resolution error is well below 5%.

Estimate: the value at rank q·N. CI (order-statistic / binomial method): the number of
observations below the true quantile is Binomial(N, q), so ranks
q·N ± z_{1−α/2}·sqrt(N·q(1−q)·D) bracket it with probability ≈ 1 − α; the values at
those ranks are the CI (D = design effect, below). Difference between variants:
SE_v ≈ (upper_v − lower_v)/(2z) per variant, Δ = Q_t − Q_c with SE sqrt(SE_t² + SE_c²),
relative Δ/Q_c with the delta method; normal p-value.

Clustering caveat: a histogram counts requests, but requests of one unit are
correlated (a slow network, a long-prompt user), so N overstates the information.
Pass ``design_effect`` D to widen the CI: Kish's 1 + (m̄ − 1)·ICC (m̄ requests per unit,
ICC the intra-unit correlation; :func:`design_effect`), or D estimated from the per-unit
sums of the same requests (:func:`estimated_design_effect`); D = 1 assumes independent
requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, check_alpha, finite, numeric_message
from analytics.stats.estimate import MetricKind, estimate
from analytics.stats.lift import Interval
from analytics.stats.sufficient import SampleStats

# Defined with the table (the ingest fold reads them without importing the statistics).
from contracts.tables import BUCKETS_PER_E as BUCKETS_PER_E
from contracts.tables import MIN_BUCKETED as MIN_BUCKETED


def bucket_of(value: float, buckets_per_e: int = BUCKETS_PER_E) -> int:
    """The histogram bucket of a value: the one rule, which ingest applies in SQL
    (``analytics.ingest.rollups.bucket_sql``; the two agree on every float, boundaries too)."""
    return math.floor(math.log(max(value, MIN_BUCKETED)) * buckets_per_e)


def bucket_bounds(bucket: int, buckets_per_e: int = BUCKETS_PER_E) -> tuple[float, float]:
    return math.exp(bucket / buckets_per_e), math.exp((bucket + 1) / buckets_per_e)


def design_effect(mean_cluster_size: float, icc: float) -> float:
    """Kish's design effect 1 + (m̄ − 1)·ICC for requests clustered in units."""
    return max(1.0, 1.0 + (mean_cluster_size - 1.0) * icc)


def estimated_design_effect(
    per_unit: SampleStats, histogram: Mapping[int, int], buckets_per_e: int = BUCKETS_PER_E
) -> float:
    """Design effect of the requests in ``histogram``, estimated from per-unit sums.

    ``per_unit`` sums the same requests per unit with x = Σ value, y = number of
    requests (e.g. ``latency_sum`` / ``requests`` rollups). D = Var_delta(mean per
    request) / (σ²_request / N), σ²_request from the histogram (bucket midpoints): how
    much clustering in units inflates the variance of the mean. Used as a proxy for the
    quantile's design effect (it is conservative when heavy tails dominate the mean).
    Returns 1.0 when it cannot be computed.
    """
    try:
        est = estimate(per_unit, MetricKind.RATIO)
        pairs = [(math.exp((k + 0.5) / buckets_per_e), int(c)) for k, c in histogram.items() if c > 0]
        n = sum(c for _, c in pairs)
        if est.variance is None or n < 2:
            return 1.0
        mean = sum(v * c for v, c in pairs) / n
        var = sum(c * (v - mean) ** 2 for v, c in pairs) / (n - 1)
        deff = est.variance * per_unit.sum_y / var if var > 0.0 else 1.0
    except NUMERIC_ERRORS:
        return 1.0
    return max(1.0, deff) if math.isfinite(deff) else 1.0


@dataclass(frozen=True, slots=True)
class QuantileEstimate:
    q: float
    n: int  # observations (requests) in the histogram
    estimate: float | None
    lower: float | None
    upper: float | None
    std_error: float | None  # (upper − lower)/(2z): for differences
    design_effect: float
    resolution: float  # relative width of one bucket
    error: ErrorCode | None = None
    message: str | None = None


def _value_at_rank(rank: float, buckets: list[tuple[int, int]], s: int) -> float:
    """Value of the rank-th smallest observation (1-based, fractional allowed)."""
    cum = 0
    for k, count in buckets:
        if rank <= cum + count:
            frac = min(1.0, max(0.0, (rank - cum) / count))
            return math.exp((k + frac) / s)
        cum += count
    k = buckets[-1][0]
    return math.exp((k + 1) / s)


def _quantile_ci(
    histogram: Mapping[int, int],
    q: float,
    alpha: float = 0.05,
    design_effect: float = 1.0,
    buckets_per_e: int = BUCKETS_PER_E,
) -> QuantileEstimate:
    """The q-quantile of a bucketed histogram ({bucket: count}) with its (1 − alpha) CI."""
    buckets = sorted((k, int(c)) for k, c in histogram.items() if c > 0)
    n = sum(c for _, c in buckets)
    res = math.exp(1.0 / buckets_per_e) - 1.0

    def fail(code: ErrorCode, msg: str) -> QuantileEstimate:
        return QuantileEstimate(q, n, None, None, None, None, design_effect, res, code, msg)

    if (msg := check_alpha(alpha)) is not None or not (0.0 < q < 1.0) or design_effect < 1.0:
        return fail(ErrorCode.INVALID_INPUT, msg or "q must lie in (0, 1) and design_effect >= 1")
    if n == 0:
        return fail(ErrorCode.NO_DATA, "the histogram is empty")
    if n < 2:
        return fail(ErrorCode.TOO_FEW_UNITS, "fewer than 2 observations")
    z = float(sps.norm.ppf(1.0 - alpha / 2.0))
    half = z * math.sqrt(n * q * (1.0 - q) * design_effect)
    est = _value_at_rank(q * n, buckets, buckets_per_e)
    lo = _value_at_rank(max(0.0, q * n - half), buckets, buckets_per_e)
    hi = _value_at_rank(min(float(n) + 1.0, q * n + half + 1.0), buckets, buckets_per_e)
    return QuantileEstimate(
        q, n, finite(est), finite(lo), finite(hi), finite((hi - lo) / (2.0 * z)), design_effect, res
    )


@dataclass(frozen=True, slots=True)
class QuantileDiff:
    control: QuantileEstimate
    treatment: QuantileEstimate
    absolute: Interval | None
    relative: Interval | None
    error: ErrorCode | None = None
    message: str | None = None


def _quantile_diff(c: QuantileEstimate, t: QuantileEstimate, alpha: float) -> QuantileDiff:
    for name, e in (("control", c), ("treatment", t)):
        if e.error is not None:
            return QuantileDiff(c, t, None, None, e.error, f"{name}: {e.message}")
    qc, qt = float(c.estimate or 0.0), float(t.estimate or 0.0)
    sc, st = float(c.std_error or 0.0), float(t.std_error or 0.0)
    z = float(sps.norm.ppf(1.0 - alpha / 2.0))
    absolute = _normal_interval(qt - qc, math.hypot(sc, st), z)
    rel_se = math.sqrt(st * st / (qc * qc) + qt * qt * sc * sc / qc**4)
    relative = _normal_interval(qt / qc - 1.0, rel_se, z)
    if absolute is None:
        return QuantileDiff(c, t, None, None, ErrorCode.ZERO_VARIANCE, "both quantile CIs have zero width")
    return QuantileDiff(c, t, absolute, relative)


def _normal_interval(est: float, se: float, z: float) -> Interval | None:
    if se <= 0.0 or not math.isfinite(se):
        return None
    p = float(2.0 * sps.norm.sf(abs(est) / se))
    return Interval(est, se, est - z * se, est + z * se, p)


def quantile_diff(
    control: Mapping[int, int],
    treatment: Mapping[int, int],
    q: float,
    alpha: float = 0.05,
    design_effect: float = 1.0,
    buckets_per_e: int = BUCKETS_PER_E,
) -> QuantileDiff:
    """Difference (absolute and relative) of the q-quantiles of two variants."""
    c = quantile_ci(control, q, alpha, design_effect, buckets_per_e)
    t = quantile_ci(treatment, q, alpha, design_effect, buckets_per_e)
    try:
        return _quantile_diff(c, t, alpha)
    except NUMERIC_ERRORS as exc:
        return QuantileDiff(c, t, None, None, ErrorCode.INVALID_INPUT, numeric_message(exc))


def quantile_ci(
    histogram: Mapping[int, int],
    q: float,
    alpha: float = 0.05,
    design_effect: float = 1.0,
    buckets_per_e: int = BUCKETS_PER_E,
) -> QuantileEstimate:
    """The q-quantile of a bucketed histogram ({bucket: count}) with its (1 − alpha) CI."""
    try:
        return _quantile_ci(histogram, q, alpha, design_effect, buckets_per_e)
    except NUMERIC_ERRORS as exc:
        n = sum(int(c) for c in histogram.values() if c > 0)
        res = math.exp(1.0 / buckets_per_e) - 1.0 if buckets_per_e > 0 else 0.0
        return QuantileEstimate(
            q, n, None, None, None, None, design_effect, res, ErrorCode.INVALID_INPUT, numeric_message(exc)
        )
