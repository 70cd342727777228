"""Selectable conventions: CUPED θ, relative-lift power, SRM edge cases, invalid input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analytics.stats import (
    ErrorCode,
    MetricKind,
    SampleStats,
    VariantEstimate,
    benjamini_hochberg,
    cuped_estimates,
    estimate,
    holm,
    minimum_detectable_effect,
    power_of,
    required_sample_size,
    srm_check,
    welch_lift,
)
from analytics.stats.correction import InvalidPValue
from analytics.stats.srm import SrmReason, sequential_srm
from tests.analytics.stats.simulate import assert_json_safe, stats_rows


def _arm(rng: np.random.Generator, shape: tuple[int, ...], slope: float, effect: float = 0.0) -> tuple:
    c = rng.normal(5.0, 1.0, shape)
    x = 10.0 + slope * (c - 5.0) + rng.normal(0.0, 1.0, shape) + effect
    return x, c


def test_cuped_per_arm_theta_is_each_arms_own_regression_slope() -> None:
    rng = np.random.default_rng(101)
    (xc, cc), (xt, ct) = _arm(rng, (5000,), 0.5), _arm(rng, (5000,), 1.5)
    stats = [SampleStats.from_values(xc, c=cc), SampleStats.from_values(xt, c=ct)]
    res = cuped_estimates(stats, theta="per_arm")
    assert res.theta is None and res.applied
    assert res.thetas[0] == pytest.approx(np.polyfit(cc, xc, 1)[0], rel=1e-9)
    assert res.thetas[1] == pytest.approx(np.polyfit(ct, xt, 1)[0], rel=1e-9)
    c_bar = np.concatenate([cc, ct]).mean()
    assert res.estimates[1].mean == pytest.approx(xt.mean() - res.thetas[1] * (ct.mean() - c_bar))
    resid = xt - res.thetas[1] * ct
    assert res.estimates[1].unit_variance == pytest.approx(np.var(resid, ddof=1), rel=1e-9)
    assert_json_safe(res)


def test_cuped_pooled_sums_theta_is_the_slope_on_both_arms_data_together() -> None:
    rng = np.random.default_rng(102)
    (xc, cc), (xt, ct) = _arm(rng, (3000,), 0.8), _arm(rng, (3000,), 0.8, effect=2.0)
    stats = [SampleStats.from_values(xc, c=cc), SampleStats.from_values(xt, c=ct)]
    gb = cuped_estimates(stats, theta="pooled_sums")
    slope = np.polyfit(np.concatenate([cc, ct]), np.concatenate([xc, xt]), 1)[0]
    assert gb.theta == pytest.approx(slope, rel=1e-9)
    within = cuped_estimates(stats)  # default: within-arm pooled
    assert within.theta != pytest.approx(gb.theta, rel=1e-6)
    assert within.theta == pytest.approx(gb.theta, abs=0.05)  # same estimator up to O(1/n)


@pytest.mark.parametrize("convention", ["pooled", "pooled_sums", "per_arm"])
def test_every_cuped_convention_keeps_the_aa_false_positive_rate_at_alpha(convention: str) -> None:
    rng = np.random.default_rng(103)
    sims, n = 2000, 200
    xc, cc = _arm(rng, (sims, n), 0.7)
    xt, ct = _arm(rng, (sims, n), 0.7)
    rejections = 0
    for c, t in zip(stats_rows(xc, c=cc), stats_rows(xt, c=ct), strict=True):
        e = cuped_estimates([c, t], theta=convention).estimates
        r = welch_lift(e[0], e[1])
        assert r.absolute is not None
        rejections += r.absolute.p_value < 0.05
    fpr = rejections / sims
    print(f"CUPED {convention}: A/A FPR {fpr:.4f}")
    assert abs(fpr - 0.05) <= 0.015


def test_relative_power_uses_the_delta_method_se_and_matches_simulation() -> None:
    mean, sd, rel = 10.0, 8.0, 0.05
    absolute = required_sample_size(mean, rel, "mean", unit_variance=sd**2)
    relative = required_sample_size(mean, rel, "mean", unit_variance=sd**2, test="relative")
    assert absolute.n_total is not None and relative.n_total is not None
    # (σ_t² + (1+δ)²σ_c²) / (2σ²) more units for the relative test at a 50/50 split
    assert relative.n_total / absolute.n_total == pytest.approx((1 + (1 + rel) ** 2) / 2, rel=2e-3)
    n = relative.n_total // 2
    pw = power_of(mean, rel, n, n, "mean", unit_variance=sd**2, test="relative")
    assert pw.power == pytest.approx(0.8, abs=2e-3)
    mde = minimum_detectable_effect(mean, n, n, "mean", unit_variance=sd**2, test="relative")
    assert mde.relative_mde == pytest.approx(rel, rel=2e-3)
    rng = np.random.default_rng(104)
    sims, hits = 1500, 0
    xc = rng.normal(mean, sd, (sims, n))
    xt = rng.normal(mean * (1 + rel), sd, (sims, n))
    for c, t in zip(stats_rows(xc), stats_rows(xt), strict=True):
        r = welch_lift(estimate(c), estimate(t))
        assert r.relative is not None
        hits += r.relative.p_value < 0.05
    print(f"relative-lift power at n={n}/arm: empirical {hits / sims:.3f}, nominal 0.800")
    assert abs(hits / sims - 0.8) <= 0.03


def test_power_refuses_rates_outside_zero_one_instead_of_clamping() -> None:
    assert required_sample_size(0.6, 1.0, "proportion").error is ErrorCode.INVALID_INPUT  # 120% rate
    assert power_of(0.6, 0.8, 100, 100, "proportion").error is ErrorCode.INVALID_INPUT
    assert power_of(1.2, 0.1, 100, 100, "proportion").error is ErrorCode.INVALID_INPUT
    assert power_of(-0.1, 0.1, 100, 100, "proportion").error is ErrorCode.INVALID_INPUT
    mde = minimum_detectable_effect(0.9, 10, 10, "proportion")
    assert mde.error is ErrorCode.INVALID_INPUT and "outside [0, 1]" in (mde.message or "")
    for bad in (math.nan, math.inf):
        assert power_of(bad, 0.1, 100, 100, "mean", unit_variance=1.0).error is ErrorCode.INVALID_INPUT
        assert power_of(1.0, 0.1, 100, 100, "mean", unit_variance=bad).error is ErrorCode.INVALID_INPUT
        assert required_sample_size(0.3, bad, "proportion").error is ErrorCode.INVALID_INPUT


def test_srm_edge_cases_have_distinct_reasons() -> None:
    cases = {
        SrmReason.ZERO_WEIGHT_HAS_UNITS: ([100, 3], [1.0, 0.0]),
        SrmReason.LENGTH_MISMATCH: ([1, 2], [1.0]),
        SrmReason.INVALID_WEIGHTS: ([10, 10], [1.0, math.nan]),
        SrmReason.NO_WEIGHT: ([10, 10], [0.0, 0.0]),
        SrmReason.INVALID_COUNTS: ([10, -1], [1.0, 1.0]),
        SrmReason.NO_DATA: ([0, 0], [1.0, 1.0]),
        SrmReason.SINGLE_VARIANT: ([7, 0], [1.0, 0.0]),
    }
    for reason, (counts, weights) in cases.items():
        for res in (srm_check(counts, weights), sequential_srm(counts, weights)):
            assert res.reason is reason, (reason, res)
            assert_json_safe(res)
    fixed = srm_check([100, 3], [1.0, 0.0])
    assert fixed.flagged and fixed.p_value == 0.0 and fixed.error is None
    assert not srm_check([10, 10], [1.0, math.inf]).flagged
    assert srm_check([10, 10], [1.0, -1.0]).error is ErrorCode.INVALID_INPUT
    assert srm_check([0, 0], [1.0, 1.0]).error is ErrorCode.NO_DATA
    single = srm_check([7, 0], [1.0, 0.0])
    assert not single.flagged and single.p_value == 1.0 and single.message is None


def test_nan_and_inf_p_values_are_rejected_with_their_position_never_ranked() -> None:
    for bad in (math.nan, math.inf, -0.1, 1.5):
        for fn in (holm, benjamini_hochberg):
            with pytest.raises(InvalidPValue, match="#1"):
                fn([0.01, bad, 0.2])


def test_impossible_sums_are_invalid_input_not_zero_variance() -> None:
    # Σx² = 1 < (Σx)²/n = 50: no data set has these sums
    bad = SampleStats(n=2, sum_x=10.0, sum_x2=1.0)
    for kind in ("mean", "proportion", "ratio"):
        e = estimate(SampleStats(n=2, sum_x=10.0, sum_x2=1.0, sum_y=2.0, sum_y2=2.0), kind)
        assert e.error is ErrorCode.INVALID_INPUT and "negative variance" in (e.message or ""), kind
    # |cov(x, y)| > sd(x)·sd(y): the ratio's delta-method variance would be negative
    ratio = estimate(SampleStats(n=3, sum_x=3.0, sum_x2=5.0, sum_y=3.0, sum_y2=5.0, sum_xy=50.0), "ratio")
    assert ratio.error is ErrorCode.INVALID_INPUT
    assert estimate(SampleStats(n=3, sum_x=3.0, sum_x2=3.0 - 1e-13)).ok  # rounding is not corruption
    neg = VariantEstimate(n=10, mean=1.0, unit_variance=-0.5)
    ok = estimate(SampleStats.from_values([1.0, 2.0, 3.0]))
    assert welch_lift(ok, neg).error is ErrorCode.INVALID_INPUT
    assert (
        welch_lift(ok, VariantEstimate(n=10, mean=math.nan, unit_variance=1.0)).error
        is ErrorCode.INVALID_INPUT
    )
    assert estimate(bad, MetricKind.MEAN).mean is None
