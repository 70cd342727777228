"""Judge vs users: divergence of judge-predicted and observed user lift, correlation drop."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.risks.curve import Cells, score_bin
from analytics.risks.judge import JudgeDivergence, PairMoments, correlation_drop, judge_divergence
from analytics.stats import ErrorCode
from tests.analytics.risks.simulate import Arm, simulate


def run(rng: np.random.Generator, units: int, candidate: Arm, seed: int) -> JudgeDivergence:
    r = simulate(rng, units, Arm(), candidate)
    cells = Cells.from_responses(r.unit, r.arm, r.category, score_bin(r.score, -3.0, 3.0, 12), r.y)
    pairs = tuple(
        PairMoments.from_responses(r.unit[r.arm == a], r.score[r.arm == a], r.y[r.arm == a]) for a in (0, 1)
    )
    return judge_divergence(cells, (pairs[0], pairs[1]), replicates=100, seed=seed)


def rates(seed: int, runs: int, units: int, candidate: Arm) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    results = [run(rng, units, candidate, i) for i in range(runs)]
    return (
        sum(r.diverged for r in results) / runs,
        sum(bool(r.correlation and r.correlation.dropped) for r in results) / runs,
    )


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_aa_raises_neither_judge_alarm_in_more_than_alpha_of_runs() -> None:
    diverged, dropped = rates(41, 100, 800, Arm())
    assert diverged <= 0.05 and dropped <= 0.05


@pytest.mark.slow
def test_an_honest_better_candidate_raises_neither() -> None:
    """Better content: judge and users agree, so the judge's prediction holds."""
    diverged, dropped = rates(42, 60, 800, Arm(quality=0.3))
    assert diverged <= 0.05 and dropped <= 0.05


@pytest.mark.slow
def test_a_biased_judge_is_caught_with_stated_power() -> None:
    """The judge adds +0.6 to the candidate's scores, users see no change: 1,000 units/arm."""
    diverged, _ = rates(43, 30, 1000, Arm(judge_bias=0.6))
    assert diverged >= 0.8


def test_a_judge_that_stops_tracking_users_is_caught_by_the_correlation_drop() -> None:
    """On the candidate the judge's noise grows from 0.7 to 2.0: 1,000 units per arm."""
    _, dropped = rates(44, 30, 1000, Arm(judge_noise=2.0))
    assert dropped >= 0.8


def test_the_summary_says_what_judge_and_users_say() -> None:
    rng = np.random.default_rng(2)
    res = run(rng, 3000, Arm(judge_bias=0.8), 0)
    assert res.judge_says is not None and res.users_say is not None
    assert res.judge_says > 0.05 and abs(res.users_say) < 0.03
    assert res.summary is not None and res.summary.startswith("the judge says +")
    assert res.alarm


def test_constant_scores_cannot_be_correlated() -> None:
    unit = np.arange(20)
    m = PairMoments.from_responses(unit, np.ones(20), (unit % 2).astype(float))
    res = correlation_drop(m, m)
    assert res.error is ErrorCode.ZERO_VARIANCE and not res.dropped
