"""Mann–Whitney U, Hodges–Lehmann shift and Moses CI: scipy, brute force, calibration, power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import Direction, ErrorCode
from analytics.stats.rank import batch_quantiles, mann_whitney, mann_whitney_guardrail
from tests.analytics.stats.simulate import assert_json_safe


def _brute_force(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[float, float | None, float | None]:
    d = np.sort(np.subtract.outer(y, x).ravel())
    m, n = len(x), len(y)
    pooled = np.concatenate([x, y])
    _, t = np.unique(pooled, return_counts=True)
    big = m + n
    var = m * n / 12 * ((big + 1) - (t**3 - t).sum() / (big * (big - 1)))
    k = math.floor(m * n / 2 - sps.norm.ppf(1 - alpha / 2) * math.sqrt(var) + 0.5)
    if k < 1:
        return float(np.median(d)), None, None
    return float(np.median(d)), float(d[k - 1]), float(d[m * n - k])


def test_u_and_p_value_equal_scipy_with_and_without_ties() -> None:
    rng = np.random.default_rng(301)
    for i in range(40):
        m, n = (int(v) for v in rng.integers(5, 400, 2))
        if i % 2:  # integer latencies: many ties
            x, y = rng.poisson(20, m).astype(float), rng.poisson(21, n).astype(float)
        else:
            x, y = rng.lognormal(0, 1, m), rng.lognormal(0.1, 1, n)
        r = mann_whitney(x, y)
        ref = sps.mannwhitneyu(y, x, method="asymptotic", use_continuity=True)
        assert r.u == pytest.approx(ref.statistic) and r.p_value == pytest.approx(ref.pvalue, rel=1e-9)
        ref_nc = sps.mannwhitneyu(y, x, method="asymptotic", use_continuity=False)
        assert mann_whitney(x, y, continuity=False).p_value == pytest.approx(ref_nc.pvalue, rel=1e-9)
        assert_json_safe(r)


def test_hodges_lehmann_shift_and_moses_interval_equal_the_sorted_pairwise_differences() -> None:
    rng = np.random.default_rng(302)
    for i in range(40):
        m, n = (int(v) for v in rng.integers(3, 150, 2))
        x = rng.normal(0, 1, m) if i % 3 else rng.integers(0, 5, m).astype(float)
        y = rng.normal(0.3, 2, n) if i % 3 else rng.integers(0, 6, n).astype(float)
        r = mann_whitney(x, y, alpha=0.1)
        shift, lo, hi = _brute_force(x, y, 0.1)
        assert r.shift == pytest.approx(shift, abs=1e-12)
        assert (r.shift_lower, r.shift_upper) == (lo, hi) or (
            r.shift_lower == pytest.approx(lo, abs=1e-12) and r.shift_upper == pytest.approx(hi, abs=1e-12)
        )


def test_a_textbook_example_shift_is_the_median_of_pairwise_differences() -> None:
    # Hollander & Wolfe style toy data: differences y − x are {1, 2, 3, 2, 3, 4}; median 2.5
    r = mann_whitney([1.0, 2.0], [3.0, 4.0, 5.0])
    assert r.shift == 2.5 and r.u == 6.0 and r.auc == 1.0
    assert r.shift_lower is None and r.shift_upper is None  # 2 vs 3 samples: no 95% interval


def test_aa_false_positive_rate_is_alpha_on_heavy_tailed_latencies() -> None:
    rng = np.random.default_rng(303)
    sims, n = 3000, 300
    x, y = rng.lognormal(5, 1, (sims, n)), rng.lognormal(5, 1, (sims, n))
    fpr = np.mean([mann_whitney(a, b, with_interval=False).p_value < 0.05 for a, b in zip(x, y, strict=True)])  # type: ignore[operator]
    print(f"Mann-Whitney A/A FPR {fpr:.4f} (3,000 sims, 300/arm, lognormal)")
    assert abs(fpr - 0.05) <= 0.015


def test_power_for_a_10_percent_slower_candidate_matches_noether() -> None:
    rng = np.random.default_rng(304)
    sims, n, sigma, shift = 2000, 400, 0.6, math.log(1.1)
    x = rng.lognormal(5, sigma, (sims, n))
    y = rng.lognormal(5 + shift, sigma, (sims, n))
    power = np.mean(
        [mann_whitney(a, b, with_interval=False).p_value < 0.05 for a, b in zip(x, y, strict=True)]
    )  # type: ignore[operator]
    p1 = sps.norm.cdf(shift / (sigma * math.sqrt(2)))  # P(Y > X) for a normal shift of the logs
    noether = sps.norm.cdf(math.sqrt(12 * n * n / (2 * n + 1)) * (p1 - 0.5) - sps.norm.ppf(0.975))
    print(f"Mann-Whitney power, +10% at 400/arm: {power:.3f} (Noether {noether:.3f})")
    assert abs(power - noether) <= 0.03


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_moses_interval_covers_the_true_log_ratio_at_its_level() -> None:
    rng = np.random.default_rng(305)
    sims, n, ratio = 1500, 200, 1.2
    covered = 0
    for _ in range(sims):
        x, y = rng.lognormal(5, 0.8, n), rng.lognormal(5, 0.8, n) * ratio
        r = mann_whitney(x, y, log_scale=True)
        assert r.ratio_lower is not None and r.ratio_upper is not None
        covered += r.ratio_lower <= ratio <= r.ratio_upper
    print(f"Hodges-Lehmann 95% CI coverage {covered / sims:.3f}")
    assert 0.935 <= covered / sims <= 0.965


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_guardrail_is_calibrated_at_the_margin_and_catches_a_30_percent_slower_candidate() -> None:
    rng = np.random.default_rng(306)
    sims, n, margin = 2000, 300, 0.1
    x = rng.lognormal(5, 0.7, (sims, n))
    at_margin = rng.lognormal(5, 0.7, (sims, n)) * (1 + margin)
    fp = np.mean(
        [
            mann_whitney_guardrail(a, b, margin, with_bounds=False).reject_harm
            for a, b in zip(x, at_margin, strict=True)
        ]
    )
    worse = rng.lognormal(5, 0.7, (sims, n)) * 1.3
    hit = np.mean(
        [
            mann_whitney_guardrail(a, b, margin, with_bounds=False).reject_harm
            for a, b in zip(x, worse, strict=True)
        ]
    )
    d = math.log(1.3) - math.log1p(margin)  # distance beyond the margin, log scale
    p1 = sps.norm.cdf(d / (0.7 * math.sqrt(2)))
    noether = sps.norm.cdf(math.sqrt(12 * n * n / (2 * n + 1)) * (p1 - 0.5) - sps.norm.ppf(0.95))
    print(
        f"rank guardrail: false rollback at the 10% margin {fp:.4f}; "
        f"30% slower caught {hit:.3f} at 300/arm (Noether {noether:.3f})"
    )
    assert abs(fp - 0.05) <= 0.015
    assert abs(hit - noether) <= 0.03
    g = mann_whitney_guardrail(x[0], worse[0], margin)
    assert g.harm is not None and g.harm_lower is not None and g.harm_upper is not None
    assert g.harm_lower <= g.harm <= g.harm_upper
    assert g.reject_harm == (g.harm_lower > margin)  # bound and test agree (Moses inverts the test)
    better = mann_whitney_guardrail(x[0], x[0] * 0.7, margin, Direction.DECREASE)
    assert better.noninferior and not better.reject_harm
    up = mann_whitney_guardrail(x[0], x[0] * 0.7, margin, Direction.INCREASE)  # e.g. tokens/s dropped 30%
    assert up.reject_harm


def test_batch_p95s_catch_a_tail_regression_that_the_request_level_test_calls_an_improvement() -> None:
    """p95 30% worse with the same mean (heavier tail, faster body)."""
    rng = np.random.default_rng(307)
    units, per_unit = 2000, 10
    sc, st = 0.5, 0.7583  # σ of log latency; μ_t chosen so that means are equal
    mu_c, mu_t = 5.0, 5.0 - (st**2 - sc**2) / 2
    xc = rng.lognormal(mu_c, sc, (units, per_unit))
    xt = rng.lognormal(mu_t, st, (units, per_unit))
    assert np.quantile(xt, 0.95) / np.quantile(xc, 0.95) == pytest.approx(1.3, abs=0.05)
    assert xt.mean() / xc.mean() == pytest.approx(1.0, abs=0.02)
    raw = mann_whitney_guardrail(xc.ravel(), xt.ravel(), 0.1, alpha=0.001)
    assert not raw.reject_harm and raw.harm is not None and raw.harm < 0  # typical request is faster
    batch_of_unit = np.repeat(np.arange(units) % 20, per_unit)
    pc = batch_quantiles(xc.ravel(), batch_of_unit, 0.95)
    pt = batch_quantiles(xt.ravel(), batch_of_unit, 0.95)
    assert len(pc) == len(pt) == 20
    tail = mann_whitney_guardrail(pc, pt, 0.1, alpha=0.001)
    assert tail.reject_harm and tail.harm is not None and tail.harm == pytest.approx(0.3, abs=0.06)


def test_bad_samples_get_reasons() -> None:
    assert mann_whitney([], [1.0]).error is ErrorCode.NO_DATA
    assert mann_whitney([1.0, math.nan], [1.0]).error is ErrorCode.INVALID_INPUT
    assert mann_whitney([1.0, 2.0], [0.0, 1.0], log_scale=True).error is ErrorCode.INVALID_INPUT
    assert mann_whitney([3.0, 3.0], [3.0]).error is ErrorCode.ZERO_VARIANCE
    assert mann_whitney([1.0], [2.0], alpha=0.0).error is ErrorCode.INVALID_INPUT
    assert mann_whitney_guardrail([1.0, 2.0], [3.0], -0.1).error is ErrorCode.INVALID_INPUT
    assert mann_whitney_guardrail([1.0, 2.0], [math.inf], 0.1).error is ErrorCode.INVALID_INPUT
    for r in (mann_whitney([], [1.0]), mann_whitney_guardrail([5.0], [5.0], 0.1)):
        assert_json_safe(r)
    with pytest.raises(ValueError):
        batch_quantiles([1.0, 2.0], [0], 0.5)
