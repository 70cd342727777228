"""Category mix per arm: a Wald test on unit-clustered shares."""

from __future__ import annotations

import numpy as np

from analytics.risks.mix import MixStats, category_mix
from analytics.stats import ErrorCode
from tests.analytics.risks.simulate import CATEGORIES, MIX, Arm, simulate


def mix_stats(rng: np.random.Generator, units: int, candidate: Arm) -> tuple[MixStats, MixStats]:
    r = simulate(rng, units, Arm(), candidate)
    out = []
    for a in (0, 1):
        sel = r.arm == a
        _, inv = np.unique(r.unit[sel], return_inverse=True)
        counts = np.zeros((inv.max() + 1, len(CATEGORIES)))
        np.add.at(counts, (inv, r.category[sel]), 1.0)
        out.append(MixStats.from_counts(counts))
    return out[0], out[1]


def test_aa_p_values_are_calibrated_so_clustering_is_accounted_for() -> None:
    rng = np.random.default_rng(5)
    ps = []
    for _ in range(400):
        res = category_mix(CATEGORIES, *mix_stats(rng, 400, Arm()))
        assert res.p_value is not None
        ps.append(res.p_value)
    p = np.asarray(ps)
    assert 0.025 <= float(np.mean(p < 0.05)) <= 0.075
    assert float(np.mean(p < 0.001)) <= 0.01


def test_a_shifted_mix_is_flagged_with_stated_power() -> None:
    """code 35% → 41% of requests (from chat), 3,000 units per arm."""
    rng = np.random.default_rng(6)
    shifted = Arm(mix=(0.41, 0.2, 0.29, 0.1))
    flagged = sum(category_mix(CATEGORIES, *mix_stats(rng, 3000, shifted)).flagged for _ in range(30))
    assert flagged / 30 >= 0.8


def test_shares_per_arm_are_reported() -> None:
    rng = np.random.default_rng(1)
    res = category_mix(CATEGORIES, *mix_stats(rng, 2000, Arm()))
    assert [s.category for s in res.shares] == list(CATEGORIES)
    for s, expected in zip(res.shares, MIX, strict=True):
        assert s.control is not None and abs(s.control - expected) < 0.03


def test_a_category_in_one_arm_only_is_a_mismatch() -> None:
    c = MixStats.from_counts(np.array([[2, 0], [1, 0], [3, 0]]))
    t = MixStats.from_counts(np.array([[1, 1], [2, 1], [1, 2]]))
    assert category_mix(["a", "b"], c, t).flagged


def test_no_units_or_wrong_shapes_are_errors_not_passes() -> None:
    empty = MixStats(0, (0.0, 0.0), ((0.0, 0.0), (0.0, 0.0)))
    some = MixStats.from_counts(np.array([[1, 1], [2, 0]]))
    res = category_mix(["a", "b"], empty, some)
    assert res.error is ErrorCode.TOO_FEW_UNITS and not res.flagged
    assert category_mix(["a"], some, some).error is ErrorCode.INVALID_INPUT


def test_a_single_category_everywhere_is_no_mismatch() -> None:
    one = MixStats.from_counts(np.array([[1], [3], [2]]))
    res = category_mix(["other"], one, one)
    assert not res.flagged and res.p_value == 1.0
