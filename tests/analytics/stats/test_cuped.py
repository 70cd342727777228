"""CUPED: pooled θ, variance reduction, unbiasedness, ratio metrics."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.stats import MetricKind, SampleStats, cuped_estimates, estimate, welch_lift
from tests.analytics.stats.simulate import assert_json_safe, stats_rows

RHO = 0.7


def _correlated(
    rng: np.random.Generator, shape: tuple[int, ...], effect: float
) -> tuple[np.ndarray, np.ndarray]:
    """Pre-period covariate c and outcome x with corr(x, c) = RHO, unit variance."""
    c = rng.normal(5.0, 1.0, shape)
    x = 10.0 + RHO * (c - 5.0) + np.sqrt(1 - RHO**2) * rng.normal(0.0, 1.0, shape) + effect
    return x, c


def test_pooled_theta_equals_within_group_regression_slope_and_reduction_is_rho_squared() -> None:
    rng = np.random.default_rng(21)
    xc, cc = _correlated(rng, (20000,), 0.0)
    xt, ct = _correlated(rng, (20000,), 0.2)
    res = cuped_estimates([SampleStats.from_values(xc, c=cc), SampleStats.from_values(xt, c=ct)])
    dx = np.concatenate([xc - xc.mean(), xt - xt.mean()])
    dc = np.concatenate([cc - cc.mean(), ct - ct.mean()])
    assert res.applied and res.theta == pytest.approx((dx * dc).sum() / (dc * dc).sum(), rel=1e-9)
    assert res.variance_reduction == pytest.approx(RHO**2, abs=0.02)
    adj_c = xc - res.theta * (cc - np.concatenate([cc, ct]).mean())
    assert res.estimates[0].mean == pytest.approx(adj_c.mean())
    assert res.estimates[0].unit_variance == pytest.approx(np.var(xc - res.theta * cc, ddof=1), rel=1e-9)
    assert_json_safe(res)


def test_cuped_is_unbiased_narrows_the_interval_and_keeps_coverage() -> None:
    rng = np.random.default_rng(22)
    sims, n, effect = 1000, 500, 0.1
    xc, cc = _correlated(rng, (sims, n), 0.0)
    xt, ct = _correlated(rng, (sims, n), effect)
    control, treatment = stats_rows(xc, c=cc), stats_rows(xt, c=ct)
    adj, raw, covered = [], [], 0
    for c, t in zip(control, treatment, strict=True):
        est = cuped_estimates([c, t]).estimates
        r = welch_lift(est[0], est[1])
        assert r.absolute is not None
        adj.append(r.absolute.estimate)
        covered += r.absolute.lower <= effect <= r.absolute.upper
        plain = welch_lift(estimate(c), estimate(t))
        assert plain.absolute is not None
        raw.append(plain.absolute.estimate)
    adj_a, raw_a = np.array(adj), np.array(raw)
    assert abs(adj_a.mean() - effect) < 3 * adj_a.std() / np.sqrt(sims)
    assert adj_a.std() / raw_a.std() == pytest.approx(np.sqrt(1 - RHO**2), abs=0.04)
    print(
        f"CUPED: sd ratio {adj_a.std() / raw_a.std():.3f} (theory {np.sqrt(1 - RHO**2):.3f}), coverage {covered / sims:.3f}"
    )
    assert 0.93 <= covered / sims <= 0.97


def test_ratio_cuped_uses_the_linearised_metric() -> None:
    rng = np.random.default_rng(23)
    arms = []
    for lift in (1.0, 1.05):
        requests = 1 + rng.poisson(5, 8000)
        propensity = rng.beta(2, 5, 8000)
        pre = rng.binomial(1 + rng.poisson(5, 8000), propensity).astype(float)  # pre-period numerator
        x = rng.binomial(requests, np.minimum(1, propensity * lift)).astype(float)
        arms.append((x, requests.astype(float), pre))
    stats = [SampleStats.from_values(x, y, c) for x, y, c in arms]
    res = cuped_estimates(stats, MetricKind.RATIO)
    lin, cs = [], []
    for x, y, c in arms:
        ratio = x.sum() / y.sum()
        lin.append((x - ratio * y) / y.mean() - ((x - ratio * y) / y.mean()).mean())
        cs.append(c - c.mean())
    dl, dc = np.concatenate(lin), np.concatenate(cs)
    theta = (dl * dc).sum() / (dc * dc).sum()
    assert res.theta == pytest.approx(theta, rel=1e-8)
    x, y, c = arms[0]
    ratio = x.sum() / y.sum()
    assert res.estimates[0].unit_variance == pytest.approx(
        np.var((x - ratio * y) / y.mean() - theta * c, ddof=1), rel=1e-8
    )
    assert res.variance_reduction is not None and res.variance_reduction > 0.1


def test_without_a_covariate_cuped_changes_nothing() -> None:
    a = SampleStats.from_values([1.0, 2.0, 3.0, 5.0])
    b = SampleStats.from_values([2.0, 2.0, 4.0, 6.0])
    res = cuped_estimates([a, b])
    assert not res.applied and res.theta is None
    assert res.estimates == (estimate(a), estimate(b))


def test_cuped_keeps_failed_variants_failed() -> None:
    empty = SampleStats(0, 0.0, 0.0)
    ok = SampleStats.from_values([1.0, 2.0, 4.0], c=[1.0, 1.5, 3.0])
    res = cuped_estimates([empty, ok])
    assert res.estimates[0].error is not None and res.estimates[1].ok
    assert_json_safe(res)
