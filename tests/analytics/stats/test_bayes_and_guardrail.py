"""Bayesian chance to beat control (vs Monte Carlo) and the fixed-horizon non-inferiority test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import (
    Direction,
    ErrorCode,
    GaussianPrior,
    SampleStats,
    VariantEstimate,
    chance_to_beat,
    estimate,
    noninferiority,
)
from tests.analytics.stats.simulate import assert_json_safe

CONTROL = VariantEstimate(n=4000, mean=10.0, unit_variance=16.0)
TREATMENT = VariantEstimate(n=4000, mean=10.15, unit_variance=18.0)


def _posterior_draws(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    mc = rng.normal(float(CONTROL.mean or 0), float(CONTROL.std_error or 0), size)
    mt = rng.normal(float(TREATMENT.mean or 0), float(TREATMENT.std_error or 0), size)
    return mc, mt


def test_chance_to_beat_and_expected_loss_match_monte_carlo() -> None:
    rng = np.random.default_rng(51)
    mc, mt = _posterior_draws(rng, 1_000_000)
    # the relative lift's Gaussian (delta-method) approximation is looser in the tails
    for relative, lift, tol in ((False, mt - mc, 0.03), (True, (mt - mc) / np.abs(mc), 0.1)):
        r = chance_to_beat(CONTROL, TREATMENT, Direction.INCREASE, relative=relative)
        assert r.chance_to_beat_control == pytest.approx((lift > 0).mean(), abs=0.003)
        assert r.risk_treatment == pytest.approx(np.maximum(0, -lift).mean(), rel=tol)
        assert r.risk_control == pytest.approx(np.maximum(0, lift).mean(), rel=tol)
        assert_json_safe(r)
    down = chance_to_beat(CONTROL, TREATMENT, Direction.DECREASE)
    up = chance_to_beat(CONTROL, TREATMENT, Direction.INCREASE)
    assert down.chance_to_beat_control == pytest.approx(1 - (up.chance_to_beat_control or 0))


def test_a_normal_prior_shrinks_the_lift_like_importance_weighted_monte_carlo() -> None:
    rng = np.random.default_rng(52)
    prior = GaussianPrior(mean=0.0, variance=0.005**2)
    r = chance_to_beat(CONTROL, TREATMENT, prior=prior)
    flat = chance_to_beat(CONTROL, TREATMENT)
    assert flat.posterior_mean is not None and flat.posterior_std is not None
    theta = rng.normal(flat.posterior_mean, flat.posterior_std, 1_000_000)
    w = sps.norm.pdf(theta, prior.mean, np.sqrt(prior.variance))
    assert r.posterior_mean == pytest.approx(np.average(theta, weights=w), rel=0.01)
    assert r.chance_to_beat_control == pytest.approx(np.average(theta > 0, weights=w), abs=0.003)
    assert abs(r.posterior_mean or 0) < abs(flat.posterior_mean)


def test_noninferiority_p_value_matches_a_shifted_one_sided_welch_test() -> None:
    rng = np.random.default_rng(53)
    a, b = rng.normal(200, 40, 3000), rng.normal(203, 45, 2500)  # latency: lower is better
    c, t = estimate(SampleStats.from_values(a)), estimate(SampleStats.from_values(b))
    margin = 5.0
    r = noninferiority(c, t, margin, Direction.DECREASE, relative=False)
    ref = sps.ttest_ind(b - margin, a, equal_var=False, alternative="less")
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert r.noninferior is bool(ref.pvalue < 0.05)
    for m in (0.05, 0.02):  # relative margins: the contrast b − (1 + m)·a, no division by a noisy mean
        r_rel = noninferiority(c, t, m, Direction.DECREASE)
        ref_rel = sps.ttest_ind(b, (1 + m) * a, equal_var=False, alternative="less")
        assert r_rel.p_value == pytest.approx(ref_rel.pvalue, rel=1e-9)
        r_up = noninferiority(t, c, m, Direction.INCREASE)  # now "higher is better", roles swapped
        ref_up = sps.ttest_ind((1 - m) * b, a, equal_var=False, alternative="less")
        assert r_up.p_value == pytest.approx(ref_up.pvalue, rel=1e-9)
    rel = noninferiority(c, t, 0.05, Direction.DECREASE)  # 5% of 200 ms = 10 ms
    assert rel.noninferior and rel.harm_upper is not None and rel.harm_upper < 0.05
    worse = noninferiority(c, t, 0.0, Direction.DECREASE)
    assert not worse.noninferior
    assert_json_safe(rel)


def test_noninferiority_is_calibrated_at_the_margin() -> None:
    """At a true harm exactly equal to the margin, non-inferiority is declared ≈ alpha of the time."""
    rng = np.random.default_rng(54)
    sims, n = 2000, 400
    a = rng.normal(100, 20, (sims, n))
    b = rng.normal(95, 20, (sims, n))  # 5% worse on an increase metric
    declared = 0
    for i in range(sims):
        c = VariantEstimate(n, float(a[i].mean()), float(a[i].var(ddof=1)))
        t = VariantEstimate(n, float(b[i].mean()), float(b[i].var(ddof=1)))
        declared += noninferiority(c, t, 0.05, Direction.INCREASE).noninferior
    assert 0.035 <= declared / sims <= 0.065


def test_bayes_and_noninferiority_degenerate_inputs() -> None:
    zero_mean = VariantEstimate(n=10, mean=0.0, unit_variance=1.0)
    assert chance_to_beat(zero_mean, TREATMENT).error is ErrorCode.ZERO_CONTROL_MEAN
    assert chance_to_beat(zero_mean, TREATMENT, relative=False).error is None
    assert chance_to_beat(CONTROL, TREATMENT, prior=GaussianPrior(0, 0)).error is ErrorCode.INVALID_INPUT
    empty = estimate(SampleStats(0, 0.0, 0.0))
    assert noninferiority(empty, TREATMENT, 0.05, "decrease").error is ErrorCode.EMPTY_VARIANT
    assert noninferiority(CONTROL, TREATMENT, -1, "decrease").error is ErrorCode.INVALID_INPUT
    for r in (chance_to_beat(zero_mean, TREATMENT), noninferiority(empty, TREATMENT, 0.05, "decrease")):
        assert_json_safe(r)


def test_guardrail_verdicts_agree_with_their_bounds() -> None:
    rng = np.random.default_rng(55)
    for _ in range(300):
        n_c, n_t = (int(v) for v in rng.integers(20, 5000, 2))
        mc = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.01, 10))
        c = VariantEstimate(n_c, mc, float(rng.uniform(0.01, 50)))
        t = VariantEstimate(n_t, mc * float(rng.uniform(0.7, 1.3)), float(rng.uniform(0.01, 50)))
        margin = float(rng.uniform(0, 0.2))
        for direction in Direction:
            for relative in (True, False):
                r = noninferiority(c, t, margin, direction, relative=relative)
                assert r.error is None
                if r.harm_upper is not None:
                    assert r.noninferior == (r.harm_upper < margin)
                else:
                    assert not r.noninferior
