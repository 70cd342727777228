"""Keyword stuffing: smoothed log-odds with a unit-clustered variance, BH across phrases."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.risks.phrases import PhraseArm, stuffed_phrases
from analytics.stats import ErrorCode

VOCAB = [f"w{i}" for i in range(300)]


def arm(rng: np.random.Generator, units: int, base: np.ndarray, stuffed: dict[int, float]) -> PhraseArm:
    """Responses per unit 1 + Poisson(3); each unit has its own phrase propensity (Gamma,
    mean 1, sd 0.7), so a unit's responses share phrases: clustered counts."""
    m = 1 + rng.poisson(3.0, units)
    taste = rng.gamma(2.0, 0.5, (units, 1))
    p = np.minimum(base[None, :] * taste, 0.95)
    for i, rate in stuffed.items():
        p[:, i] = np.minimum(p[:, i] + rate, 0.99)
    x = rng.binomial(m[:, None], p)
    return PhraseArm.from_units(m, x)


def base_rates(rng: np.random.Generator) -> np.ndarray:
    return np.exp(rng.uniform(np.log(0.002), np.log(0.3), len(VOCAB)))


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_aa_flags_any_phrase_in_at_most_alpha_of_runs() -> None:
    rng = np.random.default_rng(51)
    base = base_rates(rng)
    runs = 200
    fired = sum(
        stuffed_phrases(VOCAB, arm(rng, 500, base, {}), arm(rng, 500, base, {})).alarm for _ in range(runs)
    )
    assert fired / runs <= 0.05


@pytest.mark.slow
def test_a_stuffed_phrase_is_found_with_stated_power_and_alone() -> None:
    """One phrase in 4% more candidate responses (base 2%): 1,000 units per arm."""
    rng = np.random.default_rng(52)
    base = base_rates(rng)
    base[7] = 0.02
    runs, found, others = 40, 0, 0
    for _ in range(runs):
        res = stuffed_phrases(VOCAB, arm(rng, 1000, base, {}), arm(rng, 1000, base, {7: 0.04}))
        flagged = [p.phrase for p in res.phrases if p.flagged]
        found += "w7" in flagged
        others += any(f != "w7" for f in flagged)
    assert found / runs >= 0.8
    assert others / runs <= 0.1


def test_rates_per_arm_are_listed_first_for_flagged_phrases() -> None:
    rng = np.random.default_rng(53)
    base = base_rates(rng)
    res = stuffed_phrases(VOCAB, arm(rng, 2000, base, {}), arm(rng, 2000, base, {3: 0.3}))
    top = res.phrases[0]
    assert top.phrase == "w3" and top.flagged
    assert top.rate_candidate - top.rate_control == pytest.approx(0.3, abs=0.05)
    assert res.tested <= len(VOCAB)


def test_a_phrase_never_seen_in_the_control_is_finite_and_tested() -> None:
    m = np.full(300, 2.0)
    x0 = np.zeros((300, 1))
    x1 = np.ones((300, 1))
    res = stuffed_phrases(["new"], PhraseArm.from_units(m, x0), PhraseArm.from_units(m, x1))
    assert res.tested == 1 and res.phrases[0].flagged
    assert np.isfinite(res.phrases[0].log_odds)


def test_rare_phrases_are_not_tested_and_empty_arms_are_errors() -> None:
    m = np.full(50, 2.0)
    x = np.zeros((50, 1))
    x[0, 0] = 1
    assert stuffed_phrases(["rare"], PhraseArm.from_units(m, x), PhraseArm.from_units(m, x)).tested == 0
    empty = PhraseArm.from_units(np.zeros(0), np.zeros((0, 1)))
    assert stuffed_phrases(["a"], empty, PhraseArm.from_units(m, x)).error is ErrorCode.TOO_FEW_UNITS
    assert stuffed_phrases(["a", "b"], PhraseArm.from_units(m, x), PhraseArm.from_units(m, x)).error is (
        ErrorCode.INVALID_INPUT
    )
