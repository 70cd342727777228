"""Fixed-horizon Welch t-test and confidence intervals for absolute and relative lift.

absolute Δ = m_t − m_c, Var(Δ) = V_t + V_c (V = variance of a variant's mean), Welch–
Satterthwaite degrees of freedom ν = (V_t+V_c)² / (V_t²/(n_t−1) + V_c²/(n_c−1))
(Welch 1947). relative r = Δ/|m_c|, Var(r) ≈ V_t/m_c² + m_t²·V_c/m_c⁴ (delta method,
Deng, Knoblich, Lu 2018). Both CIs use the t quantile with ν degrees of freedom; the
p-value tests Δ = 0 (absolute) and r = 0 (relative, with its own delta-method SE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.cuped import cuped_estimates
from analytics.stats.errors import (
    NUMERIC_ERRORS,
    ErrorCode,
    check_alpha,
    check_finite,
    finite,
    numeric_message,
)
from analytics.stats.estimate import MetricKind, VariantEstimate, estimate
from analytics.stats.sufficient import SampleStats


@dataclass(frozen=True, slots=True)
class Interval:
    """A lift estimate with its standard error, interval and p-value (two-sided)."""

    estimate: float
    std_error: float
    lower: float
    upper: float
    p_value: float


@dataclass(frozen=True, slots=True)
class LiftResult:
    """Treatment vs control. ``relative`` is ``None`` (with ``relative_error``) when the
    control mean is 0; everything is ``None`` when ``error`` is set."""

    control_mean: float | None
    treatment_mean: float | None
    absolute: Interval | None
    relative: Interval | None
    dof: float | None
    alpha: float
    error: ErrorCode | None = None
    message: str | None = None
    relative_error: ErrorCode | None = None


def _fail(c: VariantEstimate, t: VariantEstimate, alpha: float, code: ErrorCode, msg: str) -> LiftResult:
    return LiftResult(c.mean, t.mean, None, None, None, alpha, code, msg)


def precheck(
    control: VariantEstimate, treatment: VariantEstimate, alpha: float
) -> tuple[ErrorCode, str] | None:
    """The first reason the two variants cannot be compared, or ``None``."""
    if (msg := check_alpha(alpha)) is not None:
        return ErrorCode.INVALID_INPUT, msg
    for name, e in (("control", control), ("treatment", treatment)):
        if e.error is not None:
            return e.error, f"{name}: {e.message}"
        if (msg := check_finite(mean=e.mean, unit_variance=e.unit_variance)) is not None:
            return ErrorCode.INVALID_INPUT, f"{name}: {msg}"
        if e.unit_variance is not None and e.unit_variance < 0.0:
            return ErrorCode.INVALID_INPUT, f"{name}: negative variance {e.unit_variance!r}"
    if (control.variance or 0.0) + (treatment.variance or 0.0) <= 0.0:
        return ErrorCode.ZERO_VARIANCE, "both variants have zero variance: no test is possible"
    return None


def welch_dof(control: VariantEstimate, treatment: VariantEstimate) -> float:
    vc, vt = control.variance or 0.0, treatment.variance or 0.0
    denom = vc * vc / (control.n - 1) + vt * vt / (treatment.n - 1)
    return (vc + vt) ** 2 / denom if denom > 0.0 else float(control.n + treatment.n - 2)


def relative_variance(control: VariantEstimate, treatment: VariantEstimate) -> float:
    """Var((m_t − m_c)/|m_c|) by the delta method (independent variants)."""
    mc, mt = control.mean or 0.0, treatment.mean or 0.0
    vc, vt = control.variance or 0.0, treatment.variance or 0.0
    return vt / (mc * mc) + mt * mt * vc / mc**4


def _interval(est: float, var: float, dof: float, alpha: float) -> Interval | None:
    se = math.sqrt(var)
    q = float(sps.t.ppf(1.0 - alpha / 2.0, dof))
    p = float(2.0 * sps.t.sf(abs(est) / se, dof)) if se > 0.0 else (1.0 if est == 0.0 else 0.0)
    vals = [finite(v) for v in (est, se, est - q * se, est + q * se, p)]
    if any(v is None for v in vals):
        return None
    e, s, lo, hi, pv = (float(v) for v in vals if v is not None)
    return Interval(e, s, lo, hi, min(1.0, max(0.0, pv)))


def _welch_lift(control: VariantEstimate, treatment: VariantEstimate, alpha: float = 0.05) -> LiftResult:
    """Welch t-test and (1 − alpha) CIs of the absolute and relative lift."""
    if (bad := precheck(control, treatment, alpha)) is not None:
        return _fail(control, treatment, alpha, *bad)
    mc, mt = float(control.mean or 0.0), float(treatment.mean or 0.0)
    dof = welch_dof(control, treatment)
    absolute = _interval(mt - mc, (control.variance or 0.0) + (treatment.variance or 0.0), dof, alpha)
    if absolute is None:
        return _fail(control, treatment, alpha, ErrorCode.INVALID_INPUT, "lift is not finite")
    if mc == 0.0:
        return LiftResult(
            mc, mt, absolute, None, finite(dof), alpha, relative_error=ErrorCode.ZERO_CONTROL_MEAN
        )
    rel_var = relative_variance(control, treatment)
    if not rel_var > 0.0:
        return LiftResult(mc, mt, absolute, None, finite(dof), alpha, relative_error=ErrorCode.ZERO_VARIANCE)
    relative = _interval((mt - mc) / abs(mc), rel_var, dof, alpha)
    return LiftResult(mc, mt, absolute, relative, finite(dof), alpha)


def compare(
    control: SampleStats,
    treatment: SampleStats,
    kind: MetricKind | str = MetricKind.MEAN,
    alpha: float = 0.05,
    cuped: bool = False,
) -> LiftResult:
    """Convenience: estimate both variants (CUPED θ pooled over the two) and run Welch.

    For A/B/n with CUPED pool θ over all variants with :func:`cuped_estimates` and call
    :func:`welch_lift` per candidate.
    """
    if cuped:
        c, t = cuped_estimates([control, treatment], kind).estimates
    else:
        c, t = estimate(control, kind), estimate(treatment, kind)
    return welch_lift(c, t, alpha)


def welch_lift(control: VariantEstimate, treatment: VariantEstimate, alpha: float = 0.05) -> LiftResult:
    """Welch t-test and (1 − alpha) CIs of the absolute and relative lift."""
    try:
        return _welch_lift(control, treatment, alpha)
    except NUMERIC_ERRORS as exc:
        return _fail(control, treatment, alpha, ErrorCode.INVALID_INPUT, numeric_message(exc))
