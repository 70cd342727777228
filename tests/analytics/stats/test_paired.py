"""Paired shadow comparisons: paired t, McNemar, agreement rate."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.proportion import proportion_confint

from analytics.stats import ErrorCode, SampleStats, agreement, mcnemar, paired_test
from tests.analytics.stats.simulate import assert_json_safe


def test_paired_difference_matches_scipy_ttest_rel() -> None:
    rng = np.random.default_rng(71)
    prompt_difficulty = rng.lognormal(6, 0.7, 800)  # shared by both models: strong pairing
    baseline = prompt_difficulty * rng.lognormal(0, 0.2, 800)
    candidate = prompt_difficulty * 1.03 * rng.lognormal(0, 0.2, 800)
    r = paired_test(SampleStats.from_values(candidate, baseline), alpha=0.1)
    ref = sps.ttest_rel(candidate, baseline)
    assert r.difference is not None and r.relative is not None
    assert r.difference.estimate == pytest.approx((candidate - baseline).mean())
    assert r.difference.p_value == pytest.approx(ref.pvalue, rel=1e-8)
    ci = ref.confidence_interval(0.9)
    assert (r.difference.lower, r.difference.upper) == pytest.approx((ci.low, ci.high), rel=1e-8)
    # the relative SE agrees with a bootstrap over pairs
    idx = rng.integers(0, 800, (2000, 800))
    boot = candidate[idx].mean(1) / baseline[idx].mean(1) - 1
    assert r.relative.std_error == pytest.approx(boot.std(ddof=1), rel=0.1)
    # pairing makes the test far more sensitive than an unpaired one
    assert r.difference.p_value < sps.ttest_ind(candidate, baseline, equal_var=False).pvalue
    assert_json_safe(r)


@pytest.mark.parametrize(("b", "c"), [(3, 9), (0, 5), (40, 62), (120, 95)])
def test_mcnemar_matches_statsmodels(b: int, c: int) -> None:
    r = mcnemar(b, c)
    table = [[500, b], [c, 400]]
    ref = sm_mcnemar(table, exact=r.exact, correction=True)
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert_json_safe(r)


def test_agreement_rate_uses_the_wilson_interval() -> None:
    r = agreement(412, 500)
    lo, hi = proportion_confint(412, 500, alpha=0.05, method="wilson")
    assert r.rate == pytest.approx(412 / 500)
    assert (r.lower, r.upper) == pytest.approx((lo, hi), rel=1e-9)
    edge = agreement(500, 500)
    assert edge.upper == 1.0 and edge.lower is not None and edge.lower < 1.0


def test_degenerate_pairs_return_error_codes() -> None:
    assert paired_test(SampleStats(0, 0.0, 0.0)).error is ErrorCode.NO_DATA
    assert paired_test(SampleStats.from_values([1.0], [2.0])).error is ErrorCode.TOO_FEW_UNITS
    same = paired_test(SampleStats.from_values([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]))
    assert same.error is ErrorCode.ZERO_VARIANCE
    zero_base = paired_test(SampleStats.from_values([1.0, 2.0, 4.0], [0.0, 0.0, 0.0]))
    assert zero_base.difference is not None and zero_base.relative_error is ErrorCode.ZERO_CONTROL_MEAN
    assert mcnemar(0, 0).p_value == 1.0 and mcnemar(-1, 2).error is ErrorCode.INVALID_INPUT
    assert agreement(0, 0).error is ErrorCode.NO_DATA and agreement(5, 3).error is ErrorCode.INVALID_INPUT
    for r in (same, zero_base, mcnemar(0, 0), agreement(0, 0)):
        assert_json_safe(r)


def test_mcnemar_reproduces_agrestis_presidential_approval_example() -> None:
    """Agresti, Categorical Data Analysis, 10.1: 1,600 people, 150 approve→disapprove, 86 the
    reverse; McNemar z² = 17.36 without continuity correction (here with it: 63²/236)."""
    r = mcnemar(150, 86)
    assert not r.exact and r.statistic == pytest.approx(63**2 / 236)
    assert r.p_value is not None and r.p_value < 1e-4
    assert r.p_value == pytest.approx(sps.chi2.sf(63**2 / 236, 1))
