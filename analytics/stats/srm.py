"""Sample ratio mismatch: are observed unit counts consistent with the configured weights?

Fixed check (:func:`srm_check`): Pearson χ² = Σ (O_v − E_v)²/E_v with E_v = N·w_v/Σw and
k−1 degrees of freedom over the variants with a positive weight. Flag at p < 0.001
(Fabijan et al. 2019, "Diagnosing Sample Ratio Mismatch in Online Controlled
Experiments"): a mismatch means the assignment or the logging is broken and no other
result of the experiment can be trusted. It is valid for ONE look; checked at every
report refresh its false alarms add up.

Sequential check (:func:`sequential_srm`): the Dirichlet–multinomial Bayes factor of
Lindon & Malek (2022, "Anytime-valid inference for multinomial count data"). With the
null proportions p0 = w/Σw and a Dirichlet(A·p0) mixture over the alternative,

    BF = B(A·p0 + O) / (B(A·p0) · Π p0_v^{O_v}),   B(a) = Π Γ(a_v) / Γ(Σ a_v),

a nonnegative martingale under H0, so p = min(1, 1/BF) — kept as a running minimum —
is valid under continuous monitoring (Ville's inequality).

Edge cases, each with its own ``reason`` (same for both checks): units in a variant with
weight 0 are a mismatch by definition (flagged, p = 0); counts/weights of different
lengths, a negative/NaN/inf weight or count, or weights summing to 0 are invalid input;
no unit at all is no data; a single variant with weight has nothing to mismatch (p = 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, finite, numeric_message

SRM_THRESHOLD = 0.001

#: Dirichlet concentration A of the sequential check's mixture: the prior sd of a
#: variant's share around p0 is ≈ sqrt(p0(1−p0)/A) (≈1.6 points at 50/50), so the test
#: is most sensitive to mismatches of a point or two — the size real bugs produce.
DEFAULT_SRM_CONCENTRATION = 1000.0


class SrmReason(StrEnum):
    """Why an SRM check answered as it did, when it is not a plain χ²/BF verdict."""

    LENGTH_MISMATCH = "length_mismatch"  # counts and weights differ in length
    INVALID_COUNTS = "invalid_counts"  # a negative, NaN or non-integer count
    INVALID_WEIGHTS = "invalid_weights"  # a negative, NaN or infinite weight
    NO_WEIGHT = "no_weight"  # all weights are 0: no design to compare with
    NO_DATA = "no_data"  # no unit observed yet
    ZERO_WEIGHT_HAS_UNITS = "zero_weight_has_units"  # units in a variant with weight 0: mismatch
    SINGLE_VARIANT = "single_variant"  # one variant with weight: nothing to compare


@dataclass(frozen=True, slots=True)
class SrmResult:
    flagged: bool
    p_value: float | None
    chi2: float | None
    dof: int
    expected: tuple[float, ...]
    threshold: float
    error: ErrorCode | None = None
    message: str | None = None
    reason: SrmReason | None = None


@dataclass(frozen=True, slots=True)
class SequentialSrmResult:
    """``p_value`` = min(1, 1/BF) at this look; keep the running minimum across looks."""

    flagged: bool
    p_value: float | None
    log_bayes_factor: float | None
    expected: tuple[float, ...]
    threshold: float
    concentration: float
    error: ErrorCode | None = None
    message: str | None = None
    reason: SrmReason | None = None


_Edge = tuple[bool, float | None, ErrorCode | None, str, SrmReason]


def _edge(counts: Sequence[float], weights: Sequence[float]) -> _Edge | None:
    """The verdict when the input is an edge case, else ``None``."""
    if len(counts) != len(weights):
        msg = f"{len(counts)} counts for {len(weights)} weights"
        return False, None, ErrorCode.INVALID_INPUT, msg, SrmReason.LENGTH_MISMATCH
    for i, c in enumerate(counts):
        v = float(c)
        if not math.isfinite(v) or v < 0 or v != math.floor(v):
            msg = f"count #{i} is {c!r}: counts must be non-negative integers"
            return False, None, ErrorCode.INVALID_INPUT, msg, SrmReason.INVALID_COUNTS
    for i, w in enumerate(weights):
        if not math.isfinite(float(w)) or float(w) < 0.0:
            msg = f"weight #{i} is {w!r}: weights must be finite and >= 0"
            return False, None, ErrorCode.INVALID_INPUT, msg, SrmReason.INVALID_WEIGHTS
    if float(sum(weights)) <= 0.0:
        return False, None, ErrorCode.INVALID_INPUT, "all weights are 0", SrmReason.NO_WEIGHT
    if sum(counts) == 0:
        return False, None, ErrorCode.NO_DATA, "no units observed yet", SrmReason.NO_DATA
    if any(c > 0 and w == 0 for c, w in zip(counts, weights, strict=True)):
        msg = "units assigned to a variant with weight 0"
        return True, 0.0, None, msg, SrmReason.ZERO_WEIGHT_HAS_UNITS
    if sum(1 for w in weights if w > 0) < 2:
        # no message: callers treat a message without an error as a mismatch to explain
        return False, 1.0, None, "", SrmReason.SINGLE_VARIANT
    return None


def _expected(counts: Sequence[float], weights: Sequence[float]) -> tuple[float, ...]:
    total, wsum = float(sum(counts)), float(sum(weights))
    return tuple(total * float(w) / wsum for w in weights)


def _srm_check(
    counts: Sequence[int], weights: Sequence[float], threshold: float = SRM_THRESHOLD
) -> SrmResult:
    if (edge := _edge(counts, weights)) is not None:
        flagged, p, code, msg, reason = edge
        expected = _expected(counts, weights) if code is None else ()
        chi2 = 0.0 if reason is SrmReason.SINGLE_VARIANT else None
        return SrmResult(flagged, p, chi2, 0, expected, threshold, code, msg or None, reason)
    expected = _expected(counts, weights)
    pairs = [(c, e) for c, e in zip(counts, expected, strict=True) if e > 0.0]
    chi2 = sum((c - e) ** 2 / e for c, e in pairs)
    dof = len(pairs) - 1
    p = finite(float(sps.chi2.sf(chi2, dof)))
    if p is None:
        return SrmResult(False, None, None, dof, expected, threshold, ErrorCode.INVALID_INPUT, "not finite")
    return SrmResult(p < threshold, p, finite(chi2), dof, expected, threshold)


def srm_check(counts: Sequence[int], weights: Sequence[float], threshold: float = SRM_THRESHOLD) -> SrmResult:
    """χ² goodness-of-fit of unit ``counts`` per variant against ``weights`` (any scale), one look."""
    try:
        return _srm_check(counts, weights, threshold)
    except NUMERIC_ERRORS as exc:
        return SrmResult(False, None, None, 0, (), threshold, ErrorCode.INVALID_INPUT, numeric_message(exc))


def _log_beta(a: Sequence[float]) -> float:
    return sum(math.lgamma(v) for v in a) - math.lgamma(sum(a))


def _sequential_srm(
    counts: Sequence[int], weights: Sequence[float], threshold: float, concentration: float
) -> SequentialSrmResult:
    def result(flagged: bool, p: float | None, lbf: float | None, **kw: object) -> SequentialSrmResult:
        expected = _expected(counts, weights) if kw.get("error") is None else ()
        return SequentialSrmResult(flagged, p, lbf, expected, threshold, concentration, **kw)  # type: ignore[arg-type]

    if not (0.0 < threshold < 1.0) or not (math.isfinite(concentration) and concentration > 0.0):
        return result(
            False, None, None, error=ErrorCode.INVALID_INPUT,
            message="threshold must lie in (0, 1) and concentration be > 0",
        )  # fmt: skip
    if (edge := _edge(counts, weights)) is not None:
        flagged, p, code, msg, reason = edge
        lbf = 0.0 if reason is SrmReason.SINGLE_VARIANT else None
        return result(flagged, p, lbf, error=code, message=msg or None, reason=reason)
    wsum = float(sum(weights))
    kept = [(float(c), float(w) / wsum) for c, w in zip(counts, weights, strict=True) if w > 0]
    prior = [concentration * p0 for _, p0 in kept]
    posterior = [a + c for a, (c, _) in zip(prior, kept, strict=True)]
    log_bf = _log_beta(posterior) - _log_beta(prior) - sum(c * math.log(p0) for c, p0 in kept)
    p = min(1.0, math.exp(-log_bf)) if log_bf > 0.0 else 1.0
    return result(p <= threshold, p, finite(log_bf))


def sequential_srm(
    counts: Sequence[int],
    weights: Sequence[float],
    threshold: float = SRM_THRESHOLD,
    concentration: float = DEFAULT_SRM_CONCENTRATION,
) -> SequentialSrmResult:
    """Anytime-valid SRM check (Dirichlet–multinomial Bayes factor, see the module doc).

    Safe to evaluate at every refresh: flag when the running minimum of ``p_value`` is at
    most ``threshold`` (``flagged`` says so for this look's value).
    """
    try:
        return _sequential_srm(counts, weights, threshold, concentration)
    except NUMERIC_ERRORS as exc:
        return SequentialSrmResult(
            False, None, None, (), threshold, concentration, ErrorCode.INVALID_INPUT, numeric_message(exc)
        )
