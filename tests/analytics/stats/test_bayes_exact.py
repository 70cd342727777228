"""Exact Beta–binomial and the Bayesian quantile effect: references, calibration, power."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import betaln

from analytics.stats import ErrorCode, bucket_of, quantile_diff
from analytics.stats.bayes_quantile import quantile_chance_to_beat
from analytics.stats.beta_binomial import BetaPrior, beta_binomial
from tests.analytics.stats.simulate import assert_json_safe


def _evan_miller(a_c: int, b_c: int, a_t: int, b_t: int) -> float:
    """P(p_t > p_c) for integer Beta parameters (Evan Miller, "Formulas for Bayesian A/B testing")."""
    i = np.arange(a_t)
    terms = betaln(a_c + i, b_c + b_t) - np.log(b_t + i) - betaln(1 + i, b_t) - betaln(a_c, b_c)
    return float(np.exp(terms).sum())


def test_chance_to_beat_equals_evan_millers_closed_form() -> None:
    for ec, nc, et, nt in (
        (10, 100, 15, 100),
        (120, 1000, 150, 1000),
        (0, 50, 3, 40),
        (400, 5000, 390, 4000),
    ):
        r = beta_binomial(ec, nc, et, nt)
        ref = _evan_miller(1 + ec, 1 + nc - ec, 1 + et, 1 + nt - et)
        assert r.chance_to_beat_control == pytest.approx(ref, abs=1e-6)
        down = beta_binomial(ec, nc, et, nt, "decrease")
        assert down.chance_to_beat_control == pytest.approx(1 - ref, abs=1e-6)
        assert_json_safe(r)


def test_intervals_and_risks_match_monte_carlo_draws() -> None:
    rng = np.random.default_rng(601)
    prior = BetaPrior(0.5, 0.5)
    for ec, nc, et, nt in ((3, 80, 9, 90), (200, 2000, 240, 2100)):
        r = beta_binomial(ec, nc, et, nt, prior=prior)
        x = rng.beta(0.5 + ec, 0.5 + nc - ec, 2_000_000)
        y = rng.beta(0.5 + et, 0.5 + nt - et, 2_000_000)
        d, rel = y - x, y / x - 1
        assert (r.lower, r.upper) == pytest.approx(tuple(np.quantile(d, [0.025, 0.975])), rel=0.01)
        assert (r.relative_lower, r.relative_upper) == pytest.approx(
            tuple(np.quantile(rel, [0.025, 0.975])), rel=0.01
        )
        assert r.risk_treatment == pytest.approx(np.maximum(0, x - y).mean(), rel=0.02, abs=1e-6)
        assert r.risk_control == pytest.approx(np.maximum(0, y - x).mean(), rel=0.02)


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_credible_intervals_are_calibrated_when_rates_come_from_the_prior() -> None:
    rng = np.random.default_rng(602)
    sims, n, covered = 1000, 300, 0
    pc, pt = rng.beta(2, 8, sims), rng.beta(2, 8, sims)
    ec, et = rng.binomial(n, pc), rng.binomial(n, pt)
    for i in range(sims):
        r = beta_binomial(int(ec[i]), n, int(et[i]), n, prior=BetaPrior(2, 8))
        covered += r.lower <= pt[i] - pc[i] <= r.upper  # type: ignore[operator]
    print(
        f"Beta-binomial 95% credible interval: coverage {covered / sims:.3f} with rates drawn from the prior"
    )
    assert abs(covered / sims - 0.95) <= 0.015


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_decision_rule_false_positive_rate_and_power() -> None:
    rng = np.random.default_rng(603)
    sims, n = 3000, 2000
    ec, et, et2 = rng.binomial(n, 0.1, sims), rng.binomial(n, 0.1, sims), rng.binomial(n, 0.12, sims)

    def decided(a: int, b: int) -> bool:
        p = beta_binomial(a, n, b, n, with_intervals=False).chance_to_beat_control
        assert p is not None
        return p > 0.975 or p < 0.025

    fp = np.mean([decided(a, b) for a, b in zip(ec, et, strict=True)])
    power = np.mean([decided(a, b) for a, b in zip(ec, et2, strict=True)])
    se = math.sqrt(0.1 * 0.9 / n + 0.12 * 0.88 / n)
    nominal = sps.norm.cdf(0.02 / se - sps.norm.ppf(0.975))
    print(
        f"Beta-binomial, P(beat) outside [2.5%, 97.5%]: A/A {fp:.4f}; 10%->12% at 2,000/arm {power:.3f} (z-test {nominal:.3f})"
    )
    assert abs(fp - 0.05) <= 0.015
    assert abs(power - nominal) <= 0.03


def test_beta_binomial_bad_input_gets_reasons() -> None:
    assert beta_binomial(5, 4, 1, 10).error is ErrorCode.INVALID_INPUT
    assert beta_binomial(0, 0, 1, 10).error is ErrorCode.EMPTY_VARIANT
    assert beta_binomial(math.nan, 10, 1, 10).error is ErrorCode.INVALID_INPUT
    assert beta_binomial(1, 10, 1, 10, prior=BetaPrior(0, 1)).error is ErrorCode.INVALID_INPUT
    assert beta_binomial(1, 10, 1, 10, alpha=1.0).error is ErrorCode.INVALID_INPUT
    zero = beta_binomial(0, 1000, 0, 1000)
    assert zero.chance_to_beat_control == pytest.approx(0.5, abs=1e-6)
    assert_json_safe(zero)


def _hist(values: np.ndarray) -> dict[int, int]:
    return dict(Counter(bucket_of(float(v)) for v in values))


def test_quantile_chance_to_beat_is_the_gaussian_posterior_of_the_quantile_difference() -> None:
    rng = np.random.default_rng(604)
    hc, ht = _hist(rng.lognormal(5, 0.6, 4000)), _hist(rng.lognormal(5.05, 0.6, 4000))
    diff = quantile_diff(hc, ht, 0.95)
    assert diff.absolute is not None
    r = quantile_chance_to_beat(hc, ht, 0.95, "decrease", relative=False)
    # lower is better: P(Q_t − Q_c < 0)
    assert r.chance_to_beat_control == pytest.approx(
        sps.norm.cdf(-diff.absolute.estimate / diff.absolute.std_error)
    )
    assert r.lower == pytest.approx(diff.absolute.lower) and r.upper == pytest.approx(diff.absolute.upper)
    assert quantile_chance_to_beat({}, ht, 0.95).error is ErrorCode.NO_DATA
    assert_json_safe(r)


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_quantile_decision_rule_calibration_and_power_at_stated_sizes() -> None:
    rng = np.random.default_rng(605)
    sims, n = 1000, 3000
    fp = hit = 0
    for _ in range(sims):
        hc = _hist(rng.lognormal(5, 0.6, n))
        p = quantile_chance_to_beat(hc, _hist(rng.lognormal(5, 0.6, n)), 0.5).chance_to_beat_control
        p2 = quantile_chance_to_beat(hc, _hist(rng.lognormal(5, 0.6, n) * 1.05), 0.5).chance_to_beat_control
        assert p is not None and p2 is not None
        fp += p > 0.975 or p < 0.025
        hit += p2 < 0.025  # 5% slower median: the control is better
    print(
        f"quantile P(beat), p50: A/A {fp / sims:.4f}; 5% slower median caught {hit / sims:.3f} at 3,000 requests/arm"
    )
    assert abs(fp / sims - 0.05) <= 0.015
    assert hit / sims >= 0.6
