"""Nothing raises, nothing returns NaN/inf: every function over awkward inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from analytics.stats import (
    Direction,
    MetricKind,
    SampleStats,
    chance_to_beat,
    cuped_estimates,
    estimate,
    minimum_detectable_effect,
    noninferiority,
    paired_test,
    power_of,
    quantile_diff,
    required_sample_size,
    sequential_lift,
    sequential_noninferiority,
    srm_check,
    welch_lift,
)
from tests.analytics.stats.simulate import assert_json_safe


def _awkward_samples(rng: np.random.Generator) -> list[SampleStats]:
    samples = [SampleStats(0, 0.0, 0.0)]
    for n in (1, 2, 3, 5):
        for scale in (0.0, 1.0, 1e-300, 1e150):
            x = rng.choice([0.0, 1.0, -1.0], n) * scale
            y = rng.choice([0.0, 1.0, 2.0], n)
            c = rng.choice([0.0, 3.0], n)
            samples.append(SampleStats.from_values(list(x), list(y), list(c)))
    samples.append(SampleStats.from_values([5.0] * 4, [1.0] * 4, [2.0] * 4))
    return samples


@pytest.mark.slow
def test_every_comparison_survives_awkward_inputs_without_exception_or_nan() -> None:
    rng = np.random.default_rng(81)
    samples = _awkward_samples(rng)
    for kind in MetricKind:
        for a, b in itertools.product(samples, repeat=2):
            ests = cuped_estimates([a, b], kind)
            assert_json_safe(ests)
            for c, t in ((estimate(a, kind), estimate(b, kind)), ests.estimates):
                assert_json_safe(welch_lift(c, t))
                assert_json_safe(sequential_lift(c, t, planned_units=100))
                assert_json_safe(chance_to_beat(c, t))
                for direction, relative in itertools.product(Direction, (True, False)):
                    assert_json_safe(noninferiority(c, t, 0.05, direction, relative=relative))
                    assert_json_safe(sequential_noninferiority(c, t, 0.05, direction, relative=relative))
            assert_json_safe(paired_test(a))


def test_other_functions_survive_awkward_inputs() -> None:
    for counts, weights in (([0, 0], [0, 0]), ([5], [1]), ([1, 2, 3], [0, 0, 1]), ([10**12, 1], [1, 1])):
        assert_json_safe(srm_check(counts, weights))
    for mean, var in ((0.0, 1.0), (0.5, 0.0), (1e-300, 1e300), (-3.0, 2.0)):
        for kind in MetricKind:
            assert_json_safe(required_sample_size(mean, 0.05, kind, unit_variance=var))
            assert_json_safe(required_sample_size(mean, 1e-200, kind, unit_variance=var))
            assert_json_safe(minimum_detectable_effect(mean, 10, 10, kind, unit_variance=var))
            assert_json_safe(power_of(mean, 0.1, 10, 10, kind, unit_variance=var))
    for h1, h2 in (({}, {}), ({-5: 3}, {-5: 3}), ({0: 2, 400: 2}, {1: 1, 2: 1})):
        assert_json_safe(quantile_diff(h1, h2, 0.99))
