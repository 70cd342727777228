"""CUPED: variance reduction with a pre-period covariate (Deng, Xu, Kohavi, Walker 2013).

The covariate c_i is the unit's own value before the experiment started (0 for a unit
without history — still valid, as c is unaffected by treatment). One θ is pooled over
all variants of the metric so the adjustment cannot favour a variant:

    θ = Σ_v (n_v−1)·cov_v(L, c) / Σ_v (n_v−1)·var_v(c)

where L is the metric's per-unit value (mean/proportion) or its delta-method
linearisation (x_i − R·y_i)/ȳ (ratio; needs ``sum_yc``). Each variant's adjusted mean is
m_v − θ·(c̄_v − c̄) with c̄ the pooled covariate mean (so the level of the metric is kept
for relative lifts), and its per-unit variance var(L) − 2θ·cov(L, c) + θ²·var(c).

Conventions (``theta=``), the same estimator up to O(1/n) terms, so results agree with the
engine a user cross-checks against:

- ``pooled`` (default): the within-arm pooled slope above (ANCOVA with a common slope).
- ``pooled_sums``: θ = cov(L, c)/var(c) on the arms' sums added together (GrowthBook adds
  the arms' sufficient statistics), which also counts the between-arm spread of c.
- ``per_arm``: θ_v = cov_v(L, c)/var_v(c) for each arm on its own (separate regressions per
  arm, Lin 2013): never less efficient asymptotically, noisier in small arms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from analytics.stats.errors import NUMERIC_ERRORS, finite
from analytics.stats.estimate import (
    MetricKind,
    VariantEstimate,
    estimate,
    linearised_cov_with_covariate,
)
from analytics.stats.sufficient import SampleStats


class CupedTheta(StrEnum):
    POOLED = "pooled"
    POOLED_SUMS = "pooled_sums"
    PER_ARM = "per_arm"


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
    theta: float | None  # the common θ (``None`` with ``per_arm``: see ``thetas``)
    variance_reduction: float | None
    applied: bool
    thetas: tuple[float | None, ...] = ()  # the θ each variant was adjusted with
    convention: CupedTheta = CupedTheta.POOLED


def _common_theta(usable: Sequence[SampleStats], kind: MetricKind, convention: CupedTheta) -> float | None:
    if convention is CupedTheta.POOLED_SUMS:
        union = usable[0]
        for s in usable[1:]:
            union = union + s
        return linearised_cov_with_covariate(union, kind) / union.var_c if union.var_c > 0.0 else None
    var_c = sum((s.n - 1) * s.var_c for s in usable)
    if var_c <= 0.0:
        return None
    return sum((s.n - 1) * linearised_cov_with_covariate(s, kind) for s in usable) / var_c


def _cuped_estimates(
    stats: Sequence[SampleStats],
    kind: MetricKind | str = MetricKind.MEAN,
    theta: CupedTheta | str = CupedTheta.POOLED,
) -> CupedEstimates:
    """Estimate every variant with CUPED (variants that fail stay failed)."""
    kind, convention = MetricKind(kind), CupedTheta(theta)
    raw = tuple(estimate(s, kind) for s in stats)
    usable = [s for s, e in zip(stats, raw, strict=True) if e.ok]
    if not usable or sum((s.n - 1) * s.var_c for s in usable) <= 0.0:
        return CupedEstimates(raw, raw, None, None, False, (None,) * len(raw), convention)
    common = None if convention is CupedTheta.PER_ARM else _common_theta(usable, kind, convention)
    if common is None and convention is not CupedTheta.PER_ARM:
        return CupedEstimates(raw, raw, None, None, False, (None,) * len(raw), convention)
    c_bar = sum(s.sum_c for s in usable) / sum(s.n for s in usable)
    adjusted: list[VariantEstimate] = []
    thetas: list[float | None] = []
    before = after = 0.0
    for s, e in zip(stats, raw, strict=True):
        if not e.ok or e.mean is None or e.unit_variance is None:
            adjusted.append(e)
            thetas.append(None)
            continue
        cov = linearised_cov_with_covariate(s, kind)
        # per arm: an arm without covariate variance is left unadjusted
        th = common if common is not None else (cov / s.var_c if s.var_c > 0.0 else 0.0)
        thetas.append(finite(th))
        unit_var = max(0.0, e.unit_variance - 2.0 * th * cov + th * th * s.var_c)
        mean = e.mean - th * (s.mean_c - c_bar)
        before += (s.n - 1) * e.unit_variance
        after += (s.n - 1) * unit_var
        adjusted.append(VariantEstimate(n=s.n, mean=mean, unit_variance=unit_var))
    reduction = 1.0 - after / before if before > 0.0 else None
    return CupedEstimates(
        tuple(adjusted), raw, finite(common), finite(reduction), True, tuple(thetas), convention
    )


def cuped_estimates(
    stats: Sequence[SampleStats],
    kind: MetricKind | str = MetricKind.MEAN,
    theta: CupedTheta | str = CupedTheta.POOLED,
) -> CupedEstimates:
    """Estimate every variant with CUPED, θ by the ``theta`` convention (module doc).

    Variants that fail stay failed; with no covariate variance the raw estimates are
    returned with ``applied=False``.
    """
    try:
        return _cuped_estimates(stats, kind, theta)
    except NUMERIC_ERRORS:
        # extreme covariate sums: fall back to the unadjusted estimates
        raw = tuple(estimate(s, kind) for s in stats)
        return CupedEstimates(raw, raw, None, None, False, (None,) * len(raw), CupedTheta(theta))
