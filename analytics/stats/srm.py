"""Sample ratio mismatch: are observed unit counts consistent with the configured weights?

Pearson χ² = Σ (O_v − E_v)²/E_v with E_v = N·w_v/Σw and k−1 degrees of freedom over the
variants with a positive weight. Flag at p < 0.001 (Fabijan et al. 2019, "Diagnosing
Sample Ratio Mismatch in Online Controlled Experiments"): a mismatch means the
assignment or the logging is broken and no other result of the experiment can be trusted.
A variant with weight 0 that received units is a mismatch by definition (p = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, finite, numeric_message

SRM_THRESHOLD = 0.001


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


def _srm_check(
    counts: Sequence[int], weights: Sequence[float], threshold: float = SRM_THRESHOLD
) -> SrmResult:
    """χ² goodness-of-fit of unit ``counts`` per variant against ``weights`` (any scale)."""
    if len(counts) != len(weights) or any(w < 0 for w in weights) or any(c < 0 for c in counts):
        return SrmResult(False, None, None, 0, (), threshold, ErrorCode.INVALID_INPUT, "bad counts/weights")
    total, wsum = sum(counts), float(sum(weights))
    if total == 0 or wsum <= 0.0:
        return SrmResult(False, None, None, 0, (), threshold, ErrorCode.NO_DATA, "no units observed yet")
    expected = tuple(total * w / wsum for w in weights)
    if any(c > 0 and w == 0 for c, w in zip(counts, weights, strict=True)):
        return SrmResult(
            True, 0.0, None, 0, expected, threshold, message="units assigned to a variant with weight 0"
        )
    pairs = [(c, e) for c, e in zip(counts, expected, strict=True) if e > 0.0]
    if len(pairs) < 2:
        return SrmResult(False, 1.0, 0.0, 0, expected, threshold)
    chi2 = sum((c - e) ** 2 / e for c, e in pairs)
    dof = len(pairs) - 1
    p = finite(float(sps.chi2.sf(chi2, dof))) or 0.0
    return SrmResult(p < threshold, p, finite(chi2), dof, expected, threshold)


def srm_check(counts: Sequence[int], weights: Sequence[float], threshold: float = SRM_THRESHOLD) -> SrmResult:
    """χ² goodness-of-fit of unit ``counts`` per variant against ``weights`` (any scale)."""
    try:
        return _srm_check(counts, weights, threshold)
    except NUMERIC_ERRORS as exc:
        return SrmResult(False, None, None, 0, (), threshold, ErrorCode.INVALID_INPUT, numeric_message(exc))
