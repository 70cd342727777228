"""The parity methods never raise and never return NaN/inf, whatever the input."""

from __future__ import annotations

import itertools
import math

import numpy as np

from analytics.stats import (
    Effect,
    SampleStats,
    VariantEstimate,
    adjusted_intervals,
    beta_binomial,
    cuped_estimates,
    group_sequential_lift,
    group_sequential_noninferiority,
    mann_whitney,
    mann_whitney_guardrail,
    power_of,
    proportion_lift,
    quantile_chance_to_beat,
    ratio_cuped_estimates,
    sequential_srm,
)
from analytics.stats.ratio_cuped import RatioSampleStats
from tests.analytics.stats.simulate import assert_json_safe

BAD = (math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0, -1.0, 1e-308)


def test_rank_and_bayes_methods_survive_awkward_values() -> None:
    samples = [
        [],
        [1.0],
        [5.0, 5.0],
        [1e-300, 1e300],
        [math.nan, 1.0],
        [0.0, -3.0, 2.0],
        list(np.arange(50.0) + 1),
    ]
    for a, b in itertools.product(samples, repeat=2):
        assert_json_safe(mann_whitney(a, b))
        assert_json_safe(mann_whitney(a, b, log_scale=True))
        assert_json_safe(mann_whitney_guardrail(a, b, 0.1))
    for ec, nc, et, nt in itertools.product((0.0, 1.0, math.nan, 1e12), (0.0, 1.0, 1e12, math.inf), repeat=2):
        assert_json_safe(beta_binomial(ec, nc, et, nt))
    for hc, ht in (({}, {}), ({-5: 3}, {-5: 3}), ({0: 2, 400: 2}, {1: 1, 2: 1})):
        assert_json_safe(quantile_chance_to_beat(hc, ht, 0.99))


def test_sequential_and_correction_methods_survive_awkward_values() -> None:
    ests = [VariantEstimate(0, None, None), VariantEstimate(10, 0.0, 0.0), VariantEstimate(10, 1e308, 1e308)]
    ests += [VariantEstimate(10, v, 1.0) for v in BAD] + [VariantEstimate(10, 1.0, v) for v in BAD]
    for c, t in itertools.product(ests, repeat=2):
        assert_json_safe(group_sequential_lift(c, t, [0.5, 1.0]))
        assert_json_safe(group_sequential_noninferiority(c, t, 0.1, "decrease", [0.5]))
    for fractions in ([math.nan], [0.0], [-1.0], [0.5, 0.5], [math.inf]):
        assert_json_safe(group_sequential_lift(ests[3], ests[4], fractions))
    for counts, weights in (([1e308, 1], [1, 1]), ([math.nan, 1], [1, 1]), ([10, 10], [1e-320, 1])):
        assert_json_safe(sequential_srm(counts, weights))  # type: ignore[arg-type]
    for iv in adjusted_intervals([Effect(v, s) for v, s in itertools.product(BAD, BAD)]):
        assert_json_safe(iv)


def test_convention_options_survive_awkward_sums() -> None:
    stats = [
        SampleStats(0, 0.0, 0.0),
        SampleStats(2, 1.0, 1.0, sum_c=1e300, sum_c2=1e300),
        SampleStats(3, 3.0, 3.0),
    ]
    for a, b in itertools.product(stats, repeat=2):
        for theta in ("pooled", "pooled_sums", "per_arm"):
            assert_json_safe(cuped_estimates([a, b], "mean", theta))
        assert_json_safe(proportion_lift(a, b, test="pooled_z"))
    rs = [
        RatioSampleStats(*([0] * 15)),
        RatioSampleStats(3, *([1e300] * 14)),
        RatioSampleStats(2, *([1.0] * 14)),
    ]
    for a, b in itertools.product(rs, repeat=2):
        for theta in ("pooled", "pooled_sums", "per_arm"):
            assert_json_safe(ratio_cuped_estimates([a, b], theta))
    for v in BAD:
        assert_json_safe(power_of(0.3, v, 100, 100, "proportion", test="relative"))
        assert_json_safe(power_of(v, 0.1, 100, 100, "mean", unit_variance=1.0, test="relative"))
