"""Sequential SRM (Dirichlet–multinomial Bayes factor) and multiplicity-adjusted intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import holm, srm_check
from analytics.stats.correction import Effect, adjusted_intervals
from analytics.stats.srm import sequential_srm
from tests.analytics.stats.simulate import assert_json_safe


def test_bayes_factor_equals_scipys_dirichlet_multinomial_over_multinomial() -> None:
    rng = np.random.default_rng(501)
    for _ in range(20):
        w = rng.uniform(0.1, 1.0, 3)
        counts = rng.multinomial(int(rng.integers(10, 3000)), w / w.sum())
        r = sequential_srm(list(counts), list(w), concentration=500.0)
        p0 = w / w.sum()
        ref = sps.dirichlet_multinomial.logpmf(counts, 500.0 * p0, counts.sum()) - sps.multinomial.logpmf(
            counts, counts.sum(), p0
        )
        assert r.log_bayes_factor == pytest.approx(ref, rel=1e-9, abs=1e-9)
        assert r.p_value == pytest.approx(min(1.0, math.exp(-ref)))
        assert_json_safe(r)


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_continuous_monitoring_keeps_false_alarms_below_alpha_while_a_repeated_chi_square_does_not() -> None:
    rng = np.random.default_rng(502)
    sims, looks, step, alpha = 1500, 100, 200, 0.05
    seq = naive = 0
    for _ in range(sims):
        counts = rng.multinomial(step, [0.5, 0.5], looks).cumsum(0).tolist()
        seq += any(sequential_srm(c, [1, 1], alpha).flagged for c in counts)
        naive += any(srm_check(c, [1, 1], alpha).flagged for c in counts[9::10])
    print(
        f"sequential SRM: A/A false alarms {seq / sims:.4f} over 100 looks (chi2 at 10 looks: {naive / sims:.4f})"
    )
    assert seq / sims <= alpha + 0.015  # anytime-valid: at most alpha, whatever the number of looks
    assert naive / sims > 2 * alpha


def test_sequential_srm_catches_a_one_point_mismatch_by_the_stated_sample_size() -> None:
    rng = np.random.default_rng(503)
    sims, step, looks = 500, 2500, 40  # up to 100,000 units, 49/51 instead of 50/50
    found, when = 0, []
    for _ in range(sims):
        counts = rng.multinomial(step, [0.49, 0.51], looks).cumsum(0).tolist()
        hit = next((k for k, c in enumerate(counts) if sequential_srm(c, [1, 1]).flagged), None)
        if hit is not None:
            found += 1
            when.append((hit + 1) * step)
    print(
        f"sequential SRM at p <= 0.001: 49/51 split caught in {found / sims:.3f} of runs by 100,000 units "
        f"(median {np.median(when):.0f} units)"
    )
    assert found / sims >= 0.9


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_bonferroni_and_holm_intervals_match_their_p_values_and_cover() -> None:
    rng = np.random.default_rng(504)
    effects = [Effect(float(e), 1.0) for e in (0.2, 3.5, 2.6, -2.9, 1.0)]
    holm_p = holm([e.p_value for e in effects])
    for method in ("bonferroni", "holm"):
        out = adjusted_intervals(effects, 0.05, method)
        for iv, hp in zip(out, holm_p, strict=True):
            assert iv.lower is not None and iv.upper is not None and iv.p_adjusted is not None
            excludes = iv.lower > 0 or iv.upper < 0
            assert excludes == (iv.p_adjusted < 0.05)
            if method == "holm":
                assert iv.p_adjusted == pytest.approx(hp)
            else:
                assert iv.level == pytest.approx(1 - 0.05 / 5)
            assert_json_safe(iv)
    bonf = adjusted_intervals(effects, 0.05, "bonferroni")
    hol = adjusted_intervals(effects, 0.05, "holm")
    for b, h in zip(bonf, hol, strict=True):
        assert (h.upper - h.lower) <= (b.upper - b.lower) + 1e-12  # type: ignore[operator]
    # simultaneous coverage with 5 comparisons, 2 real effects (t reference, 40 dof)
    sims, truth = 2000, np.array([0.0, 0.0, 0.0, 3.0, -3.0])
    cover = {"bonferroni": 0, "holm": 0}
    for _ in range(sims):
        est = truth + rng.standard_t(40, 5)
        eff = [Effect(float(v), 1.0, 40.0) for v in est]
        for method in cover:
            ivs = adjusted_intervals(eff, 0.05, method)
            cover[method] += all(iv.lower <= t <= iv.upper for iv, t in zip(ivs, truth, strict=True))  # type: ignore[operator]
    print(
        f"simultaneous coverage, 5 comparisons: bonferroni {cover['bonferroni'] / sims:.3f}, holm {cover['holm'] / sims:.3f}"
    )
    assert cover["bonferroni"] / sims >= 0.95 - 0.01
    assert cover["holm"] / sims >= 0.90


def test_adjusted_intervals_reject_bad_entries_with_reasons() -> None:
    out = adjusted_intervals([Effect(1.0, 0.0), None, Effect(math.nan, 1.0), Effect(2.0, 1.0)], 0.05)
    assert [o.error for o in out[:3]] == ["invalid_input", "no_data", "invalid_input"]
    assert out[3].level == pytest.approx(0.95)  # the only valid one: m = 1
    assert adjusted_intervals([Effect(1.0, 1.0)], alpha=0.0)[0].error == "invalid_input"
