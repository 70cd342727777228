"""Power, MDE and sample size: against statsmodels and by simulation."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.power import NormalIndPower

from analytics.stats import (
    ErrorCode,
    MetricKind,
    SampleStats,
    estimate,
    minimum_detectable_effect,
    power_of,
    required_sample_size,
    welch_lift,
)
from tests.analytics.stats.simulate import assert_json_safe


@pytest.mark.parametrize("share", [0.5, 0.2])
def test_sample_size_for_a_mean_metric_matches_statsmodels(share: float) -> None:
    mean, sd, mde = 50.0, 20.0, 0.04
    r = required_sample_size(mean, mde, MetricKind.MEAN, unit_variance=sd**2, treatment_share=share)
    ratio = share / (1 - share)  # statsmodels: nobs2 = ratio * nobs1
    nobs1 = NormalIndPower().solve_power(effect_size=mde * mean / sd, alpha=0.05, power=0.8, ratio=ratio)
    assert r.n_control == pytest.approx(nobs1, abs=1.0)
    assert r.n_treatment == pytest.approx(nobs1 * ratio, abs=1.0)
    assert_json_safe(r)


@pytest.mark.slow
def test_a_five_percent_lift_in_thumbs_up_rate_is_detected_with_the_planned_power() -> None:
    base, lift, sims = 0.30, 0.05, 4000
    plan = required_sample_size(base, lift, MetricKind.PROPORTION, power=0.8)
    assert plan.n_control is not None and plan.n_treatment is not None
    rng = np.random.default_rng(31)
    ups_c = rng.binomial(plan.n_control, base, sims)
    ups_t = rng.binomial(plan.n_treatment, base * (1 + lift), sims)
    detected = 0
    for uc, ut in zip(ups_c, ups_t, strict=True):
        c = estimate(SampleStats(plan.n_control, float(uc), float(uc)), MetricKind.PROPORTION)
        t = estimate(SampleStats(plan.n_treatment, float(ut), float(ut)), MetricKind.PROPORTION)
        r = welch_lift(c, t)
        assert r.absolute is not None
        detected += r.absolute.p_value < 0.05 and r.absolute.estimate > 0
    empirical = detected / sims
    print(
        f"power: n={plan.n_total} units for +5% on 30% thumbs-up; empirical power {empirical:.4f} (nominal 0.80)"
    )
    assert empirical == pytest.approx(0.80, abs=0.025)


def test_power_mde_and_sample_size_are_consistent() -> None:
    plan = required_sample_size(0.3, 0.05, MetricKind.PROPORTION, power=0.9)
    assert plan.n_control is not None and plan.n_treatment is not None
    p = power_of(0.3, 0.05, plan.n_control, plan.n_treatment, MetricKind.PROPORTION)
    assert p.power == pytest.approx(0.9, abs=0.002)
    m = minimum_detectable_effect(0.3, plan.n_control, plan.n_treatment, MetricKind.PROPORTION, power=0.9)
    assert m.relative_mde == pytest.approx(0.05, rel=0.01)
    ratio_mde = minimum_detectable_effect(2.0, 5000, 5000, MetricKind.RATIO, unit_variance=4.0)
    assert ratio_mde.relative_mde == pytest.approx(2.8016 * np.sqrt(4.0 / 5000 * 2) / 2.0, rel=1e-3)


def test_power_inputs_out_of_domain_are_reported() -> None:
    assert required_sample_size(1.2, 0.05).error is ErrorCode.INVALID_INPUT
    assert required_sample_size(10.0, 0.05, MetricKind.MEAN).error is ErrorCode.INVALID_INPUT
    assert required_sample_size(0.3, 0.0).error is ErrorCode.INVALID_INPUT
    assert minimum_detectable_effect(0.3, 1, 100).error is ErrorCode.TOO_FEW_UNITS
    for r in (
        required_sample_size(0.3, 0.0),
        minimum_detectable_effect(0.3, 1, 100),
        power_of(0.3, 0.1, 0, 0),
    ):
        assert_json_safe(r)
