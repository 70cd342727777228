"""Lan–DeMets group-sequential boundaries, interim CIs and one-sided NI bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import Direction, ErrorCode, VariantEstimate
from analytics.stats.group_sequential import (
    Spending,
    group_sequential_design,
    group_sequential_lift,
    group_sequential_noninferiority,
    spent,
)
from tests.analytics.stats.simulate import assert_json_safe

FIVE = (0.2, 0.4, 0.6, 0.8, 1.0)


def test_boundaries_equal_the_published_gsdesign_values() -> None:
    # gsDesign(k=5, test.type=1, alpha=0.025, sfu=sfLDOF / sfLDPocock)$upper$bound
    obf = group_sequential_design(FIVE, 0.025, "obrien_fleming", two_sided=False).z_bounds
    pocock = group_sequential_design(FIVE, 0.025, "pocock", two_sided=False).z_bounds
    assert obf == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=1e-3)
    assert pocock == pytest.approx([2.4380, 2.4268, 2.4102, 2.3966, 2.3860], abs=1e-3)


@pytest.mark.parametrize("spending", list(Spending))
@pytest.mark.parametrize("fractions", [FIVE, (0.3, 0.55, 1.0)])
def test_each_looks_crossing_probability_equals_the_spent_alpha_by_scipys_multivariate_normal(
    spending: Spending, fractions: tuple[float, ...]
) -> None:
    d = group_sequential_design(fractions, 0.025, spending, two_sided=False)
    c = np.array(d.z_bounds, dtype=float)
    t = np.array(fractions)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    prev_continue = 1.0
    for k in range(len(t)):
        cont = float(
            sps.multivariate_normal.cdf(
                c[: k + 1], mean=np.zeros(k + 1), cov=cov[: k + 1, : k + 1],
                abseps=1e-9, releps=1e-9, maxpts=1_000_000, rng=np.random.default_rng(7),
            )
        )  # fmt: skip
        expected = spent(t[k], 0.025, spending) - (spent(t[k - 1], 0.025, spending) if k else 0.0)
        assert prev_continue - cont == pytest.approx(expected, abs=2e-6)
        prev_continue = cont
    assert d.cumulative_alpha[-1] == pytest.approx(0.025)


def _looks(rng: np.random.Generator, sims: int, per_look: int, effect: float) -> list[list[tuple]]:
    """Cumulative (control, treatment) estimates at 5 equal looks, normal unit values."""
    out = []
    xc = rng.normal(0.0, 1.0, (sims, 5, per_look))
    xt = rng.normal(effect, 1.0, (sims, 5, per_look))
    for arm in (xc, xt):
        s1 = arm.sum(-1).cumsum(1)
        s2 = (arm * arm).sum(-1).cumsum(1)
        n = per_look * np.arange(1, 6)
        mean = s1 / n
        var = (s2 - s1 * s1 / n) / (n - 1)
        out.append(
            [
                [VariantEstimate(int(n[k]), float(mean[i, k]), float(var[i, k])) for k in range(5)]
                for i in range(sims)
            ]
        )
    return [list(zip(c, t, strict=True)) for c, t in zip(out[0], out[1], strict=True)]


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
@pytest.mark.parametrize("spending", list(Spending))
def test_aa_false_positive_rate_over_five_looks_is_alpha_and_naive_peeking_is_not(spending: Spending) -> None:
    rng = np.random.default_rng(401)
    sims = 3000
    fp = naive = 0
    for exp in _looks(rng, sims, 100, 0.0):
        hits = [group_sequential_lift(c, t, FIVE[: k + 1], 0.05, spending) for k, (c, t) in enumerate(exp)]
        fp += any(h.reject for h in hits)
        naive += any(h.absolute is not None and h.absolute.p_value < 0.05 for h in hits)
    print(
        f"group sequential {spending}: A/A FPR {fp / sims:.4f} over 5 looks (naive peeking {naive / sims:.4f})"
    )
    assert abs(fp / sims - 0.05) <= 0.015
    assert naive / sims > 0.1


@pytest.mark.slow
def test_power_at_the_planned_size_is_close_to_the_fixed_design_and_interim_cis_cover() -> None:
    rng = np.random.default_rng(402)
    sims, per_look = 2000, 100
    n = 5 * per_look  # per arm at the last look
    effect = (sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) * math.sqrt(2.0 / n)  # 80% fixed-horizon power
    hits = covered = 0
    stops = []
    for exp in _looks(rng, sims, per_look, effect):
        ok, stop = True, None
        for k, (c, t) in enumerate(exp):
            r = group_sequential_lift(c, t, FIVE[: k + 1], 0.05, "obrien_fleming")
            assert r.absolute is not None
            ok &= r.absolute.lower <= effect <= r.absolute.upper
            if r.reject and stop is None:
                stop = k + 1
        hits += stop is not None
        covered += ok
        stops.append(stop or 5)
    print(
        f"OBF 5 looks: power {hits / sims:.3f} at {n}/arm (fixed design 0.800), mean stopping look "
        f"{np.mean(stops):.2f}, repeated-CI simultaneous coverage {covered / sims:.3f}"
    )
    assert abs(hits / sims - 0.79) <= 0.03  # OBF loses ~1 point of power against one look
    assert covered / sims >= 0.94
    assert np.mean(stops) < 4.5  # stops early when the effect is real


@pytest.mark.slow
def test_noninferiority_is_calibrated_at_the_margin_and_bounds_agree_with_verdicts() -> None:
    rng = np.random.default_rng(403)
    sims, margin = 3000, 0.1
    fp = 0
    for exp in _looks(rng, sims, 100, margin):  # treatment exactly `margin` worse (decrease metric)
        for k, (c, t) in enumerate(exp):
            g = group_sequential_noninferiority(c, t, margin, "decrease", FIVE[: k + 1], 0.05, relative=False)
            if g.reject_harm:
                fp += 1
                break
    print(f"group-sequential guardrail: false rollbacks at the margin {fp / sims:.4f} (one-sided alpha 0.05)")
    assert abs(fp / sims - 0.05) <= 0.015
    for exp in _looks(rng, 50, 100, 0.3)[:50]:
        c, t = exp[2]
        g = group_sequential_noninferiority(c, t, margin, Direction.DECREASE, FIVE[:3], 0.05, relative=False)
        assert g.harm_lower is not None and g.harm_upper is not None
        assert g.reject_harm == (g.harm_lower > margin) and g.noninferior == (g.harm_upper < margin)
        assert_json_safe(g)


def test_bad_designs_and_data_get_reasons() -> None:
    ok = VariantEstimate(100, 1.0, 1.0)
    assert group_sequential_design([], 0.05).error is ErrorCode.INVALID_INPUT
    assert group_sequential_design([0.5, 0.4], 0.05).error is ErrorCode.INVALID_INPUT
    assert group_sequential_design([0.5, math.nan], 0.05).error is ErrorCode.INVALID_INPUT
    assert group_sequential_design([1.2, 1.5], 0.05).error is ErrorCode.INVALID_INPUT  # two final looks
    assert group_sequential_design([0.5], 1.5).error is ErrorCode.INVALID_INPUT
    beyond = group_sequential_design([0.5, 1.3], 0.05)
    assert beyond.fractions == (0.5, 1.0) and beyond.cumulative_alpha[-1] == pytest.approx(0.05)
    assert group_sequential_lift(
        ok, VariantEstimate(0, None, None, ErrorCode.EMPTY_VARIANT, "x"), [0.5]
    ).error
    assert group_sequential_noninferiority(ok, ok, -0.1, "decrease", [0.5]).error is ErrorCode.INVALID_INPUT
    zero = VariantEstimate(100, 0.0, 1.0)
    assert (
        group_sequential_noninferiority(zero, ok, 0.1, "decrease", [0.5]).error is ErrorCode.ZERO_CONTROL_MEAN
    )
    for r in (group_sequential_lift(ok, ok, [0.5]), group_sequential_design([0.3, 0.6, 1.0], 0.05, "pocock")):
        assert_json_safe(r)
