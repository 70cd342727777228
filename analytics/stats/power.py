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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, check_alpha, finite, numeric_message
from analytics.stats.estimate import MetricKind


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


def _variances(kind: MetricKind, mean: float, unit_variance: float | None, rel: float) -> tuple[float, float]:
    if kind is MetricKind.PROPORTION:
        pt = min(1.0, max(0.0, mean * (1.0 + rel)))
        return mean * (1.0 - mean), pt * (1.0 - pt)
    v = float(unit_variance or 0.0)
    return v, v


def _check(
    mean: float, unit_variance: float | None, kind: MetricKind, alpha: float, share: float
) -> str | None:
    if (msg := check_alpha(alpha)) is not None:
        return msg
    if not (0.0 < share < 1.0):
        return "treatment_share must lie in (0, 1)"
    if kind is MetricKind.PROPORTION and not (0.0 < mean < 1.0):
        return "a proportion's baseline must lie in (0, 1)"
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
) -> SampleSizeResult:
    """Units needed (control + treatment) to detect ``relative_mde`` with ``power``."""
    kind = MetricKind(kind)
    msg = _check(mean, unit_variance, kind, alpha, treatment_share)
    if msg is None and (relative_mde == 0.0 or not (0.0 < power < 1.0)):
        msg = "relative_mde must be non-zero and power in (0, 1)"
    if msg is not None:
        return SampleSizeResult(None, None, None, relative_mde, alpha, power, ErrorCode.INVALID_INPUT, msg)
    vc, vt = _variances(kind, mean, unit_variance, relative_mde)
    z = float(sps.norm.ppf(1.0 - alpha / 2.0) + sps.norm.ppf(power))
    delta = relative_mde * abs(mean)
    n = z * z * (vc / (1.0 - treatment_share) + vt / treatment_share) / (delta * delta)
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
) -> MdeResult:
    """The smallest relative lift (positive direction) detected with ``power``."""
    kind = MetricKind(kind)
    n = n_control + n_treatment
    share = n_treatment / n if n > 0 else 0.0
    msg = _check(mean, unit_variance, kind, alpha, share)
    if msg is None and (n_control < 2 or n_treatment < 2 or not (0.0 < power < 1.0)):
        msg = "need >= 2 units per variant and power in (0, 1)"
    if msg is not None:
        code = ErrorCode.TOO_FEW_UNITS if n_control < 2 or n_treatment < 2 else ErrorCode.INVALID_INPUT
        return MdeResult(None, None, alpha, power, code, msg)
    z = float(sps.norm.ppf(1.0 - alpha / 2.0) + sps.norm.ppf(power))
    rel = 0.0
    for _ in range(50):  # σ_t² depends on the effect for proportions; converges in a few steps
        vc, vt = _variances(kind, mean, unit_variance, rel)
        new = z * math.sqrt(vc / n_control + vt / n_treatment) / abs(mean)
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
) -> PowerResult:
    """Probability that the two-sided test at ``alpha`` detects ``relative_effect``."""
    kind = MetricKind(kind)
    n = n_control + n_treatment
    msg = _check(mean, unit_variance, kind, alpha, n_treatment / n if n > 0 else 0.0)
    if msg is None and (n_control < 2 or n_treatment < 2):
        msg = "need >= 2 units per variant"
    if msg is not None:
        return PowerResult(None, ErrorCode.INVALID_INPUT, msg)
    vc, vt = _variances(kind, mean, unit_variance, relative_effect)
    se = math.sqrt(vc / n_control + vt / n_treatment)
    if se <= 0.0:
        return PowerResult(None, ErrorCode.ZERO_VARIANCE, "zero variance")
    d = relative_effect * abs(mean) / se
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
) -> SampleSizeResult:
    """Units needed (control + treatment) to detect ``relative_mde`` with ``power``."""
    try:
        return _required_sample_size(mean, relative_mde, kind, unit_variance, alpha, power, treatment_share)
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
) -> MdeResult:
    """The smallest relative lift (positive direction) detected with ``power``."""
    try:
        return _minimum_detectable_effect(mean, n_control, n_treatment, kind, unit_variance, alpha, power)
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
) -> PowerResult:
    """Probability that the two-sided test at ``alpha`` detects ``relative_effect``."""
    try:
        return _power_of(mean, relative_effect, n_control, n_treatment, kind, unit_variance, alpha)
    except NUMERIC_ERRORS as exc:
        return PowerResult(None, ErrorCode.INVALID_INPUT, numeric_message(exc))
