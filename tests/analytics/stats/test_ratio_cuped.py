"""Ratio-metric CUPED with a pre-period numerator and denominator."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.stats import cuped_estimates, estimate, welch_lift
from analytics.stats.ratio_cuped import RatioSampleStats, ratio_cuped_estimates
from tests.analytics.stats.simulate import assert_json_safe, stats_rows


def _units(rng: np.random.Generator, shape: tuple[int, ...], lift: float = 0.0) -> tuple[np.ndarray, ...]:
    """Per-unit requests (pre d, post y) and events (pre c, post x) with persistent unit traits."""
    activity = rng.lognormal(1.5, 0.8, shape)
    propensity = rng.beta(0.6, 3.0, shape)
    d, y = rng.poisson(activity), rng.poisson(activity) + 1
    c = rng.binomial(d, propensity)
    x = rng.binomial(y, np.minimum(1.0, propensity * (1.0 + lift)))
    return x.astype(float), y.astype(float), c.astype(float), d.astype(float)


def _rows(x: np.ndarray, y: np.ndarray, c: np.ndarray, d: np.ndarray) -> list[RatioSampleStats]:
    cols = [x, y, c, d, x * x, y * y, c * c, d * d, x * y, x * c, x * d, y * c, y * d, c * d]
    sums = [a.sum(-1) for a in cols]
    return [RatioSampleStats(x.shape[-1], *(float(s[i]) for s in sums)) for i in range(x.shape[0])]


def test_sums_formula_equals_cuped_on_explicit_unit_linearisations() -> None:
    rng = np.random.default_rng(701)
    arms = [_units(rng, (4000,)), _units(rng, (4000,), 0.1)]
    stats = [RatioSampleStats.from_values(*a) for a in arms]
    res = ratio_cuped_estimates(stats)
    lins, pres = [], []
    for x, y, c, d in arms:
        r, rp = x.sum() / y.sum(), c.sum() / d.sum()
        lins.append((x - r * y) / y.mean())
        pres.append((c - rp * d) / d.mean())
    dl = np.concatenate([v - v.mean() for v in lins])
    dp = np.concatenate([v - v.mean() for v in pres])
    theta = (dl * dp).sum() / (dp * dp).sum()
    assert res.applied and res.theta == pytest.approx(theta, rel=1e-9)
    pooled_pre = sum(a[2].sum() for a in arms) / sum(a[3].sum() for a in arms)
    for (x, y, c, d), lin, pre, e in zip(arms, lins, pres, res.estimates, strict=True):
        assert e.unit_variance == pytest.approx(np.var(lin - theta * pre, ddof=1), rel=1e-9)
        assert e.mean == pytest.approx(
            x.sum() / y.sum() - theta * (c.sum() / d.sum() - pooled_pre), rel=1e-12
        )
    for convention in ("pooled_sums", "per_arm"):
        other = ratio_cuped_estimates(stats, convention)
        assert other.applied and all(t is not None for t in other.thetas)
    assert_json_safe(res)


@pytest.mark.slow
def test_two_covariates_reduce_variance_more_than_the_numerator_alone_and_keep_calibration() -> None:
    rng = np.random.default_rng(702)
    sims, n = 1000, 800
    xc, yc, cc, dc = _units(rng, (sims, n))
    xt, yt, ct, dt = _units(rng, (sims, n))
    rows_c, rows_t = _rows(xc, yc, cc, dc), _rows(xt, yt, ct, dt)
    one_c, one_t = stats_rows(xc, yc, cc), stats_rows(xt, yt, ct)  # numerator-only covariate
    fp = fp_raw = 0
    red2, red1 = [], []
    for a, b, a1, b1 in zip(rows_c, rows_t, one_c, one_t, strict=True):
        two = ratio_cuped_estimates([a, b])
        one = cuped_estimates([a1, b1], "ratio")
        assert two.variance_reduction is not None and one.variance_reduction is not None
        red2.append(two.variance_reduction)
        red1.append(one.variance_reduction)
        r = welch_lift(*two.estimates)
        raw = welch_lift(estimate(a.post(), "ratio"), estimate(b.post(), "ratio"))
        assert r.absolute is not None and raw.absolute is not None
        fp += r.absolute.p_value < 0.05
        fp_raw += raw.absolute.p_value < 0.05
    print(
        f"ratio CUPED: variance reduction {np.mean(red2):.3f} with numerator+denominator, "
        f"{np.mean(red1):.3f} numerator only; A/A FPR {fp / sims:.4f} (raw {fp_raw / sims:.4f})"
    )
    assert np.mean(red2) > np.mean(red1) + 0.05
    assert abs(fp / sims - 0.05) <= 0.015


def test_ratio_cuped_power_beats_the_unadjusted_ratio_at_the_same_size() -> None:
    rng = np.random.default_rng(703)
    sims, n = 600, 1500
    xc, yc, cc, dc = _units(rng, (sims, n))
    xt, yt, ct, dt = _units(rng, (sims, n), lift=0.06)
    adj = raw = 0
    for a, b in zip(_rows(xc, yc, cc, dc), _rows(xt, yt, ct, dt), strict=True):
        r = welch_lift(*ratio_cuped_estimates([a, b]).estimates)
        r0 = welch_lift(estimate(a.post(), "ratio"), estimate(b.post(), "ratio"))
        adj += r.absolute is not None and r.absolute.p_value < 0.05
        raw += r0.absolute is not None and r0.absolute.p_value < 0.05
    print(f"ratio CUPED power, +6% at {n}/arm: {adj / sims:.3f} adjusted vs {raw / sims:.3f} raw")
    assert adj / sims > raw / sims + 0.05


def test_arms_without_pre_period_denominator_stay_unadjusted() -> None:
    a = RatioSampleStats.from_values([1, 2, 0], [3, 4, 2], [0, 0, 0], [0, 0, 0])
    res = ratio_cuped_estimates([a, a])
    assert not res.applied and res.estimates == res.unadjusted
    empty = RatioSampleStats.from_values([], [], [], [])
    out = ratio_cuped_estimates([empty, a])
    assert out.estimates[0].error is not None
    assert_json_safe(out)
    with pytest.raises(ValueError):
        RatioSampleStats.from_values([1], [1, 2], [1], [1])
