"""Per-variant point estimates and their variances: the input of every comparison.

A metric is analysed per randomisation unit. ``mean`` and ``proportion`` metrics are the
mean of a per-unit value x_i (a proportion is the mean of a 0/1 indicator). ``ratio``
metrics are Σx/Σy over units (e.g. thumbs-up per response): requests of one unit are
correlated, so the variance comes from the delta method on unit-level sums, never from
treating requests as independent (Deng, Knoblich, Lu 2018).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, finite, numeric_message
from analytics.stats.sufficient import SampleStats


class MetricKind(StrEnum):
    MEAN = "mean"
    PROPORTION = "proportion"
    RATIO = "ratio"


@dataclass(frozen=True, slots=True)
class VariantEstimate:
    """A variant's estimate of one metric.

    ``mean`` is x̄ (mean/proportion) or Σx/Σy (ratio); ``unit_variance`` is the per-unit
    variance of the (linearised) metric, so ``variance = unit_variance / n`` is the
    variance of ``mean``. With CUPED both are the adjusted ones. ``error`` is set (and the
    numbers are ``None``) when the variant cannot be estimated.
    """

    n: int
    mean: float | None
    unit_variance: float | None
    error: ErrorCode | None = None
    message: str | None = None

    @property
    def variance(self) -> float | None:
        if self.unit_variance is None or self.n <= 0:
            return None
        return self.unit_variance / self.n

    @property
    def std_error(self) -> float | None:
        v = self.variance
        return None if v is None else v**0.5

    @property
    def ok(self) -> bool:
        return self.error is None


def failed(n: int, code: ErrorCode, message: str) -> VariantEstimate:
    return VariantEstimate(n=n, mean=None, unit_variance=None, error=code, message=message)


def _estimate(stats: SampleStats, kind: MetricKind | str = MetricKind.MEAN) -> VariantEstimate:
    """The variant's mean and its variance; degenerate data gives an ``error`` instead.

    Ratio: R = Σx/Σy; the per-unit linearisation L_i = (x_i − R·y_i)/ȳ has variance
    (var_x − 2R·cov_xy + R²·var_y)/ȳ² (delta method).
    """
    kind = MetricKind(kind)
    if stats.n < 0:
        return failed(stats.n, ErrorCode.INVALID_INPUT, f"impossible unit count n = {stats.n}")
    if stats.n <= 0:
        return failed(0, ErrorCode.EMPTY_VARIANT, "the variant has no units")
    if (why := impossible_sums(stats, kind)) is not None:
        return failed(stats.n, ErrorCode.INVALID_INPUT, why)
    if stats.n < 2:
        return failed(stats.n, ErrorCode.TOO_FEW_UNITS, "fewer than 2 units: no variance estimate")
    if kind is MetricKind.RATIO:
        if stats.sum_y == 0.0:
            return failed(stats.n, ErrorCode.ZERO_DENOMINATOR, "the ratio's denominator sums to 0")
        ratio = stats.sum_x / stats.sum_y
        y_bar = stats.mean_y
        unit_var = (stats.var_x - 2.0 * ratio * stats.cov_xy + ratio * ratio * stats.var_y) / (y_bar * y_bar)
        scale = (stats.var_x + 2.0 * abs(ratio * stats.cov_xy) + ratio * ratio * stats.var_y) / (
            y_bar * y_bar
        )
        if unit_var < -_ROUNDING * scale:
            # var(x − R·y) < 0 means |cov(x, y)| > sd(x)·sd(y): no data set has these sums
            return failed(stats.n, ErrorCode.INVALID_INPUT, "impossible sums: cov(x, y)² > var(x)·var(y)")
        return _checked(stats.n, ratio, max(0.0, unit_var))
    return _checked(stats.n, stats.mean_x, stats.var_x)


#: Relative size of a negative variance that float cancellation in Σx² − (Σx)²/n can
#: produce from real data; anything more negative is impossible input.
_ROUNDING = 1e-9


def _negative(sum_1: float, sum_2: float, n: int) -> bool:
    raw = sum_2 - sum_1 * sum_1 / n
    return raw < -_ROUNDING * max(abs(sum_2), sum_1 * sum_1 / n)


def impossible_sums(stats: SampleStats, kind: MetricKind) -> str | None:
    """Why the sums cannot come from any data set (a negative variance), or ``None``.

    ``SampleStats`` clamps its variances at 0 for rounding; a sum of squares far below
    (Σx)²/n is not rounding but corrupt input (a wrong column, an overflowed counter),
    and is reported instead of being analysed as "zero variance".
    """
    checks = [("x", stats.sum_x, stats.sum_x2)]
    if kind is MetricKind.RATIO:
        checks.append(("y", stats.sum_y, stats.sum_y2))
    if stats.has_covariate or stats.sum_c != 0.0:
        checks.append(("c", stats.sum_c, stats.sum_c2))
    for name, s1, s2 in checks:
        if not (math.isfinite(s1) and math.isfinite(s2)):
            return f"the sums of {name} are not finite"
        if _negative(s1, s2, stats.n):
            return f"impossible sums: Σ{name}² = {s2:g} < (Σ{name})²/n = {s1 * s1 / stats.n:g} (negative variance)"
    return None


def _checked(n: int, mean: float, unit_var: float) -> VariantEstimate:
    m, v = finite(mean), finite(unit_var)
    if m is None or v is None:
        return failed(n, ErrorCode.INVALID_INPUT, "the sums overflow or are not finite")
    return VariantEstimate(n=n, mean=m, unit_variance=v)


def linearised_cov_with_covariate(stats: SampleStats, kind: MetricKind) -> float:
    """cov(L_i, c_i): the metric's per-unit linearisation with the CUPED covariate."""
    if kind is MetricKind.RATIO:
        if stats.sum_y == 0.0:
            return 0.0
        ratio = stats.sum_x / stats.sum_y
        return (stats.cov_xc - ratio * stats.cov_yc) / stats.mean_y
    return stats.cov_xc


def estimate(stats: SampleStats, kind: MetricKind | str = MetricKind.MEAN) -> VariantEstimate:
    """The variant's mean and its variance; degenerate data gives an ``error`` instead.

    Ratio: R = Σx/Σy; the per-unit linearisation L_i = (x_i − R·y_i)/ȳ has variance
    (var_x − 2R·cov_xy + R²·var_y)/ȳ² (delta method).
    """
    try:
        return _estimate(stats, kind)
    except NUMERIC_ERRORS as exc:
        return failed(stats.n, ErrorCode.INVALID_INPUT, numeric_message(exc))
