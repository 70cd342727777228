"""The report's comparisons name the convention behind each number, and the selectable ones
(CUPED θ, two-proportion test) change the numbers exactly as the statistics functions do."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.proportion import proportions_ztest

from analytics.report.catalogue import BUILTINS
from analytics.report.comparison import CompareOptions, compare_metric
from analytics.stats import SampleStats
from analytics.stats.cuped import cuped_estimates
from analytics.stats.proportion import proportion_lift

THUMBS = BUILTINS["thumbs_up_units"]  # a proportion: 0/1 per unit
TOKENS = BUILTINS["tokens_per_unit"]  # a mean


def _binary(events: int, n: int) -> SampleStats:
    return SampleStats(n, float(events), float(events))


def _with_covariate(rng: np.random.Generator, n: int, shift: float, slope: float) -> SampleStats:
    c = rng.normal(10.0, 3.0, n)
    x = slope * c + rng.normal(shift, 2.0, n)
    return SampleStats(
        n, float(x.sum()), float((x * x).sum()), sum_c=float(c.sum()), sum_c2=float((c * c).sum()),
        sum_xc=float((x * c).sum()),
    )  # fmt: skip


def test_the_default_proportion_row_says_welch_and_the_pooled_z_row_matches_statsmodels() -> None:
    stats = {"control": _binary(120, 1000), "candidate": _binary(150, 1000)}
    welch = compare_metric(THUMBS, stats, ["control", "candidate"], "control", CompareOptions())[1]
    assert welch.method is not None and (welch.method.test, welch.method.interval) == ("welch_t", "welch_t")
    assert (
        welch.method.sequential == "always_valid"
        and welch.method.planned_units == CompareOptions().planned_units
    )
    opts = CompareOptions(proportion_test="pooled_z")
    pooled = compare_metric(THUMBS, stats, ["control", "candidate"], "control", opts)[1]
    assert pooled.method is not None and (pooled.method.test, pooled.method.interval) == (
        "pooled_z",
        "wald_z",
    )
    _, p = proportions_ztest([150, 120], [1000, 1000])
    assert pooled.p_value == pytest.approx(p, rel=1e-9)
    direct = proportion_lift(stats["control"], stats["candidate"], 0.05, "pooled_z")
    assert direct.absolute is not None and pooled.ci_absolute is not None
    assert pooled.ci_absolute.lower == pytest.approx(direct.absolute.lower)
    assert pooled.p_value != pytest.approx(welch.p_value, rel=1e-6)  # the conventions differ


def test_the_cuped_convention_is_named_and_per_arm_thetas_are_reported() -> None:
    rng = np.random.default_rng(7)
    control, candidate = _with_covariate(rng, 800, 0.0, 1.0), _with_covariate(rng, 800, 0.3, 1.6)
    stats = {"control": control, "candidate": candidate}
    pooled = compare_metric(TOKENS, stats, ["control", "candidate"], "control", CompareOptions())[1]
    assert pooled.cuped is not None and pooled.cuped.convention == "pooled" and pooled.cuped.theta is not None
    assert pooled.method is not None and pooled.method.cuped == "pooled"
    per_arm = compare_metric(
        TOKENS, stats, ["control", "candidate"], "control", CompareOptions(cuped_theta="per_arm")
    )[1]
    assert per_arm.cuped is not None and per_arm.cuped.convention == "per_arm" and per_arm.cuped.theta is None
    expected = cuped_estimates([control, candidate], "mean", theta="per_arm")
    assert per_arm.cuped.thetas == pytest.approx(list(expected.thetas))
    assert per_arm.cuped.thetas[0] != pytest.approx(per_arm.cuped.thetas[1], rel=0.05)
    assert per_arm.method is not None and per_arm.method.cuped == "per_arm"
    diff = (expected.estimates[1].mean or 0.0) - (expected.estimates[0].mean or 0.0)
    assert per_arm.lift_absolute == pytest.approx(diff)
    assert per_arm.lift_absolute != pytest.approx(pooled.lift_absolute, rel=1e-6)


def test_a_pooled_z_proportion_is_never_cuped_adjusted() -> None:
    rng = np.random.default_rng(8)
    c = (rng.random(500) < 0.3).astype(float)
    t = (rng.random(500) < 0.35).astype(float)
    cov_c, cov_t = rng.normal(0, 1, 500) + c, rng.normal(0, 1, 500) + t

    def arm(x: np.ndarray, cov: np.ndarray) -> SampleStats:
        return SampleStats(len(x), float(x.sum()), float(x.sum()), sum_c=float(cov.sum()),
                           sum_c2=float((cov * cov).sum()), sum_xc=float((x * cov).sum()))  # fmt: skip

    stats = {"control": arm(c, cov_c), "candidate": arm(t, cov_t)}
    row = compare_metric(
        THUMBS, stats, ["control", "candidate"], "control", CompareOptions(proportion_test="pooled_z")
    )[1]
    assert row.cuped is None and row.method is not None and row.method.cuped == "none"
    _, p = proportions_ztest([t.sum(), c.sum()], [500, 500])
    assert row.p_value == pytest.approx(p, rel=1e-9)
