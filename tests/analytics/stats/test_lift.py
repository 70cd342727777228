"""Welch lift for mean, proportion and ratio metrics against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import ErrorCode, MetricKind, SampleStats, compare, estimate, welch_lift
from tests.analytics.stats.simulate import assert_json_safe, stats_rows


def test_mean_lift_matches_scipy_welch_ttest() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.normal(10, 3, 400), rng.exponential(10.6, 650)
    r = compare(SampleStats.from_values(a), SampleStats.from_values(b), MetricKind.MEAN, alpha=0.1)
    ref = sps.ttest_ind(b, a, equal_var=False)
    assert r.absolute is not None and r.dof is not None
    assert r.absolute.estimate == pytest.approx(b.mean() - a.mean())
    assert r.absolute.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert r.dof == pytest.approx(ref.df, rel=1e-9)
    ci = ref.confidence_interval(0.9)
    assert (r.absolute.lower, r.absolute.upper) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert_json_safe(r)


def test_proportion_lift_matches_scipy_on_zero_one_values() -> None:
    rng = np.random.default_rng(8)
    a, b = (rng.random(3000) < 0.30).astype(float), (rng.random(2500) < 0.33).astype(float)
    r = compare(SampleStats.from_values(a), SampleStats.from_values(b), MetricKind.PROPORTION)
    ref = sps.ttest_ind(b, a, equal_var=False)
    assert r.absolute is not None
    assert r.absolute.p_value == pytest.approx(ref.pvalue, rel=1e-9)


def test_relative_lift_uses_the_delta_method_on_absolute_control_mean() -> None:
    rng = np.random.default_rng(9)
    a, b = rng.normal(-5, 2, 500), rng.normal(-4.5, 2, 500)
    r = compare(SampleStats.from_values(a), SampleStats.from_values(b))
    assert r.relative is not None
    mc, mt = a.mean(), b.mean()
    vc, vt = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    assert r.relative.estimate == pytest.approx((mt - mc) / abs(mc))
    assert r.relative.estimate > 0  # less negative is an increase
    assert r.relative.std_error == pytest.approx(math.sqrt(vt / mc**2 + mt**2 * vc / mc**4))


def test_relative_lift_se_agrees_with_bootstrap() -> None:
    rng = np.random.default_rng(10)
    a, b = rng.lognormal(0, 1, 800), rng.lognormal(0.05, 1, 800)
    r = compare(SampleStats.from_values(a), SampleStats.from_values(b))
    idx_a = rng.integers(0, len(a), (2000, len(a)))
    idx_b = rng.integers(0, len(b), (2000, len(b)))
    ma, mb = a[idx_a].mean(1), b[idx_b].mean(1)
    boot_se = ((mb - ma) / ma).std(ddof=1)
    assert r.relative is not None
    assert r.relative.std_error == pytest.approx(boot_se, rel=0.08)


def _ratio_units(rng: np.random.Generator, n: int, rate: float) -> tuple[np.ndarray, np.ndarray]:
    requests = 1 + rng.poisson(rng.gamma(1.0, 4.0, n))
    p = np.clip(rng.beta(2, 2 * (1 - rate) / rate, n), 0, 1)
    return rng.binomial(requests, p).astype(float), requests.astype(float)


def test_ratio_variance_matches_direct_delta_formula_and_bootstrap() -> None:
    rng = np.random.default_rng(11)
    x, y = _ratio_units(rng, 1500, 0.3)
    e = estimate(SampleStats.from_values(x, y), MetricKind.RATIO)
    r_hat = x.sum() / y.sum()
    lin = (x - r_hat * y) / y.mean()
    assert e.mean == pytest.approx(r_hat)
    assert e.variance == pytest.approx(lin.var(ddof=1) / len(x), rel=1e-9)
    idx = rng.integers(0, len(x), (2000, len(x)))
    boot = x[idx].sum(1) / y[idx].sum(1)
    assert e.std_error == pytest.approx(boot.std(ddof=1), rel=0.08)


def test_ratio_relative_lift_interval_covers_the_true_lift_at_nominal_rate() -> None:
    rng = np.random.default_rng(12)
    sims, units = 600, 2000
    xc, yc = _ratio_units(rng, sims * units, 0.3)
    xt, yt = _ratio_units(rng, sims * units, 0.36)
    shape = (sims, units)
    control = stats_rows(xc.reshape(shape), yc.reshape(shape))
    treatment = stats_rows(xt.reshape(shape), yt.reshape(shape))
    covered = 0
    for c, t in zip(control, treatment, strict=True):
        r = compare(c, t, MetricKind.RATIO)
        assert r.relative is not None
        covered += r.relative.lower < 0.2 < r.relative.upper  # E[x]/E[y]: 0.36/0.30 − 1
    print(f"ratio relative-lift 95% CI coverage: {covered / sims:.4f}")
    assert 0.92 <= covered / sims <= 0.98


@pytest.mark.parametrize(
    ("control", "treatment", "code"),
    [
        (SampleStats(0, 0.0, 0.0), SampleStats.from_values([1.0, 2.0]), ErrorCode.EMPTY_VARIANT),
        (SampleStats.from_values([1.0]), SampleStats.from_values([1.0, 2.0]), ErrorCode.TOO_FEW_UNITS),
        (
            SampleStats.from_values([3.0, 3.0]),
            SampleStats.from_values([3.0, 3.0, 3.0]),
            ErrorCode.ZERO_VARIANCE,
        ),
    ],
)
def test_degenerate_variants_return_an_error_code_not_an_exception(
    control: SampleStats, treatment: SampleStats, code: ErrorCode
) -> None:
    r = compare(control, treatment)
    assert r.error is code and r.message
    assert r.absolute is None and r.relative is None
    assert_json_safe(r)


def test_zero_control_mean_keeps_absolute_lift_and_flags_relative() -> None:
    r = compare(SampleStats.from_values([-1.0, 1.0, 0.0]), SampleStats.from_values([0.0, 1.0, 2.0]))
    assert r.error is None and r.absolute is not None
    assert r.relative is None and r.relative_error is ErrorCode.ZERO_CONTROL_MEAN
    assert_json_safe(r)


def test_relative_lift_without_variance_is_flagged() -> None:
    r = compare(SampleStats.from_values([1.0, 2.0, 3.0]), SampleStats.from_values([0.0, 0.0, 0.0]))
    assert r.absolute is not None and r.relative is None
    assert r.relative_error is ErrorCode.ZERO_VARIANCE


def test_ratio_with_zero_denominator_and_bad_alpha_are_reported() -> None:
    zero_y = SampleStats.from_values([0.0, 0.0], [0.0, 0.0])
    assert estimate(zero_y, MetricKind.RATIO).error is ErrorCode.ZERO_DENOMINATOR
    ok = SampleStats.from_values([1.0, 2.0, 4.0])
    assert welch_lift(estimate(ok), estimate(ok), alpha=1.5).error is ErrorCode.INVALID_INPUT


def test_one_sided_zero_variance_still_tests() -> None:
    r = compare(SampleStats.from_values([1.0, 1.0, 1.0]), SampleStats.from_values([1.0, 2.0, 3.0]))
    assert r.error is None and r.absolute is not None
    assert r.absolute.estimate == pytest.approx(1.0)
    assert_json_safe(r)
