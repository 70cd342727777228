"""Two-proportion tests by convention, on the sufficient statistics of 0/1 per-unit values.

The report's default for a proportion metric is the Welch t-test of :mod:`analytics.stats.lift`
on the 0/1 values (unpooled variances p(1−p)·n/(n−1), t reference with Satterthwaite ν).
Engines differ here, so a user can reproduce theirs on the same counts:

- ``welch``: the default above (GrowthBook's frequentist engine; t with ν).
- ``pooled_z``: z = (p̂_t − p̂_c) / sqrt(p̄(1−p̄)(1/n_c + 1/n_t)), p̄ the pooled rate —
  identical to Pearson's χ² on the 2×2 table without continuity correction
  (p = P(χ²₁ > z²)); the CI is the unpooled Wald z interval
  Δ ± z_{1−α/2}·sqrt(p̂_c(1−p̂_c)/n_c + p̂_t(1−p̂_t)/n_t) (Spotify confidence's z-test).
  The relative lift uses the delta method with the same z quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, check_alpha, finite, numeric_message
from analytics.stats.estimate import MetricKind, estimate
from analytics.stats.lift import Interval, LiftResult, welch_lift
from analytics.stats.sufficient import SampleStats


class ProportionTest(StrEnum):
    WELCH = "welch"
    POOLED_Z = "pooled_z"


@dataclass(frozen=True, slots=True)
class _Counts:
    n: int
    events: float

    @property
    def rate(self) -> float:
        return self.events / self.n


def _counts(name: str, stats: SampleStats) -> _Counts | tuple[ErrorCode, str]:
    if stats.n <= 0:
        return ErrorCode.EMPTY_VARIANT, f"{name}: the variant has no units"
    if not (math.isfinite(stats.sum_x) and math.isfinite(stats.sum_x2)):
        return ErrorCode.INVALID_INPUT, f"{name}: the sums are not finite"
    # 0/1 values: Σx² = Σx and 0 ≤ Σx ≤ n
    if abs(stats.sum_x2 - stats.sum_x) > 1e-9 * max(1.0, stats.sum_x) or not 0.0 <= stats.sum_x <= stats.n:
        return (
            ErrorCode.INVALID_INPUT,
            f"{name}: per-unit values are not 0/1 (Σx = {stats.sum_x:g}, n = {stats.n})",
        )
    return _Counts(stats.n, stats.sum_x)


def _z_interval(est: float, se: float, z: float, p: float) -> Interval | None:
    vals = [finite(v) for v in (est, se, est - z * se, est + z * se, p)]
    if any(v is None for v in vals):
        return None
    e, s, lo, hi, pv = (float(v) for v in vals if v is not None)
    return Interval(e, s, lo, hi, min(1.0, max(0.0, pv)))


def _pooled_z(c: _Counts, t: _Counts, alpha: float) -> LiftResult:
    def fail(code: ErrorCode, msg: str) -> LiftResult:
        return LiftResult(c.rate, t.rate, None, None, None, alpha, code, msg)

    pooled = (c.events + t.events) / (c.n + t.n)
    se0 = math.sqrt(pooled * (1.0 - pooled) * (1.0 / c.n + 1.0 / t.n))
    if not se0 > 0.0:
        return fail(ErrorCode.ZERO_VARIANCE, "the pooled rate is 0 or 1: no test is possible")
    diff = t.rate - c.rate
    p = float(2.0 * sps.norm.sf(abs(diff) / se0))
    z = float(sps.norm.ppf(1.0 - alpha / 2.0))
    se = math.sqrt(c.rate * (1.0 - c.rate) / c.n + t.rate * (1.0 - t.rate) / t.n)
    absolute = _z_interval(diff, se, z, p)
    if absolute is None:
        return fail(ErrorCode.INVALID_INPUT, "lift is not finite")
    if c.rate == 0.0:
        return LiftResult(
            c.rate, t.rate, absolute, None, None, alpha, relative_error=ErrorCode.ZERO_CONTROL_MEAN
        )
    rel_var = (
        t.rate * (1.0 - t.rate) / t.n / c.rate**2 + t.rate**2 * (c.rate * (1.0 - c.rate) / c.n) / c.rate**4
    )
    rel_se = math.sqrt(rel_var)
    relative = None
    if rel_se > 0.0:
        relative = _z_interval(
            diff / c.rate, rel_se, z, float(2.0 * sps.norm.sf(abs(diff / c.rate) / rel_se))
        )
    err = None if relative is not None else ErrorCode.ZERO_VARIANCE
    return LiftResult(c.rate, t.rate, absolute, relative, None, alpha, relative_error=err)


def proportion_lift(
    control: SampleStats,
    treatment: SampleStats,
    alpha: float = 0.05,
    test: ProportionTest | str = ProportionTest.WELCH,
) -> LiftResult:
    """Two-proportion comparison by the chosen convention (module doc); ``dof`` is ``None`` for z."""
    try:
        test = ProportionTest(test)
        if (msg := check_alpha(alpha)) is not None:
            return LiftResult(None, None, None, None, None, alpha, ErrorCode.INVALID_INPUT, msg)
        c, t = _counts("control", control), _counts("treatment", treatment)
        for side in (c, t):
            if not isinstance(side, _Counts):
                return LiftResult(None, None, None, None, None, alpha, *side)
        assert isinstance(c, _Counts) and isinstance(t, _Counts)
        if test is ProportionTest.WELCH:
            kind = MetricKind.PROPORTION
            return welch_lift(estimate(control, kind), estimate(treatment, kind), alpha)
        return _pooled_z(c, t, alpha)
    except NUMERIC_ERRORS as exc:
        return LiftResult(None, None, None, None, None, alpha, ErrorCode.INVALID_INPUT, numeric_message(exc))
