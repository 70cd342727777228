"""Verbosity: the length guardrail and the length-explained / residual split."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.risks.curve import Cells, length_bin, residual_decomposition
from analytics.risks.verbosity import VerbosityResult, length_shift, verbosity
from analytics.stats import ErrorCode, SampleStats
from tests.analytics.risks.simulate import Arm, Responses, simulate


def length_stats(r: Responses, arm: int) -> SampleStats:
    sel = r.arm == arm
    _, inv = np.unique(r.unit[sel], return_inverse=True)
    x = np.bincount(inv, weights=r.tokens[sel])
    y = np.bincount(inv).astype(float)
    return SampleStats(len(x), float(x.sum()), float(x @ x), float(y.sum()), float(y @ y), float(x @ y))


def run(rng: np.random.Generator, units: int, candidate: Arm, seed: int = 0) -> VerbosityResult:
    r = simulate(rng, units, Arm(), candidate)
    cells = Cells.from_responses(r.unit, r.arm, r.category, length_bin(r.tokens), r.y)
    return verbosity(length_stats(r, 0), length_stats(r, 1), cells, replicates=100, seed=seed)


def alarm_rate(seed: int, runs: int, units: int, candidate: Arm) -> float:
    rng = np.random.default_rng(seed)
    return sum(run(rng, units, candidate, i).alarm for i in range(runs)) / runs


@pytest.mark.slow
def test_aa_raises_the_verbosity_alarm_in_at_most_alpha_of_runs() -> None:
    assert alarm_rate(21, 100, 800, Arm()) <= 0.05


@pytest.mark.slow
def test_an_honest_longer_and_better_candidate_does_not_raise_it() -> None:
    """30% longer and +0.4 logit better beyond length: the gain is real."""
    assert alarm_rate(22, 60, 1500, Arm(length_factor=1.3, quality=0.4)) <= 0.05


def test_a_padded_candidate_is_caught_with_stated_power() -> None:
    """60% longer (worth +0.27 logit on the control's curve), content 0.4 logit worse
    (padding): the residual is about −6 points of satisfaction. 2,000 units per arm."""
    assert alarm_rate(23, 30, 2000, Arm(length_factor=1.6, quality=-0.4)) >= 0.8


def test_the_split_adds_up_and_credits_length_with_the_length_effect() -> None:
    rng = np.random.default_rng(4)
    res = run(rng, 6000, Arm(length_factor=2.0))
    d = res.decomposition
    assert d.total is not None and d.residual is not None and d.explained is not None
    assert d.explained + d.residual.estimate == pytest.approx(d.total.estimate)
    assert res.length.longer and res.length.relative == pytest.approx(1.0, abs=0.05)
    # on the control, doubling the length adds 0.4 logit: the explained part is clearly
    # positive, the residual is near 0
    assert d.explained > 0.04
    assert abs(d.residual.estimate) < 0.02


def test_the_residual_interval_covers_the_truth_in_most_runs() -> None:
    """Honest longer candidate, residual 0 by construction: the always-valid 95% interval
    covers 0 in at least 95% of runs (it is conservative at one look)."""
    rng = np.random.default_rng(31)
    cover = 0
    for i in range(60):
        r = simulate(rng, 700, Arm(), Arm(length_factor=1.4))
        cells = Cells.from_responses(r.unit, r.arm, r.category, length_bin(r.tokens), r.y)
        d = residual_decomposition(cells, replicates=100, seed=i)
        assert d.residual is not None
        cover += d.residual.lower <= 0.0 <= d.residual.upper
    assert cover / 60 >= 0.95


def test_lengths_beyond_the_controls_range_borrow_the_nearest_bin() -> None:
    unit = np.arange(100)
    arm = (unit >= 50).astype(int)
    tokens = np.where(arm == 0, 100.0, 5000.0)
    y = np.where(unit % 2 == 0, 1.0, 0.0)
    cells = Cells.from_responses(unit, arm, np.zeros(100, dtype=int), length_bin(tokens), y)
    d = residual_decomposition(cells, replicates=50)
    assert d.borrowed_share == 1.0
    assert d.predicted_candidate == pytest.approx(d.control_mean)


def test_an_empty_arm_is_an_error_and_no_alarm() -> None:
    cells = Cells.from_responses(
        np.arange(10), np.zeros(10, dtype=int), np.zeros(10, dtype=int), np.zeros(10, dtype=int), np.ones(10)
    )
    d = residual_decomposition(cells)
    assert d.error is ErrorCode.EMPTY_VARIANT and d.residual is None
    empty = SampleStats(0, 0.0, 0.0)
    res = verbosity(empty, empty, cells)
    assert not res.alarm and res.length.error is ErrorCode.EMPTY_VARIANT


def test_too_few_control_responses_to_fit_a_curve_is_an_error() -> None:
    unit = np.arange(10)
    arm = (unit >= 5).astype(int)
    cells = Cells.from_responses(unit, arm, np.zeros(10, dtype=int), np.zeros(10, dtype=int), np.ones(10))
    assert residual_decomposition(cells).error is ErrorCode.TOO_FEW_UNITS


def test_constant_lengths_give_no_length_evidence() -> None:
    s = SampleStats.from_values([100.0, 200.0, 300.0], [1.0, 2.0, 3.0])
    res = length_shift(s, s)
    assert res.error is ErrorCode.ZERO_VARIANCE and not res.longer
