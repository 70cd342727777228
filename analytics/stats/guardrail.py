"""Fixed-horizon one-sided non-inferiority test for guardrail metrics.

harm h = −lift for an ``increase`` metric, +lift for a ``decrease`` metric (relative to
|control mean| by default). H0: h ≥ margin (the candidate is worse by at least the
margin) vs H1: h < margin. With the Welch SE and ν degrees of freedom:
t = (ĥ − margin)/SE, p = F_ν(t), non-inferior ⇔ p < α ⇔ ĥ + t_{1−α,ν}·SE < margin
(Kohavi, Tang, Xu 2020, ch. 21 on guardrails). Valid for one look at a planned sample
size; the rollout controller uses :func:`analytics.stats.sequential.sequential_noninferiority`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, finite, numeric_message
from analytics.stats.estimate import VariantEstimate
from analytics.stats.lift import precheck, relative_variance, welch_dof


@dataclass(frozen=True, slots=True)
class NonInferiorityResult:
    """``noninferior`` when the one-sided upper bound of harm is below the margin."""

    noninferior: bool
    p_value: float | None
    harm: float | None
    harm_upper: float | None
    margin: float
    relative: bool
    direction: Direction
    alpha: float
    error: ErrorCode | None = None
    message: str | None = None


def _noninferiority(
    control: VariantEstimate,
    treatment: VariantEstimate,
    margin: float,
    direction: Direction | str,
    alpha: float = 0.05,
    relative: bool = True,
) -> NonInferiorityResult:
    """One-sided test of "treatment is not worse than control by ``margin`` or more"."""
    direction = Direction(direction)

    def fail(code: ErrorCode, msg: str) -> NonInferiorityResult:
        return NonInferiorityResult(False, None, None, None, margin, relative, direction, alpha, code, msg)

    if (bad := precheck(control, treatment, alpha)) is not None:
        return fail(*bad)
    if margin < 0.0:
        return fail(ErrorCode.INVALID_INPUT, "margin must be >= 0")
    mc, mt = float(control.mean or 0.0), float(treatment.mean or 0.0)
    if relative:
        if mc == 0.0:
            return fail(ErrorCode.ZERO_CONTROL_MEAN, "relative margin with a control mean of 0")
        lift, var = (mt - mc) / abs(mc), relative_variance(control, treatment)
    else:
        lift, var = mt - mc, (control.variance or 0.0) + (treatment.variance or 0.0)
    if not var > 0.0:
        return fail(ErrorCode.ZERO_VARIANCE, "the lift's variance is 0 on this scale")
    harm = -lift if direction is Direction.INCREASE else lift
    dof = welch_dof(control, treatment)
    se = math.sqrt(var)
    p = float(sps.t.cdf((harm - margin) / se, dof))
    upper = harm + float(sps.t.ppf(1.0 - alpha, dof)) * se
    h, u, pv = finite(harm), finite(upper), finite(p)
    if h is None or u is None or pv is None:
        return fail(ErrorCode.INVALID_INPUT, "not finite")
    return NonInferiorityResult(u < margin, pv, h, u, margin, relative, direction, alpha)


def noninferiority(
    control: VariantEstimate,
    treatment: VariantEstimate,
    margin: float,
    direction: Direction | str,
    alpha: float = 0.05,
    relative: bool = True,
) -> NonInferiorityResult:
    """One-sided test of "treatment is not worse than control by ``margin`` or more"."""
    try:
        return _noninferiority(control, treatment, margin, direction, alpha, relative)
    except NUMERIC_ERRORS as exc:
        return NonInferiorityResult(
            False,
            None,
            None,
            None,
            margin,
            relative,
            Direction(direction),
            alpha,
            ErrorCode.INVALID_INPUT,
            numeric_message(exc),
        )
