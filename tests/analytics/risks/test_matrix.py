"""Capability matrix: per-category harm tests, Holm for decisions, shrinkage for display."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.risks.matrix import Guardrail, MatrixInput, capability_matrix, shrink
from analytics.stats import Direction, ErrorCode, MetricKind, SampleStats
from tests.analytics.risks.simulate import CATEGORIES, Arm, Responses, simulate


def inputs(r: Responses) -> list[MatrixInput]:
    """Per category, per arm: units with requests of it, x = successes, y = requests."""
    out = []
    for k, name in enumerate(CATEGORIES):
        stats = []
        for a in (0, 1):
            sel = (r.category == k) & (r.arm == a)
            units, inv = np.unique(r.unit[sel], return_inverse=True)
            x = np.bincount(inv, weights=r.y[sel])
            y = np.bincount(inv).astype(float)
            stats.append(
                SampleStats(
                    len(units), float(x.sum()), float(x @ x), float(y.sum()), float(y @ y), float(x @ y)
                )
            )
        out.append(MatrixInput(name, "success", Direction.INCREASE, MetricKind.RATIO, stats[0], stats[1]))
    return out


def test_an_aa_test_flags_some_category_in_at_most_alpha_of_runs() -> None:
    rng = np.random.default_rng(7)
    runs, fired, breached = 300, 0, 0
    for _ in range(runs):
        m = capability_matrix(inputs(simulate(rng, 600, Arm(), Arm())), [Guardrail("success", 0.0)])
        fired += bool(m.harmed_categories)
        breached += bool(m.breached)
    assert fired / runs <= 0.05
    assert breached / runs <= 0.05


def test_forgetting_is_caught_in_the_right_category_with_stated_power() -> None:
    """Candidate better at math (+0.3 logit), worse at code (−0.3, about −7 points of success):
    3,000 units per arm (about 1,900 of them send code requests)."""
    rng = np.random.default_rng(11)
    runs, caught, wrong = 30, 0, 0
    forgetting = Arm(by_category={0: -0.3, 1: +0.3})
    for _ in range(runs):
        m = capability_matrix(inputs(simulate(rng, 3000, Arm(), forgetting)))
        caught += ("success", "code") in m.harmed_categories
        wrong += any(c != "code" for _, c in m.harmed_categories)
    assert caught / runs >= 0.8
    assert wrong == 0


def test_a_guardrail_names_the_category_beyond_its_margin() -> None:
    rng = np.random.default_rng(3)
    r = simulate(rng, 3000, Arm(), Arm(by_category={0: -0.6}))
    m = capability_matrix(inputs(r), [Guardrail("success", 0.05, relative=True)])
    assert m.breached == (("success", "code"),)
    code = next(g for g in m.guardrails if g.category == "code")
    assert code.harm is not None and code.harm > 0.05
    assert m.alarm


def test_a_category_without_units_is_reported_with_its_error_and_never_passes() -> None:
    empty = SampleStats(0, 0.0, 0.0)
    full = SampleStats.from_values([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])
    cell = MatrixInput("code", "success", Direction.INCREASE, MetricKind.RATIO, full, empty)
    m = capability_matrix([cell], [Guardrail("success", 0.1)])
    assert m.cells[0].error is ErrorCode.EMPTY_VARIANT
    assert m.cells[0].p_value_harm is None and not m.cells[0].harmed
    assert m.guardrails[0].error is ErrorCode.EMPTY_VARIANT and not m.guardrails[0].breached


def test_shrinkage_pulls_noisy_lifts_towards_the_weighted_mean_and_keeps_precise_ones() -> None:
    lifts = [0.10, -0.20, 0.02, 0.01]
    ses = [0.15, 0.15, 0.005, 0.005]
    out = shrink(lifts, ses)
    assert all(o is not None for o in out)
    s = [o[0] for o in out if o is not None]
    assert abs(s[0]) < abs(lifts[0]) and abs(s[1]) < abs(lifts[1])
    assert s[2] == pytest.approx(0.02, abs=0.005) and s[3] == pytest.approx(0.01, abs=0.005)


def test_shrinkage_with_no_spread_between_categories_gives_the_pooled_mean() -> None:
    out = shrink([0.01, 0.012, 0.011], [0.05, 0.05, 0.05])
    values = [o[0] for o in out if o is not None]
    assert max(values) - min(values) < 1e-12


def test_shrinkage_skips_missing_and_non_finite_cells() -> None:
    assert shrink([None, float("nan"), 0.1], [0.1, 0.1, 0.0]) == [None, None, None]
