"""Two-proportion conventions against statsmodels and scipy, with A/A calibration and power."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import confint_proportions_2indep, proportions_ztest

from analytics.stats import ErrorCode, SampleStats
from analytics.stats.proportion import proportion_lift
from tests.analytics.stats.simulate import assert_json_safe


def _stats(events: int, n: int) -> SampleStats:
    return SampleStats(n=n, sum_x=float(events), sum_x2=float(events))


def test_pooled_z_equals_statsmodels_ztest_chi_square_and_the_wald_interval() -> None:
    rng = np.random.default_rng(201)
    for _ in range(30):
        nc, nt = (int(v) for v in rng.integers(50, 5000, 2))
        ec, et = int(rng.binomial(nc, 0.1)), int(rng.binomial(nt, 0.12))
        r = proportion_lift(_stats(ec, nc), _stats(et, nt), 0.05, "pooled_z")
        assert r.absolute is not None and r.dof is None
        _, p_sm = proportions_ztest([et, ec], [nt, nc])
        chi2 = sps.chi2_contingency([[et, nt - et], [ec, nc - ec]], correction=False)
        lo, hi = confint_proportions_2indep(et, nt, ec, nc, method="wald", compare="diff")
        assert r.absolute.p_value == pytest.approx(p_sm, rel=1e-9, abs=1e-15)
        assert r.absolute.p_value == pytest.approx(chi2.pvalue, rel=1e-9, abs=1e-15)
        assert (r.absolute.lower, r.absolute.upper) == pytest.approx((lo, hi), rel=1e-9)
        assert_json_safe(r)


def test_welch_convention_equals_scipy_welch_on_the_zero_one_values() -> None:
    x = np.r_[np.ones(37), np.zeros(400 - 37)]
    y = np.r_[np.ones(58), np.zeros(410 - 58)]
    r = proportion_lift(_stats(37, 400), _stats(58, 410), 0.05, "welch")
    assert r.absolute is not None
    assert r.absolute.p_value == pytest.approx(sps.ttest_ind(y, x, equal_var=False).pvalue, rel=1e-9)


@pytest.mark.slow
def test_pooled_z_aa_false_positive_rate_and_power_at_stated_sizes() -> None:
    rng = np.random.default_rng(202)
    sims, n, p = 4000, 2000, 0.1
    ec, et = rng.binomial(n, p, sims), rng.binomial(n, p, sims)
    fp = sum(
        proportion_lift(_stats(a, n), _stats(b, n), 0.05, "pooled_z").absolute.p_value < 0.05  # type: ignore[union-attr]
        for a, b in zip(ec, et, strict=True)
    )
    # power for 10% → 12% at n = 2,000/arm: normal approximation 0.6 (Fleiss)
    z = sps.norm.ppf(0.975)
    se = np.sqrt(0.1 * 0.9 / n + 0.12 * 0.88 / n)
    nominal = sps.norm.cdf(0.02 / se - z)
    et2 = rng.binomial(n, 0.12, sims)
    hits = sum(
        proportion_lift(_stats(a, n), _stats(b, n), 0.05, "pooled_z").absolute.p_value < 0.05  # type: ignore[union-attr]
        for a, b in zip(ec, et2, strict=True)
    )
    print(
        f"pooled z: A/A FPR {fp / sims:.4f}; power 10%→12% at 2,000/arm {hits / sims:.3f} (nominal {nominal:.3f})"
    )
    assert abs(fp / sims - 0.05) <= 0.015
    assert abs(hits / sims - nominal) <= 0.03


def test_degenerate_proportions_get_reasons() -> None:
    assert proportion_lift(_stats(0, 100), _stats(0, 100), test="pooled_z").error is ErrorCode.ZERO_VARIANCE
    assert (
        proportion_lift(SampleStats(0, 0.0, 0.0), _stats(1, 10), test="pooled_z").error
        is ErrorCode.EMPTY_VARIANT
    )
    not01 = SampleStats(n=10, sum_x=30.0, sum_x2=90.0)
    assert proportion_lift(not01, _stats(1, 10), test="pooled_z").error is ErrorCode.INVALID_INPUT
    zero_control = proportion_lift(_stats(0, 100), _stats(5, 100), test="pooled_z")
    assert zero_control.absolute is not None and zero_control.relative_error is ErrorCode.ZERO_CONTROL_MEAN
    assert proportion_lift(_stats(1, 10), _stats(1, 10), alpha=1.5).error is ErrorCode.INVALID_INPUT
