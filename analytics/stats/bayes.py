"""Bayesian summary of a lift: chance to beat control and expected loss.

Gaussian approximation (as GrowthBook's default engine): the lift (relative by default,
absolute with ``relative=False``) has likelihood N(θ̂, V) with V its delta-method
variance; with a N(μ0, σ0²) prior the posterior is N(μ, s²), 1/s² = 1/V + 1/σ0²,
μ = s²(θ̂/V + μ0/σ0²) (no prior: μ = θ̂, s² = V). With b = ±θ the benefit in the
metric's good direction: chance to beat control = P(b > 0) = Φ(μ_b/s); expected loss of
shipping the treatment = E[max(0, −b)] = s·φ(μ_b/s) − μ_b·Φ(−μ_b/s), of keeping the
control = E[max(0, b)] = s·φ(μ_b/s) + μ_b·Φ(μ_b/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, finite, numeric_message
from analytics.stats.estimate import VariantEstimate
from analytics.stats.lift import precheck, relative_variance


@dataclass(frozen=True, slots=True)
class GaussianPrior:
    """Prior on the lift (same scale as the analysis: relative or absolute)."""

    mean: float = 0.0
    variance: float = 0.3**2


@dataclass(frozen=True, slots=True)
class BayesResult:
    chance_to_beat_control: float | None
    risk_treatment: float | None  # expected loss (in lift units) if the treatment is shipped
    risk_control: float | None  # expected loss if the control is kept
    posterior_mean: float | None  # of the lift θ (not of the benefit)
    posterior_std: float | None
    lower: float | None  # (1 − alpha) equal-tailed credible interval of θ
    upper: float | None
    relative: bool
    error: ErrorCode | None = None
    message: str | None = None


def _chance_to_beat(
    control: VariantEstimate,
    treatment: VariantEstimate,
    direction: Direction | str = Direction.INCREASE,
    relative: bool = True,
    prior: GaussianPrior | None = None,
    alpha: float = 0.05,
) -> BayesResult:
    """Posterior chance that the treatment is better, and the expected loss of each choice."""
    direction = Direction(direction)

    def fail(code: ErrorCode, msg: str) -> BayesResult:
        return BayesResult(None, None, None, None, None, None, None, relative, code, msg)

    if (bad := precheck(control, treatment, alpha)) is not None:
        return fail(*bad)
    if prior is not None and prior.variance <= 0.0:
        return fail(ErrorCode.INVALID_INPUT, "prior variance must be > 0")
    mc, mt = float(control.mean or 0.0), float(treatment.mean or 0.0)
    if relative:
        if mc == 0.0:
            return fail(ErrorCode.ZERO_CONTROL_MEAN, "relative lift with a control mean of 0")
        lift, var = (mt - mc) / abs(mc), relative_variance(control, treatment)
    else:
        lift, var = mt - mc, (control.variance or 0.0) + (treatment.variance or 0.0)
    if not var > 0.0:
        return fail(ErrorCode.ZERO_VARIANCE, "the lift's variance is 0 on this scale")
    if prior is None:
        mu, s2 = lift, var
    else:
        s2 = 1.0 / (1.0 / var + 1.0 / prior.variance)
        mu = s2 * (lift / var + prior.mean / prior.variance)
    s = math.sqrt(s2)
    mu_b = mu if direction is Direction.INCREASE else -mu
    z = mu_b / s
    pdf, cdf, sf = float(sps.norm.pdf(z)), float(sps.norm.cdf(z)), float(sps.norm.sf(z))
    q = float(sps.norm.ppf(1.0 - alpha / 2.0))
    vals = [
        finite(v) for v in (cdf, s * pdf - mu_b * sf, s * pdf + mu_b * cdf, mu, s, mu - q * s, mu + q * s)
    ]
    if any(v is None for v in vals):
        return fail(ErrorCode.INVALID_INPUT, "not finite")
    ctw, rt, rc, pm, ps, lo, hi = vals
    return BayesResult(ctw, max(0.0, rt or 0.0), max(0.0, rc or 0.0), pm, ps, lo, hi, relative)


def chance_to_beat(
    control: VariantEstimate,
    treatment: VariantEstimate,
    direction: Direction | str = Direction.INCREASE,
    relative: bool = True,
    prior: GaussianPrior | None = None,
    alpha: float = 0.05,
) -> BayesResult:
    """Posterior chance that the treatment is better, and the expected loss of each choice."""
    try:
        return _chance_to_beat(control, treatment, direction, relative, prior, alpha)
    except NUMERIC_ERRORS as exc:
        return BayesResult(
            None, None, None, None, None, None, None, relative, ErrorCode.INVALID_INPUT, numeric_message(exc)
        )
