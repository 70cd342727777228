"""Paired statistics against statsmodels and scipy, and their coverage by simulation."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from evals.stats import (
    PairedCounts,
    compare_binary,
    holm,
    mcnemar_exact,
    newcombe_paired,
    paired_bootstrap,
    paired_t,
    pass_at_k,
    wilson,
)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (1, 0), (3, 9), (10, 10), (25, 40), (0, 17), (60, 2)])
def test_exact_mcnemar_matches_statsmodels(b: int, c: int) -> None:
    counts = PairedCounts(both=30, only_baseline=b, only_candidate=c, neither=12)
    table = [[30, b], [c, 12]]
    assert mcnemar_exact(counts) == pytest.approx(mcnemar(table, exact=True).pvalue, abs=1e-12)


def test_one_sided_mcnemar_is_the_binomial_tail_of_scipy() -> None:
    counts = PairedCounts(both=5, only_baseline=14, only_candidate=4, neither=7)
    worse = sps.binomtest(4, 18, 0.5, alternative="less").pvalue
    better = sps.binomtest(4, 18, 0.5, alternative="greater").pvalue
    assert mcnemar_exact(counts, "less") == pytest.approx(worse)
    assert mcnemar_exact(counts, "greater") == pytest.approx(better)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (37, 60), (1, 1)])
def test_wilson_matches_statsmodels(k: int, n: int) -> None:
    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    assert wilson(k, n) == pytest.approx((lo, hi), abs=1e-12)


def test_paired_t_matches_scipy_ttest_rel() -> None:
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, 40)
    cand = base + rng.normal(0.05, 0.2, 40)
    ours = paired_t(list(base), list(cand))
    ref = sps.ttest_rel(cand, base)
    ci = ref.confidence_interval(0.95)
    assert ours.p_value == pytest.approx(ref.pvalue)
    assert (ours.lower, ours.upper) == pytest.approx((ci.low, ci.high))
    assert ours.p_better == pytest.approx(sps.ttest_rel(cand, base, alternative="greater").pvalue)
    assert ours.p_worse == pytest.approx(sps.ttest_rel(cand, base, alternative="less").pvalue)


def test_paired_bootstrap_agrees_with_scipy_bootstrap() -> None:
    rng = np.random.default_rng(5)
    base = rng.uniform(0, 1, 80)
    cand = np.clip(base + rng.normal(0.03, 0.15, 80), 0, 1)
    ours = paired_bootstrap(list(base), list(cand), resamples=4000, seed=1)
    ref = sps.bootstrap((cand - base,), np.mean, n_resamples=4000, method="percentile", random_state=1)
    assert ours[0] == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert ours[1] == pytest.approx(ref.confidence_interval.high, abs=0.01)


def test_newcombe_interval_contains_the_estimate_and_stays_in_range() -> None:
    for b, c, both, neither in itertools.product((0, 1, 5, 30), (0, 2, 30), (0, 10), (0, 10)):
        counts = PairedCounts(both, b, c, neither)
        if counts.n == 0:
            continue
        lo, hi = newcombe_paired(counts)
        assert -1 <= lo <= counts.difference <= hi <= 1


def test_newcombe_interval_covers_the_true_difference_at_least_94_percent() -> None:
    """Coverage by simulation: correlated paired outcomes (items of varying difficulty)."""
    rng = random.Random(11)
    for n, shift in ((60, 0.0), (60, -0.15), (200, 0.05)):
        covered, trials = 0, 1500
        difficulties = [rng.random() for _ in range(n)]
        truth = sum(min(1.0, max(0.0, d + shift)) - d for d in difficulties) / n
        for _ in range(trials):
            base = [rng.random() < d for d in difficulties]
            cand = [rng.random() < min(1.0, max(0.0, d + shift)) for d in difficulties]
            lo, hi = newcombe_paired(PairedCounts.of(base, cand))
            covered += lo <= truth <= hi
        assert covered / trials >= 0.94, (n, shift, covered / trials)


def test_pass_at_k_equals_the_combinatorial_definition() -> None:
    for n, c, k in itertools.product(range(1, 9), range(0, 9), range(1, 9)):
        if c > n or k > n:
            continue
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_holm_matches_statsmodels_and_passes_missing_values_through() -> None:
    p = [0.01, 0.04, 0.03, 0.2, 0.005]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
    assert holm([0.01, None, 0.03]) == [pytest.approx(0.02), None, pytest.approx(0.03)]


def test_degenerate_inputs_return_errors_not_exceptions() -> None:
    assert compare_binary(PairedCounts()).error == "no paired items"
    assert paired_t([1.0], [0.0]).error is not None
    assert paired_t([1.0, math.nan], [0.0, 1.0]).error == "non-finite score"
    same = paired_t([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    assert same.difference == 0 and same.p_worse == 1.0
