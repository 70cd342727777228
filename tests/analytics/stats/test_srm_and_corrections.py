"""SRM chi-square check and Holm / Benjamini–Hochberg corrections."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

from analytics.stats import ErrorCode, benjamini_hochberg, holm, srm_check
from tests.analytics.stats.simulate import assert_json_safe


def test_a_52_48_split_is_flagged_at_large_n_but_not_at_small_n() -> None:
    big = srm_check([5200, 4800], [50, 50])
    small = srm_check([52, 48], [50, 50])
    assert big.flagged and big.p_value is not None and big.p_value < 0.001
    assert not small.flagged and small.p_value is not None and small.p_value > 0.5
    assert big.p_value == pytest.approx(sps.chisquare([5200, 4800]).pvalue)
    assert_json_safe(big)


def test_srm_with_unequal_weights_and_three_variants_matches_scipy() -> None:
    counts, weights = [8100, 1000, 950], [0.8, 0.1, 0.1]
    r = srm_check(counts, weights)
    total = sum(counts)
    ref = sps.chisquare(counts, [total * w for w in weights])
    assert r.chi2 == pytest.approx(ref.statistic) and r.p_value == pytest.approx(ref.pvalue)
    assert r.dof == 2 and not r.flagged


def test_srm_false_alarm_rate_is_tiny_for_a_correct_split() -> None:
    rng = np.random.default_rng(41)
    flags = sum(srm_check(list(rng.multinomial(20000, [0.5, 0.5])), [1, 1]).flagged for _ in range(2000))
    assert flags <= 10  # expected 2 at p < 0.001


def test_units_in_a_zero_weight_variant_are_a_mismatch_and_empty_input_is_no_data() -> None:
    assert srm_check([100, 3], [1.0, 0.0]).flagged
    assert srm_check([0, 0], [1, 1]).error is ErrorCode.NO_DATA
    assert srm_check([1, 2], [1]).error is ErrorCode.INVALID_INPUT
    assert_json_safe(srm_check([0, 0], [1, 1]))


@pytest.mark.slow
def test_holm_and_bh_match_statsmodels() -> None:
    rng = np.random.default_rng(42)
    for _ in range(8):  # statsmodels' holm costs ~0.2 s a call
        p = np.concatenate([rng.uniform(0, 1, 8), rng.uniform(0, 0.01, 4)])
        rng.shuffle(p)
        assert holm(list(p)) == pytest.approx(list(multipletests(p, method="holm")[1]))
        assert benjamini_hochberg(list(p)) == pytest.approx(list(multipletests(p, method="fdr_bh")[1]))


def test_corrections_pass_missing_p_values_through() -> None:
    p = [0.01, None, 0.04, 0.03]
    present = [0.01, 0.04, 0.03]
    h, b = holm(p), benjamini_hochberg(p)
    assert h[1] is None and b[1] is None
    assert [h[0], h[2], h[3]] == pytest.approx(list(multipletests(present, method="holm")[1]))
    assert [b[0], b[2], b[3]] == pytest.approx(list(multipletests(present, method="fdr_bh")[1]))
    assert holm([]) == [] and benjamini_hochberg([None]) == [None]


def test_benjamini_hochberg_reproduces_the_papers_example() -> None:
    """Benjamini & Hochberg (1995), section 4: 15 p-values, q = 0.05 rejects the first four."""
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240]
    p += [0.4262, 0.5719, 0.6528, 0.7590, 1.000]
    adjusted = benjamini_hochberg(p)
    assert [a is not None and a <= 0.05 for a in adjusted] == [True] * 4 + [False] * 11
    # Holm (like Bonferroni here) rejects only the first three
    assert sum(a is not None and a <= 0.05 for a in holm(p)) == 3
