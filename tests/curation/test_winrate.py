"""Win rate and length-controlled win rate: calibration (A/A), a length-biased judge, power."""

from __future__ import annotations

import math

import numpy as np
import pytest

from curation.winrate import MIN_ITEMS, by_category, wilson, win_rate

N = 200
SIMS = 600


def _lengths(rng: np.random.Generator, shift: float) -> tuple[np.ndarray, np.ndarray]:
    base = rng.lognormal(6.0, 0.4, N)
    return base * rng.lognormal(shift, 0.4, N), base


def _z(cand: np.ndarray, base: np.ndarray) -> np.ndarray:
    d = cand - base
    return np.asarray(d / d.std(ddof=1))


def test_a_judge_without_preference_rarely_makes_either_win_rate_significant() -> None:
    rng = np.random.default_rng(11)
    raw = lc = 0
    for _ in range(SIMS):
        cand, base = _lengths(rng, 0.0)
        y = rng.choice([0.0, 0.5, 1.0], N, p=[0.45, 0.10, 0.45])
        r = win_rate(y, cand, base)
        raw += r.p_value < 0.05
        lc += (r.lc_p_value if r.lc_p_value is not None else 1.0) < 0.05
    assert raw / SIMS <= 0.07
    assert lc / SIMS <= 0.075


def test_a_judge_that_prefers_length_makes_a_verbose_candidate_win_raw_but_not_length_controlled() -> None:
    rng = np.random.default_rng(12)
    raw_sig = lc_sig = 0
    raw_rates, lc_rates = [], []
    for _ in range(SIMS):
        cand, base = _lengths(rng, 0.3)  # the candidate writes ~35% more
        y = (rng.random(N) < 1 / (1 + np.exp(-1.5 * _z(cand, base)))).astype(float)
        r = win_rate(y, cand, base)
        assert r.lc_rate is not None
        raw_sig += r.p_value < 0.05
        lc_sig += (r.lc_p_value or 1.0) < 0.05
        raw_rates.append(r.rate)
        lc_rates.append(r.lc_rate)
    assert raw_sig / SIMS > 0.9
    assert np.mean(raw_rates) > 0.6
    assert abs(np.mean(lc_rates) - 0.5) < 0.02
    assert lc_sig / SIMS <= 0.075


def test_a_better_candidate_is_detected_length_controlled_at_200_items() -> None:
    rng = np.random.default_rng(13)
    hits = 0
    for _ in range(SIMS):
        cand, base = _lengths(rng, 0.0)
        y = (rng.random(N) < 1 / (1 + np.exp(-(0.5 + 0.5 * _z(cand, base))))).astype(float)  # LC ≈ 0.62
        hits += (win_rate(y, cand, base).lc_p_value or 1.0) < 0.05
    assert hits / SIMS >= 0.8


def test_too_few_items_or_unanimous_outcomes_give_no_length_controlled_rate() -> None:
    few = win_rate([1.0] * (MIN_ITEMS - 1), [10.0] * (MIN_ITEMS - 1), [5.0] * (MIN_ITEMS - 1))
    assert few.error == "too_few_items" and few.lc_rate is None
    unanimous = win_rate([1.0] * 50, list(range(50)), [10.0] * 50)
    assert unanimous.error == "length_fit_diverged" and unanimous.lc_rate is None
    assert unanimous.rate == 1.0 and unanimous.ci_high == 1.0 and unanimous.ci_low > 0.9
    assert win_rate([], [], []).error == "no_items"


def test_equal_lengths_fit_the_intercept_alone() -> None:
    y = [1.0] * 30 + [0.0] * 20 + [0.5] * 10
    r = win_rate(y, [100.0] * 60, [100.0] * 60)
    assert r.length_coef == 0.0
    assert r.lc_rate == pytest.approx(r.rate, abs=1e-9)


def test_bad_outcomes_are_refused() -> None:
    with pytest.raises(ValueError):
        win_rate([0.7], [1.0], [1.0])
    with pytest.raises(ValueError):
        win_rate([1.0], [math.nan], [1.0])


def test_wilson_interval_stays_in_the_unit_interval() -> None:
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_categories_get_holm_adjusted_p_values() -> None:
    rng = np.random.default_rng(5)
    groups = {}
    for name, p in (("code", 0.75), ("math", 0.5), ("chat", 0.5)):
        y = (rng.random(120) < p).astype(float)
        lens = rng.lognormal(5, 0.3, 120)
        groups[name] = (list(y), list(lens), list(rng.lognormal(5, 0.3, 120)))
    out = {c.category: c for c in by_category(groups)}
    assert set(out) == {"code", "math", "chat"}
    for c in out.values():
        assert c.p_holm is not None and c.p_holm >= c.result.p_value
    assert out["code"].p_holm is not None and out["code"].p_holm < 0.05
