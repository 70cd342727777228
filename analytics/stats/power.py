"""Power, minimum detectable effect and required sample size (two-sided Welch/z test).

For a relative effect δ on a control mean μ (absolute effect Δ = δ·|μ|), per-unit
variances σ_c² and σ_t², treatment share w (control 1 − w) and N units in total:

    Δ = (z_{1−α/2} + z_{1−β}) · sqrt(σ_c²/((1−w)N) + σ_t²/(wN))
    N = (z_{1−α/2} + z_{1−β})² · (σ_c²/(1−w) + σ_t²/w) / Δ²
    power = Φ(Δ/SE − z_{1−α/2}) + Φ(−Δ/SE − z_{1−α/2})

Proportions use σ² = p(1−p) per arm (σ_t² at p·(1+δ)); mean metrics the given unit
variance for both arms; ratio metrics the delta-method linearised unit variance
(``VariantEstimate.unit_variance`` of a ratio estimate). The MDE of a proportion is
found by fixed-point iteration because σ_t² depends on it (Kohavi et al. 2020, ch. 17).

``test="relative"`` plans for the test of the RELATIVE lift r = Δ/|μ| that the report
runs with the delta method (GrowthBook's power calculator): with the treatment mean at
μ(1+δ) its standard error is

    SE_r² = σ_t²/(n_t·μ²) + (1+δ)²·σ_c²/(n_c·μ²)

(the (1+δ)² term is the control mean's noise in the denominator), so N, power and MDE use
SE_r in place of SE/|μ|; ``test="absolute"`` (default) plans for the test of Δ.

Invalid input is refused, never clamped: a proportion's baseline outside (0, 1), a
treatment rate p(1+δ) outside [0, 1], NaN/inf anywhere, a negative variance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from scipy import stats as sps

from analytics.stats.errors import (
    NUMERIC_ERRORS,
    ErrorCode,
    check_alpha,
    check_finite,
    finite,
    numeric_message,
)
from analytics.stats.estimate import MetricKind


class LiftTest(StrEnum):
    """Which lift the planned analysis tests."""

    ABSOLUTE = "absolute"  # Δ = m_t − m_c
    RELATIVE = "relative"  # r = Δ/|m_c| with its delta-method SE


@dataclass(frozen=True, slots=True)
class SampleSizeResult:
    n_total: int | None
    n_control: int | None
    n_treatment: int | None
    relative_mde: float
    alpha: float
    power: float
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class MdeResult:
    relative_mde: float | None
    absolute_mde: float | None
    alpha: float
    power: float
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class PowerResult:
    power: float | None
    error: ErrorCode | None = None
    message: str | None = None


def _treatment_rate_message(mean: float, rel: float) -> str | None:
    pt = mean * (1.0 + rel)
    if not 0.0 <= pt <= 1.0:
        return f"the treatment rate {mean!r}·(1 + {rel!r}) = {pt:g} lies outside [0, 1]"
    return None


def _variances(kind: MetricKind, mean: float, unit_variance: float | None, rel: float) -> tuple[float, float]:
    if kind is MetricKind.PROPORTION:
        pt = mean * (1.0 + rel)  # callers checked it lies in [0, 1]
        return mean * (1.0 - mean), pt * (1.0 - pt)
    v = float(unit_variance or 0.0)
    return v, v


def _se(
    kind: MetricKind,
    mean: float,
    unit_variance: float | None,
    rel: float,
    n_c: float,
    n_t: float,
    test: LiftTest,
) -> float:
    """Standard error of the tested lift, on the scale of the relative effect (divided by |μ|)."""
    vc, vt = _variances(kind, mean, unit_variance, rel)
    if test is LiftTest.RELATIVE:
        vc *= (1.0 + rel) ** 2
    return math.sqrt(vc / n_c + vt / n_t) / abs(mean)


def _check(
    mean: float, unit_variance: float | None, kind: MetricKind, alpha: float, share: float
) -> str | None:
    if (msg := check_alpha(alpha)) is not None:
        return msg
    if (msg := check_finite(mean=mean, unit_variance=unit_variance, treatment_share=share)) is not None:
        return msg
    if not (0.0 < share < 1.0):
        return "treatment_share must lie in (0, 1)"
    if kind is MetricKind.PROPORTION and not (0.0 < mean < 1.0):
        return f"a proportion's baseline must lie in (0, 1), got {mean!r}"
    if kind is not MetricKind.PROPORTION and (unit_variance is None or unit_variance <= 0.0):
        return "unit_variance must be > 0 for mean and ratio metrics"
    if mean == 0.0:
        return "a relative effect needs a non-zero baseline mean"
    return None


def _required_sample_size(
    mean: float,
    relative_mde: float,
    kind: MetricKind | str = MetricKind.PROPORTION,
    unit_variance: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    treatment_share: float = 0.5,
    test: LiftTest | str = LiftTest.ABSOLUTE,
) -> SampleSizeResult:
    """Units needed (control + treatment) to detect ``relative_mde`` with ``power``."""
    kind, test = MetricKind(kind), LiftTest(test)
    msg = _check(mean, unit_variance, kind, alpha, treatment_share)
    if msg is None:
        msg = check_finite(relative_mde=relative_mde, power=power)
    if msg is None and (relative_mde == 0.0 or not (0.0 < power < 1.0)):
        msg = "relative_mde must be non-zero and power in (0, 1)"
    if msg is None and kind is MetricKind.PROPORTION:
        msg = _treatment_rate_message(mean, relative_mde)
    if msg is not None:
        return SampleSizeResult(None, None, None, relative_mde, alpha, power, ErrorCode.INVALID_INPUT, msg)
    z = float(sps.norm.ppf(1.0 - alpha / 2.0) + sps.norm.ppf(power))
    # SE at N units in total is se1/sqrt(N) with se1 the SE of one unit split by the share
    se1 = _se(kind, mean, unit_variance, relative_mde, 1.0 - treatment_share, treatment_share, test)
    if not se1 > 0.0:
        return SampleSizeResult(
            None,
            None,
            None,
            relative_mde,
            alpha,
            power,
            ErrorCode.ZERO_VARIANCE,
            "zero variance in both arms",
        )
    n = (z * se1 / relative_mde) ** 2
    if finite(n) is None:
        return SampleSizeResult(
            None, None, None, relative_mde, alpha, power, ErrorCode.INVALID_INPUT, "overflow"
        )
    n_c = math.ceil(n * (1.0 - treatment_share))
    n_t = math.ceil(n * treatment_share)
    return SampleSizeResult(n_c + n_t, n_c, n_t, relative_mde, alpha, power)


def _minimum_detectable_effect(
    mean: float,
    n_control: int,
    n_treatment: int,
    kind: MetricKind | str = MetricKind.PROPORTION,
    unit_variance: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    test: LiftTest | str = LiftTest.ABSOLUTE,
) -> MdeResult:
    """The smallest relative lift (positive direction) detected with ``power``."""
    kind, test = MetricKind(kind), LiftTest(test)
    n = n_control + n_treatment
    share = n_treatment / n if n > 0 else 0.0
    msg = _check(mean, unit_variance, kind, alpha, share) or check_finite(power=power)
    if msg is None and (n_control < 2 or n_treatment < 2 or not (0.0 < power < 1.0)):
        msg = "need >= 2 units per variant and power in (0, 1)"
    if msg is not None:
        code = ErrorCode.TOO_FEW_UNITS if n_control < 2 or n_treatment < 2 else ErrorCode.INVALID_INPUT
        return MdeResult(None, None, alpha, power, code, msg)
    z = float(sps.norm.ppf(1.0 - alpha / 2.0) + sps.norm.ppf(power))
    rel = 0.0
    for _ in range(100):  # the SE depends on the effect (proportions, relative test); a few steps
        if kind is MetricKind.PROPORTION and (why := _treatment_rate_message(mean, rel)) is not None:
            return MdeResult(None, None, alpha, power, ErrorCode.INVALID_INPUT, f"no detectable lift: {why}")
        new = z * _se(kind, mean, unit_variance, rel, n_control, n_treatment, test)
        if abs(new - rel) < 1e-12:
            break
        rel = new
    return MdeResult(finite(rel), finite(rel * abs(mean)), alpha, power)


def _power_of(
    mean: float,
    relative_effect: float,
    n_control: int,
    n_treatment: int,
    kind: MetricKind | str = MetricKind.PROPORTION,
    unit_variance: float | None = None,
    alpha: float = 0.05,
    test: LiftTest | str = LiftTest.ABSOLUTE,
) -> PowerResult:
    """Probability that the two-sided test at ``alpha`` detects ``relative_effect``."""
    kind, test = MetricKind(kind), LiftTest(test)
    n = n_control + n_treatment
    msg = _check(mean, unit_variance, kind, alpha, n_treatment / n if n > 0 else 0.0)
    msg = msg or check_finite(relative_effect=relative_effect)
    if msg is None and (n_control < 2 or n_treatment < 2):
        msg = "need >= 2 units per variant"
    if msg is None and kind is MetricKind.PROPORTION:
        msg = _treatment_rate_message(mean, relative_effect)
    if msg is not None:
        return PowerResult(None, ErrorCode.INVALID_INPUT, msg)
    se = _se(kind, mean, unit_variance, relative_effect, n_control, n_treatment, test)
    if se <= 0.0:
        return PowerResult(None, ErrorCode.ZERO_VARIANCE, "zero variance")
    d = relative_effect / se
    za = float(sps.norm.ppf(1.0 - alpha / 2.0))
    return PowerResult(finite(float(sps.norm.cdf(d - za) + sps.norm.cdf(-d - za))))


def required_sample_size(
    mean: float,
    relative_mde: float,
    kind: MetricKind | str = MetricKind.PROPORTION,
    unit_variance: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    treatment_share: float = 0.5,
    test: LiftTest | str = LiftTest.ABSOLUTE,
) -> SampleSizeResult:
    """Units needed (control + treatment) to detect ``relative_mde`` with ``power``."""
    try:
        return _required_sample_size(
            mean, relative_mde, kind, unit_variance, alpha, power, treatment_share, test
        )
    except NUMERIC_ERRORS as exc:
        return SampleSizeResult(
            None, None, None, relative_mde, alpha, power, ErrorCode.INVALID_INPUT, numeric_message(exc)
        )


def minimum_detectable_effect(
    mean: float,
    n_control: int,
    n_treatment: int,
    kind: MetricKind | str = MetricKind.PROPORTION,
    unit_variance: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    test: LiftTest | str = LiftTest.ABSOLUTE,
) -> MdeResult:
    """The smallest relative lift (positive direction) detected with ``power``."""
    try:
        return _minimum_detectable_effect(
            mean, n_control, n_treatment, kind, unit_variance, alpha, power, test
        )
    except NUMERIC_ERRORS as exc:
        return MdeResult(None, None, alpha, power, ErrorCode.INVALID_INPUT, numeric_message(exc))


def power_of(
    mean: float,
    relative_effect: float,
    n_control: int,
    n_treatment: int,
    kind: MetricKind | str = MetricKind.PROPORTION,
    unit_variance: float | None = None,
    alpha: float = 0.05,
    test: LiftTest | str = LiftTest.ABSOLUTE,
) -> PowerResult:
    """Probability that the two-sided test at ``alpha`` detects ``relative_effect``."""
    try:
        return _power_of(mean, relative_effect, n_control, n_treatment, kind, unit_variance, alpha, test)
    except NUMERIC_ERRORS as exc:
        return PowerResult(None, ErrorCode.INVALID_INPUT, numeric_message(exc))
