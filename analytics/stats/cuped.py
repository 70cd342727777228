"""CUPED: variance reduction with a pre-period covariate (Deng, Xu, Kohavi, Walker 2013).

The covariate c_i is the unit's own value before the experiment started (0 for a unit
without history — still valid, as c is unaffected by treatment). One θ is pooled over
all variants of the metric so the adjustment cannot favour a variant:

    θ = Σ_v (n_v−1)·cov_v(L, c) / Σ_v (n_v−1)·var_v(c)

where L is the metric's per-unit value (mean/proportion) or its delta-method
linearisation (x_i − R·y_i)/ȳ (ratio; needs ``sum_yc``). Each variant's adjusted mean is
m_v − θ·(c̄_v − c̄) with c̄ the pooled covariate mean (so the level of the metric is kept
for relative lifts), and its per-unit variance var(L) − 2θ·cov(L, c) + θ²·var(c).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analytics.stats.errors import NUMERIC_ERRORS, finite
from analytics.stats.estimate import (
    MetricKind,
    VariantEstimate,
    estimate,
    linearised_cov_with_covariate,
)
from analytics.stats.sufficient import SampleStats


@dataclass(frozen=True, slots=True)
class CupedEstimates:
    """Adjusted estimates, in the order of the input variants.

    ``theta`` is ``None`` and ``estimates`` are the unadjusted ones when no variant has a
    covariate (all c = 0) or it has no variance. ``variance_reduction`` is
    1 − Σ(n_v−1)·var_adj / Σ(n_v−1)·var_unadj (0.3 = 30% less variance, i.e. the
    experiment needs 30% fewer units for the same precision).
    """

    estimates: tuple[VariantEstimate, ...]
    unadjusted: tuple[VariantEstimate, ...]
    theta: float | None
    variance_reduction: float | None
    applied: bool


def _cuped_estimates(
    stats: Sequence[SampleStats], kind: MetricKind | str = MetricKind.MEAN
) -> CupedEstimates:
    """Estimate every variant with one pooled CUPED θ (variants that fail stay failed)."""
    kind = MetricKind(kind)
    raw = tuple(estimate(s, kind) for s in stats)
    usable = [(s, e) for s, e in zip(stats, raw, strict=True) if e.ok]
    var_c = sum((s.n - 1) * s.var_c for s, _ in usable)
    if not usable or var_c <= 0.0:
        return CupedEstimates(raw, raw, None, None, applied=False)
    theta = sum((s.n - 1) * linearised_cov_with_covariate(s, kind) for s, _ in usable) / var_c
    c_bar = sum(s.sum_c for s, _ in usable) / sum(s.n for s, _ in usable)
    adjusted: list[VariantEstimate] = []
    before = after = 0.0
    for s, e in zip(stats, raw, strict=True):
        if not e.ok or e.mean is None or e.unit_variance is None:
            adjusted.append(e)
            continue
        cov = linearised_cov_with_covariate(s, kind)
        unit_var = max(0.0, e.unit_variance - 2.0 * theta * cov + theta * theta * s.var_c)
        mean = e.mean - theta * (s.mean_c - c_bar)
        before += (s.n - 1) * e.unit_variance
        after += (s.n - 1) * unit_var
        adjusted.append(VariantEstimate(n=s.n, mean=mean, unit_variance=unit_var))
    reduction = 1.0 - after / before if before > 0.0 else None
    return CupedEstimates(tuple(adjusted), raw, finite(theta), finite(reduction), applied=True)


def cuped_estimates(stats: Sequence[SampleStats], kind: MetricKind | str = MetricKind.MEAN) -> CupedEstimates:
    """Estimate every variant with one pooled CUPED θ (variants that fail stay failed)."""
    try:
        return _cuped_estimates(stats, kind)
    except NUMERIC_ERRORS:
        # extreme covariate sums: fall back to the unadjusted estimates
        raw = tuple(estimate(s, kind) for s in stats)
        return CupedEstimates(raw, raw, None, None, applied=False)
