"""Paired comparisons for shadow traffic: the same prompt answered by both models.

Pairs come as a :class:`SampleStats` over pairs with x = candidate value and y = baseline
value (so Σd = Σx − Σy and Σd² = Σx² − 2Σxy + Σy² are all there):

- paired t-test on d = x − y: d̄ ± t_{1−α/2, n−1}·s_d/√n, s_d² = var_x + var_y − 2cov_xy;
- relative difference d̄/|ȳ| with the delta method for correlated means,
  Var ≈ (var_x − 2R·cov_xy + R²·var_y)/(n·ȳ²), R = x̄/ȳ;
- McNemar's test for errors (b = pairs where only the baseline failed, c = only the
  candidate): exact two-sided binomial test of b vs Binomial(b+c, ½) when b+c < 25,
  else χ² = (|b − c| − 1)²/(b + c) with continuity correction (McNemar 1947);
- agreement rate (e.g. same answer / same finish reason) with a Wilson score interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, check_alpha, finite, numeric_message
from analytics.stats.lift import Interval
from analytics.stats.sufficient import SampleStats

EXACT_MCNEMAR_BELOW = 25


@dataclass(frozen=True, slots=True)
class PairedResult:
    n_pairs: int
    candidate_mean: float | None
    baseline_mean: float | None
    difference: Interval | None  # candidate − baseline, paired t
    relative: Interval | None  # difference / |baseline mean|
    error: ErrorCode | None = None
    message: str | None = None
    relative_error: ErrorCode | None = None


def _t_interval(est: float, se: float, dof: float, alpha: float) -> Interval | None:
    q = float(sps.t.ppf(1.0 - alpha / 2.0, dof))
    p = float(2.0 * sps.t.sf(abs(est) / se, dof))
    vals = [finite(v) for v in (est, se, est - q * se, est + q * se, p)]
    if any(v is None for v in vals):
        return None
    e, s, lo, hi, pv = (float(v) for v in vals if v is not None)
    return Interval(e, s, lo, hi, pv)


def _paired_test(pairs: SampleStats, alpha: float = 0.05) -> PairedResult:
    """Paired t-test and CI of candidate − baseline over shadow pairs."""
    n = pairs.n

    def fail(code: ErrorCode, msg: str) -> PairedResult:
        return PairedResult(n, None, None, None, None, code, msg)

    if (msg := check_alpha(alpha)) is not None:
        return fail(ErrorCode.INVALID_INPUT, msg)
    if n == 0:
        return fail(ErrorCode.NO_DATA, "no pairs")
    if n < 2:
        return fail(ErrorCode.TOO_FEW_UNITS, "fewer than 2 pairs")
    mx, my = pairs.mean_x, pairs.mean_y
    var_d = max(0.0, pairs.var_x + pairs.var_y - 2.0 * pairs.cov_xy)
    if var_d <= 0.0:
        return PairedResult(n, mx, my, None, None, ErrorCode.ZERO_VARIANCE, "all pair differences are equal")
    diff = _t_interval(mx - my, math.sqrt(var_d / n), n - 1, alpha)
    if my == 0.0:
        return PairedResult(n, mx, my, diff, None, relative_error=ErrorCode.ZERO_CONTROL_MEAN)
    r = mx / my
    var_rel = max(0.0, pairs.var_x - 2.0 * r * pairs.cov_xy + r * r * pairs.var_y) / (n * my * my)
    rel = _t_interval((mx - my) / abs(my), math.sqrt(var_rel), n - 1, alpha) if var_rel > 0 else None
    return PairedResult(n, finite(mx), finite(my), diff, rel)


@dataclass(frozen=True, slots=True)
class McNemarResult:
    baseline_only: int  # pairs where only the baseline erred (b)
    candidate_only: int  # pairs where only the candidate erred (c)
    p_value: float | None
    statistic: float | None  # χ² (None for the exact test)
    exact: bool
    error: ErrorCode | None = None
    message: str | None = None


def mcnemar(baseline_only: int, candidate_only: int) -> McNemarResult:
    """McNemar's test of equal error rates on paired outcomes (only discordant pairs count)."""
    b, c = baseline_only, candidate_only
    if b < 0 or c < 0:
        return McNemarResult(b, c, None, None, False, ErrorCode.INVALID_INPUT, "negative counts")
    if b + c == 0:
        return McNemarResult(b, c, 1.0, None, True, message="no discordant pairs")
    if b + c < EXACT_MCNEMAR_BELOW:
        p = float(sps.binomtest(min(b, c), b + c, 0.5).pvalue)
        return McNemarResult(b, c, min(1.0, p), None, True)
    stat = (abs(b - c) - 1.0) ** 2 / (b + c)
    return McNemarResult(b, c, float(sps.chi2.sf(stat, 1)), stat, False)


@dataclass(frozen=True, slots=True)
class RateInterval:
    rate: float | None
    lower: float | None
    upper: float | None
    n: int
    error: ErrorCode | None = None
    message: str | None = None


def agreement(agree: int, n: int, alpha: float = 0.05) -> RateInterval:
    """Share of pairs where the models agree, with a Wilson score interval."""
    if n <= 0:
        return RateInterval(None, None, None, 0, ErrorCode.NO_DATA, "no pairs")
    if not (0 <= agree <= n) or check_alpha(alpha) is not None:
        return RateInterval(
            None, None, None, n, ErrorCode.INVALID_INPUT, "need 0 <= agree <= n, alpha in (0,1)"
        )
    z = float(sps.norm.ppf(1.0 - alpha / 2.0))
    p = agree / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return RateInterval(p, max(0.0, centre - half), min(1.0, centre + half), n)


def paired_test(pairs: SampleStats, alpha: float = 0.05) -> PairedResult:
    """Paired t-test and CI of candidate − baseline over shadow pairs."""
    try:
        return _paired_test(pairs, alpha)
    except NUMERIC_ERRORS as exc:
        return PairedResult(pairs.n, None, None, None, None, ErrorCode.INVALID_INPUT, numeric_message(exc))
