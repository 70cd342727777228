"""Always-valid inference: normal-mixture confidence sequences and mSPRT p-values.

For an estimate θ̂ (a lift) with variance V from N = n_c + n_t units, the mixture
likelihood ratio against θ = θ0 with a N(0, τ²) mixture over the alternative is
(Robbins 1970; Johari, Koomen, Pekelis, Walsh 2017/2022):

    Λ = sqrt(V / (V + τ²)) · exp( (θ̂ − θ0)² τ² / (2V(V + τ²)) ),  p = min(1, 1/Λ).

Λ is a (asymptotic) martingale under θ0, so by Ville's inequality the running minimum
of p over any number of looks is a valid p-value, and the confidence sequence
{θ0 : Λ(θ0) < 1/α} = θ̂ ± sqrt( V(V+τ²)/τ² · (2 log(1/α) + log((V+τ²)/V)) ) covers
the true lift at every look simultaneously with probability ≥ 1 − α (Howard, Ramdas,
McAuliffe, Sekhon 2021, normal-mixture boundary; Waudby-Smith et al. for the CLT version).

Tuning: τ² = ρ²·σ² with σ² = V·N (the per-unit variance scale) and
ρ² = (−2 log α + log(1 − 2 log α)) / N*, which makes the sequence tightest at the
planned sample size N* (Howard et al. 2021; as GrowthBook does). The default N* is
``DEFAULT_PLANNED_UNITS``; pass the experiment's required sample size when known.

One-sided tests (guardrails) use the half-normal mixture over θ > θ0 only, for which
Λ⁺ = 2·Φ((θ̂−θ0)·τ/sqrt(V(V+τ²)))·Λ — also a nonnegative martingale, so the one-sided
bound is valid at level α (not α/2) and tighter than the two-sided one. The guardrail
applies it to the linear harm contrast D(margin) of :mod:`analytics.stats.harm` (with
τ² tuned on Var D), which stays close to normal for rare events such as error rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import optimize

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, finite, numeric_message
from analytics.stats.estimate import VariantEstimate
from analytics.stats.harm import HarmContrast, flip_point
from analytics.stats.lift import Interval, precheck, relative_variance

DEFAULT_PLANNED_UNITS = 10_000


def tuning_rho2(planned_units: int, alpha: float) -> float:
    """ρ² minimising the normal-mixture boundary's width at ``planned_units`` units."""
    la = -2.0 * math.log(alpha)
    return (la + math.log(1.0 + la)) / max(1, planned_units)


def _tau2(variance: float, n_total: int, alpha: float, planned_units: int) -> float:
    return tuning_rho2(planned_units, alpha) * variance * n_total


def log_mixture_lr(diff: float, variance: float, tau2: float) -> float:
    """log Λ for the two-sided N(0, τ²) mixture, ``diff`` = θ̂ − θ0."""
    s = variance + tau2
    return 0.5 * math.log(variance / s) + diff * diff * tau2 / (2.0 * variance * s)


def _log_ndtr(z: float) -> float:
    """log Φ(z) without scipy's per-call overhead (this runs inside a root finder)."""
    if z > -30.0:
        return math.log(0.5 * math.erfc(-z / math.sqrt(2.0)))
    # Mills-ratio asymptotics where erfc underflows
    return -0.5 * z * z - math.log(-z) - 0.5 * math.log(2.0 * math.pi) + math.log1p(-1.0 / (z * z))


def log_one_sided_lr(diff: float, variance: float, tau2: float) -> float:
    """log Λ⁺ for the half-normal mixture over alternatives above θ0."""
    s = variance + tau2
    z = diff * math.sqrt(tau2 / (variance * s))
    return math.log(2.0) + _log_ndtr(z) + log_mixture_lr(diff, variance, tau2)


def mixture_halfwidth(variance: float, tau2: float, alpha: float) -> float:
    """Two-sided confidence-sequence half-width at level alpha."""
    s = variance + tau2
    return math.sqrt(variance * s / tau2 * (2.0 * math.log(1.0 / alpha) + math.log(s / variance)))


def one_sided_halfwidth(variance: float, tau2: float, alpha: float) -> float:
    """d such that Λ⁺(d) = 1/α: θ̂ − d is an always-valid lower bound at level alpha."""
    target = math.log(1.0 / alpha)
    hi = mixture_halfwidth(variance, tau2, alpha)  # there Λ⁺ = 2Φ(·)/α ≥ 1/α
    return float(optimize.brentq(lambda d: log_one_sided_lr(d, variance, tau2) - target, 0.0, hi))


def _msprt_p_value(
    diff: float,
    variance: float,
    n_total: int,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
) -> float:
    """Always-valid two-sided p-value of θ = θ0 (``diff`` = θ̂ − θ0) at this look.

    Valid under continuous monitoring when the caller keeps the running minimum across
    looks (then it is also monotone). ``alpha`` only tunes τ² (the same α as the CS).
    """
    if not variance > 0.0:
        return 1.0  # degenerate: no evidence either way
    tau2 = _tau2(variance, n_total, alpha, planned_units)
    return min(1.0, math.exp(-max(0.0, log_mixture_lr(diff, variance, tau2))))


@dataclass(frozen=True, slots=True)
class SequentialResult:
    """Always-valid CIs (confidence sequences) and mSPRT p-values for the lift.

    ``Interval.p_value`` is this look's always-valid p-value; keep the running minimum
    over looks (the report does). ``relative`` is ``None`` when the control mean is 0.
    """

    absolute: Interval | None
    relative: Interval | None
    alpha: float
    planned_units: int
    n_total: int
    error: ErrorCode | None = None
    message: str | None = None
    relative_error: ErrorCode | None = None


def _seq_interval(est: float, var: float, n: int, alpha: float, planned: int) -> Interval | None:
    if var <= 0.0:
        return None
    tau2 = _tau2(var, n, alpha, planned)
    hw = mixture_halfwidth(var, tau2, alpha)
    p = min(1.0, math.exp(-max(0.0, log_mixture_lr(est, var, tau2))))
    vals = [finite(v) for v in (est, math.sqrt(var), est - hw, est + hw, p)]
    if any(v is None for v in vals):
        return None
    e, s, lo, hi, pv = (float(v) for v in vals if v is not None)
    return Interval(e, s, lo, hi, pv)


def _sequential_lift(
    control: VariantEstimate,
    treatment: VariantEstimate,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
) -> SequentialResult:
    """Confidence sequences and always-valid p-values for absolute and relative lift."""
    n = control.n + treatment.n
    if (bad := precheck(control, treatment, alpha)) is not None:
        return SequentialResult(None, None, alpha, planned_units, n, *bad)
    if planned_units < 1:
        return SequentialResult(
            None, None, alpha, planned_units, n, ErrorCode.INVALID_INPUT, "planned_units must be >= 1"
        )
    mc, mt = float(control.mean or 0.0), float(treatment.mean or 0.0)
    var = (control.variance or 0.0) + (treatment.variance or 0.0)
    absolute = _seq_interval(mt - mc, var, n, alpha, planned_units)
    if absolute is None:
        return SequentialResult(None, None, alpha, planned_units, n, ErrorCode.INVALID_INPUT, "not finite")
    if mc == 0.0:
        return SequentialResult(
            absolute, None, alpha, planned_units, n, relative_error=ErrorCode.ZERO_CONTROL_MEAN
        )
    relative = _seq_interval(
        (mt - mc) / abs(mc), relative_variance(control, treatment), n, alpha, planned_units
    )
    rel_error = None if relative is not None else ErrorCode.ZERO_VARIANCE
    return SequentialResult(absolute, relative, alpha, planned_units, n, relative_error=rel_error)


@dataclass(frozen=True, slots=True)
class SequentialGuardrail:
    """Always-valid one-sided guardrail test. ``harm`` is the lift in the bad direction
    (relative by default): −lift for an ``increase`` metric, +lift for a ``decrease`` one.

    - ``reject_harm``: harm > margin with confidence (``harm_lower`` > margin): roll back.
    - ``noninferior``: harm < margin with confidence (``harm_upper`` < margin).
    - ``p_value_harm``: always-valid p-value of H0 "harm ≤ margin" (keep the running min;
      reject_harm ⇔ p_value_harm ≤ alpha).
    - ``alpha_noninferiority``: the level of ``noninferior`` and ``harm_upper`` (``None``:
      ``alpha``); rolling back and promoting are different errors with their own budgets.
    """

    reject_harm: bool
    noninferior: bool
    harm: float | None
    harm_lower: float | None
    harm_upper: float | None
    p_value_harm: float | None
    margin: float
    relative: bool
    direction: Direction
    alpha: float
    n_total: int
    error: ErrorCode | None = None
    message: str | None = None
    alpha_noninferiority: float | None = None


def _sequential_noninferiority(
    control: VariantEstimate,
    treatment: VariantEstimate,
    margin: float,
    direction: Direction | str,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    relative: bool = True,
    alpha_noninferiority: float | None = None,
) -> SequentialGuardrail:
    """One-sided always-valid test of "treatment worse than control by more than margin".

    ``margin`` ≥ 0 is the tolerated harm: relative (0.05 = 5% worse than |control mean|)
    or absolute in metric units when ``relative=False``. Each one-sided bound is valid at
    level ``alpha`` under continuous monitoring (half-normal mixture, see module doc).
    """
    direction = Direction(direction)
    n = control.n + treatment.n
    a_ni = alpha if alpha_noninferiority is None else alpha_noninferiority

    def fail(code: ErrorCode, msg: str) -> SequentialGuardrail:
        return SequentialGuardrail(
            False, False, None, None, None, None, margin, relative, direction, alpha, n, code, msg, a_ni
        )

    if (bad := precheck(control, treatment, alpha)) is not None:
        return fail(*bad)
    if margin < 0.0 or planned_units < 1 or not (0.0 < a_ni < 1.0):
        return fail(ErrorCode.INVALID_INPUT, "margin must be >= 0, planned_units >= 1, alphas in (0, 1)")
    if relative and control.mean == 0.0:
        return fail(ErrorCode.ZERO_CONTROL_MEAN, "relative margin with a control mean of 0")
    hc = HarmContrast.of(control, treatment, direction, relative)

    def evidence(m: float, sign: float) -> float:
        """log Λ⁺ − log(1/α) for "harm > m" (sign +1, at alpha) or "harm < m" (sign −1, at
        alpha_noninferiority)."""
        level = alpha if sign > 0.0 else a_ni
        target = math.log(1.0 / level)
        d, v = hc.at(m)
        if not v > 0.0:
            return -target
        return log_one_sided_lr(sign * d, v, _tau2(v, n, level, planned_units)) - target

    _, v0 = hc.at(margin)
    if not v0 > 0.0:
        return fail(ErrorCode.ZERO_VARIANCE, "the contrast's variance is 0")
    log_lr = evidence(margin, +1.0) + math.log(1.0 / alpha)
    p = min(1.0, math.exp(-max(0.0, log_lr)))
    harm = hc.harm
    lower = flip_point(lambda m: evidence(m, +1.0), harm, hc.scale, -1.0)
    upper = flip_point(lambda m: evidence(m, -1.0), harm, hc.scale, +1.0)
    h, pv = finite(harm), finite(p)
    if h is None or pv is None:
        return fail(ErrorCode.INVALID_INPUT, "not finite")
    return SequentialGuardrail(
        pv <= alpha,
        evidence(margin, -1.0) >= 0.0,
        h,
        finite(lower),
        finite(upper),
        pv,
        margin,
        relative,
        direction,
        alpha,
        n,
        alpha_noninferiority=a_ni,
    )


def msprt_p_value(
    diff: float,
    variance: float,
    n_total: int,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
) -> float:
    """Always-valid two-sided p-value of θ = θ0 (``diff`` = θ̂ − θ0) at this look.

    Valid under continuous monitoring when the caller keeps the running minimum across
    looks (then it is also monotone). ``alpha`` only tunes τ² (the same α as the CS).
    Returns 1.0 (no evidence) when the inputs are degenerate or not finite.
    """
    try:
        p = _msprt_p_value(diff, variance, n_total, alpha, planned_units)
    except NUMERIC_ERRORS:
        return 1.0
    return p if math.isfinite(p) else 1.0


def sequential_lift(
    control: VariantEstimate,
    treatment: VariantEstimate,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
) -> SequentialResult:
    """Confidence sequences and always-valid p-values for absolute and relative lift."""
    try:
        return _sequential_lift(control, treatment, alpha, planned_units)
    except NUMERIC_ERRORS as exc:
        n = control.n + treatment.n
        return SequentialResult(
            None, None, alpha, planned_units, n, ErrorCode.INVALID_INPUT, numeric_message(exc)
        )


def sequential_noninferiority(
    control: VariantEstimate,
    treatment: VariantEstimate,
    margin: float,
    direction: Direction | str,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    relative: bool = True,
    alpha_noninferiority: float | None = None,
) -> SequentialGuardrail:
    """One-sided always-valid test of "treatment worse than control by more than margin".

    ``margin`` ≥ 0 is the tolerated harm: relative (0.05 = 5% worse than |control mean|)
    or absolute in metric units when ``relative=False``. Each one-sided bound is valid at
    level ``alpha`` under continuous monitoring (half-normal mixture, see module doc);
    ``noninferior`` and ``harm_upper`` at ``alpha_noninferiority`` (default ``alpha``).
    Degenerate input gives ``reject_harm=False`` with an ``error``: the controller holds.
    For rates of 0/1 events with an absolute margin see :mod:`analytics.stats.rate`.
    """
    try:
        return _sequential_noninferiority(
            control, treatment, margin, direction, alpha, planned_units, relative, alpha_noninferiority
        )
    except NUMERIC_ERRORS as exc:
        return SequentialGuardrail(
            False,
            False,
            None,
            None,
            None,
            None,
            margin,
            relative,
            Direction(direction),
            alpha,
            control.n + treatment.n,
            ErrorCode.INVALID_INPUT,
            numeric_message(exc),
            alpha_noninferiority,
        )
