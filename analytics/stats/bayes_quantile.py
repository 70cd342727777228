"""Bayesian effect on a quantile metric (p50/p95 latency), Gaussian like GrowthBook's.

Each variant's q-quantile from its log-bucketed histogram (:mod:`analytics.stats.quantile`)
has a standard error from its order-statistic CI, SE = (upper − lower)/(2z); treating the
quantile as a mean with that variance, the lift (relative by default) gets the Gaussian
posterior of :func:`analytics.stats.bayes.chance_to_beat` — chance to beat, expected loss,
credible interval, optional prior. ``design_effect`` widens both SEs for requests clustered
in units (see :func:`analytics.stats.quantile.estimated_design_effect`).
"""

from __future__ import annotations

from collections.abc import Mapping

from analytics.stats.bayes import BayesResult, GaussianPrior, chance_to_beat
from analytics.stats.errors import Direction
from analytics.stats.estimate import VariantEstimate
from analytics.stats.quantile import BUCKETS_PER_E, QuantileEstimate, quantile_ci


def _as_estimate(e: QuantileEstimate) -> VariantEstimate:
    if e.error is not None or e.estimate is None or e.std_error is None:
        return VariantEstimate(e.n, None, None, e.error, e.message)
    # VariantEstimate.variance = unit_variance/n: store SE²·n so that variance = SE²
    return VariantEstimate(e.n, e.estimate, e.std_error * e.std_error * e.n)


def quantile_chance_to_beat(
    control: Mapping[int, int],
    treatment: Mapping[int, int],
    q: float,
    direction: Direction | str = Direction.DECREASE,
    relative: bool = True,
    prior: GaussianPrior | None = None,
    alpha: float = 0.05,
    design_effect: float = 1.0,
    buckets_per_e: int = BUCKETS_PER_E,
) -> BayesResult:
    """Posterior chance that the treatment's q-quantile is better, with expected losses."""
    c = quantile_ci(control, q, alpha, design_effect, buckets_per_e)
    t = quantile_ci(treatment, q, alpha, design_effect, buckets_per_e)
    return chance_to_beat(_as_estimate(c), _as_estimate(t), direction, relative, prior, alpha)
