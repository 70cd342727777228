"""Fixed-horizon one-sided non-inferiority test for guardrail metrics.

harm h = −lift for an ``increase`` metric, +lift for a ``decrease`` metric (relative to
|control mean| by default). H0: h ≥ margin (the candidate is worse by at least the
margin) vs H1: h < margin, tested on the linear contrast D(margin) of
:mod:`analytics.stats.harm` with its Welch SE and ν degrees of freedom:
t = D/SE, p = F_ν(t), non-inferior ⇔ p < α (Kohavi, Tang, Xu 2020, ch. 21). ``harm_upper``
is the one-sided (1 − α) upper bound of h (the margin where the verdict flips;
``None`` when the control mean is too uncertain to bound a relative harm). Valid for one look at a planned sample
size; the rollout controller uses :func:`analytics.stats.sequential.sequential_noninferiority`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, finite, numeric_message
from analytics.stats.estimate import VariantEstimate
from analytics.stats.harm import HarmContrast, flip_point
from analytics.stats.lift import precheck


@dataclass(frozen=True, slots=True)
class NonInferiorityResult:
    """``noninferior`` ⇔ ``p_value`` < alpha ⇔ ``harm_upper`` < margin."""

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
    if relative and control.mean == 0.0:
        return fail(ErrorCode.ZERO_CONTROL_MEAN, "relative margin with a control mean of 0")
    hc = HarmContrast.of(control, treatment, direction, relative)
    d, var = hc.at(margin)
    if not var > 0.0:
        return fail(ErrorCode.ZERO_VARIANCE, "the contrast's variance is 0")
    dof = hc.dof(margin)
    p = float(sps.t.cdf(d / math.sqrt(var), dof))
    q = float(sps.t.ppf(1.0 - alpha, dof))

    def beyond_upper(m: float) -> float:  # ≥ 0 once the test at margin m declares non-inferiority
        dm, vm = hc.at(m)
        return -dm - q * math.sqrt(vm)

    harm = hc.harm
    upper = flip_point(beyond_upper, harm, hc.scale, +1.0) if beyond_upper(harm) < 0.0 else harm
    h, u, pv = finite(harm), finite(upper), finite(p)
    if h is None or pv is None:
        return fail(ErrorCode.INVALID_INPUT, "not finite")
    return NonInferiorityResult(pv < alpha, pv, h, u, margin, relative, direction, alpha)


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
