"""Multiple-comparison corrections across metrics × variants (× segments).

Holm (1979) step-down controls the family-wise error rate: sort p ascending,
p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)). Benjamini–Hochberg (1995) step-up
controls the false discovery rate: p̃_(i) = min_{j ≥ i} min(1, m·p_(j)/j). ``None``
entries (tests that could not be computed) are passed through and do not count in m.

A p-value that is NaN, infinite or outside [0, 1] raises :class:`InvalidPValue` with
its position: NaN compares false with everything, so ranking it would silently place it
anywhere and change every other adjusted value.

Adjusted confidence intervals (:func:`adjusted_intervals`) go with the adjusted p-values:
Bonferroni intervals at level 1 − α/m are simultaneous; Holm-consistent intervals use,
for each comparison, the level at which Holm's step-down tested it, so an interval
excludes 0 exactly when its Holm-adjusted p-value is below α.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from scipy import stats as sps

from analytics.stats.errors import ErrorCode, check_alpha, finite


class InvalidPValue(ValueError):
    """A p-value that cannot be ranked (NaN, ±inf, or outside [0, 1])."""


def _present(p_values: Sequence[float | None]) -> list[tuple[int, float]]:
    present = []
    for i, p in enumerate(p_values):
        if p is None:
            continue
        v = float(p)
        if not math.isfinite(v) or not 0.0 <= v <= 1.0:
            raise InvalidPValue(f"p-value #{i} is {p!r}: p-values must be finite and lie in [0, 1]")
        present.append((i, v))
    return sorted(present, key=lambda t: t[1])


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm–Bonferroni adjusted p-values, in the input order."""
    ranked = _present(p_values)
    m = len(ranked)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for j, (i, p) in enumerate(ranked):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the input order."""
    ranked = _present(p_values)
    m = len(ranked)
    out: list[float | None] = [None] * len(p_values)
    running = 1.0
    for j in range(m - 1, -1, -1):
        i, p = ranked[j]
        running = min(running, min(1.0, m * p / (j + 1)))
        out[i] = running
    return out


class IntervalAdjustment(StrEnum):
    BONFERRONI = "bonferroni"  # simultaneous: every interval at 1 − α/m
    HOLM = "holm"  # consistent with Holm's decisions (see adjusted_intervals)


@dataclass(frozen=True, slots=True)
class Effect:
    """An estimate with its standard error; ``dof`` for a t reference (Welch), ``None``: normal."""

    estimate: float
    std_error: float
    dof: float | None = None

    @property
    def p_value(self) -> float:
        t = abs(self.estimate) / self.std_error
        sf = sps.norm.sf(t) if self.dof is None else sps.t.sf(t, self.dof)
        return float(min(1.0, 2.0 * sf))

    def quantile(self, level: float) -> float:
        """The two-sided critical value at confidence ``level`` for this estimate's reference."""
        p = 0.5 + level / 2.0
        return float(sps.norm.ppf(p) if self.dof is None else sps.t.ppf(p, self.dof))


@dataclass(frozen=True, slots=True)
class AdjustedInterval:
    estimate: float | None
    lower: float | None
    upper: float | None
    level: float | None  # the per-comparison confidence level used (1 − α_i)
    p_adjusted: float | None
    error: ErrorCode | None = None
    message: str | None = None


def _bad(e: Effect | None) -> str | None:
    if e is None:
        return "no estimate"
    values = (e.estimate, e.std_error, 1.0 if e.dof is None else e.dof)
    if not all(math.isfinite(float(v)) for v in values):
        return "estimate, standard error or degrees of freedom is not finite"
    if e.std_error <= 0.0 or (e.dof is not None and e.dof <= 0.0):
        return "standard error and degrees of freedom must be > 0"
    return None


def adjusted_intervals(
    effects: Sequence[Effect | None],
    alpha: float = 0.05,
    method: IntervalAdjustment | str = IntervalAdjustment.HOLM,
) -> list[AdjustedInterval]:
    """Two-sided intervals for m comparisons, adjusted for multiplicity.

    - ``bonferroni``: each at 1 − α/m; they cover all m true effects at once with
      probability ≥ 1 − α, and exclude 0 iff the Bonferroni-adjusted p < α.
    - ``holm``: comparison of rank r (0-based, p ascending) that Holm rejects gets level
      1 − α/(m − r); every comparison from the first one Holm keeps onwards gets
      1 − α/(m − r*) with r* that rank. An interval excludes 0 iff Holm rejects it,
      and each is at least as narrow as Bonferroni's (it is not a simultaneous band:
      see docs/statistics.md for its measured joint coverage).

    ``None`` or invalid entries get an ``error`` and do not count in m.
    """
    method = IntervalAdjustment(method)
    out: list[AdjustedInterval] = [AdjustedInterval(None, None, None, None, None)] * len(effects)
    if (msg := check_alpha(alpha)) is not None:
        return [AdjustedInterval(None, None, None, None, None, ErrorCode.INVALID_INPUT, msg)] * len(effects)
    usable: list[tuple[int, Effect, float]] = []
    for i, e in enumerate(effects):
        if (why := _bad(e)) is not None or e is None:
            code = ErrorCode.NO_DATA if e is None else ErrorCode.INVALID_INPUT
            out[i] = AdjustedInterval(None, None, None, None, None, code, why)
        else:
            usable.append((i, e, e.p_value))
    m = len(usable)
    usable.sort(key=lambda t: t[2])
    adjusted = holm([p for _, _, p in usable]) if method is IntervalAdjustment.HOLM else None
    stopped_at: int | None = None
    for r, (i, e, p) in enumerate(usable):
        if method is IntervalAdjustment.BONFERRONI:
            level_alpha, p_adj = alpha / m, min(1.0, m * p)
        else:
            assert adjusted is not None
            p_adj = float(adjusted[r] or 0.0)
            if stopped_at is None and not p_adj < alpha:
                stopped_at = r
            level_alpha = alpha / (m - (r if stopped_at is None else stopped_at))
        q = e.quantile(1.0 - level_alpha)
        lo, hi = finite(e.estimate - q * e.std_error), finite(e.estimate + q * e.std_error)
        out[i] = AdjustedInterval(e.estimate, lo, hi, 1.0 - level_alpha, p_adj)
    return out
