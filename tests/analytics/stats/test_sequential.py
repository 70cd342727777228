"""Confidence sequences, mSPRT p-values and the one-sided sequential guardrail."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize
from scipy import stats as sps

from analytics.stats import (
    Direction,
    ErrorCode,
    MetricKind,
    SampleStats,
    VariantEstimate,
    estimate,
    msprt_p_value,
    sequential_lift,
    sequential_noninferiority,
)
from analytics.stats.sequential import log_one_sided_lr, one_sided_halfwidth, tuning_rho2
from tests.analytics.stats.simulate import assert_json_safe


def test_confidence_sequence_is_the_inversion_of_the_msprt() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 3000), rng.normal(0.05, 1, 3000)
    c, t = estimate(SampleStats.from_values(a)), estimate(SampleStats.from_values(b))
    r = sequential_lift(c, t, 0.05, planned_units=6000)
    assert r.absolute is not None
    var = (c.variance or 0) + (t.variance or 0)

    def p_at(theta0: float) -> float:
        return msprt_p_value(r.absolute.estimate - theta0, var, 6000, 0.05, 6000)  # type: ignore[union-attr]

    upper = optimize.brentq(lambda th: p_at(th) - 0.05, r.absolute.estimate, r.absolute.estimate + 1)
    lower = optimize.brentq(lambda th: p_at(th) - 0.05, r.absolute.estimate - 1, r.absolute.estimate)
    assert (r.absolute.lower, r.absolute.upper) == pytest.approx((lower, upper), rel=1e-7)
    # wider than the fixed-horizon interval: the price of looking at any time
    assert r.absolute.upper - r.absolute.lower > 2 * 1.96 * math.sqrt(var)


def test_msprt_matches_johari_formula_with_the_documented_tuning() -> None:
    v, n, diff, alpha, planned = 0.004, 5000, 0.2, 0.05, 20000
    tau2 = tuning_rho2(planned, alpha) * v * n
    lam = math.sqrt(v / (v + tau2)) * math.exp(diff**2 * tau2 / (2 * v * (v + tau2)))
    assert msprt_p_value(diff, v, n, alpha, planned) == pytest.approx(min(1.0, 1 / lam))
    la = -2 * math.log(alpha)
    assert tuning_rho2(planned, alpha) == pytest.approx((la + math.log(1 + la)) / planned)


def test_one_sided_mixture_ratio_matches_numerical_integration() -> None:
    v, tau2 = 0.01, 0.03
    sd = math.sqrt(tau2)
    for d in (-0.1, 0.0, 0.15, 0.4):

        def integrand(lam: float, d: float = d) -> float:
            return math.exp(d * lam / v - lam * lam / (2 * v)) * 2 * float(sps.norm.pdf(lam, 0, sd))

        numeric, _ = integrate.quad(integrand, 0, np.inf)
        assert math.exp(log_one_sided_lr(d, v, tau2)) == pytest.approx(numeric, rel=1e-6)
    d = one_sided_halfwidth(v, tau2, 0.05)
    assert math.exp(log_one_sided_lr(d, v, tau2)) == pytest.approx(20.0, rel=1e-6)


def test_confidence_sequence_covers_a_real_effect_at_every_look() -> None:
    rng = np.random.default_rng(2)
    experiments, looks, batch, effect = 500, 10, 200, 0.3
    x = rng.exponential(1.0, (2, experiments, looks, batch))
    x[1] += effect
    s1, s2 = np.cumsum(x.sum(-1), -1), np.cumsum((x * x).sum(-1), -1)
    misses = 0
    for e in range(experiments):
        for k in range(looks):
            n = (k + 1) * batch
            c = estimate(SampleStats(n, float(s1[0, e, k]), float(s2[0, e, k])))
            t = estimate(SampleStats(n, float(s1[1, e, k]), float(s2[1, e, k])))
            r = sequential_lift(c, t, 0.05, planned_units=2 * looks * batch)
            assert r.absolute is not None and r.relative is not None
            if not (r.absolute.lower <= effect <= r.absolute.upper):
                misses += 1
                break
    assert misses / experiments <= 0.05


def _guardrail_runs(
    rng: np.random.Generator,
    rate_t: float,
    experiments: int,
    looks: int,
    batch: int,
    margin: float = 0.1,
    relative: bool = True,
) -> tuple[float, float]:
    """Share of experiments whose harm test rejects at some look, and mean look of rejection."""
    xc = rng.binomial(batch, 0.02, (experiments, looks)).cumsum(1).astype(float)
    xt = rng.binomial(batch, rate_t, (experiments, looks)).cumsum(1).astype(float)
    rejected, first = 0, []
    for e in range(experiments):
        for k in range(looks):
            n = (k + 1) * batch
            c = estimate(SampleStats(n, float(xc[e, k]), float(xc[e, k])), MetricKind.PROPORTION)
            t = estimate(SampleStats(n, float(xt[e, k]), float(xt[e, k])), MetricKind.PROPORTION)
            g = sequential_noninferiority(
                c, t, margin, Direction.DECREASE, 0.05, planned_units=2 * looks * batch, relative=relative
            )
            if g.error is None and g.reject_harm:
                assert g.p_value_harm is not None and g.p_value_harm <= 0.05
                rejected += 1
                first.append(k + 1)
                break
    return rejected / experiments, float(np.mean(first)) if first else float("nan")


@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_sequential_guardrail_rarely_rolls_back_an_equal_candidate_under_continuous_monitoring() -> None:
    # margin 0 puts the A/A truth on the null boundary: the worst case for the error rate
    for relative in (True, False):
        rate, _ = _guardrail_runs(
            np.random.default_rng(3), 0.02, 1000, 20, 250, margin=0.0, relative=relative
        )
        print(
            f"A/A guardrail (error rate 2%, margin 0, 20 looks, relative={relative}): harm declared in {rate:.4f}"
        )
        assert rate <= 0.05


def test_sequential_guardrail_catches_a_candidate_with_three_times_the_error_rate_early() -> None:
    rate, mean_look = _guardrail_runs(np.random.default_rng(4), 0.06, 200, 20, 250)
    assert rate == 1.0
    print(
        f"3x error rate (2% -> 6%), 250 units/arm per look: harm declared at look {mean_look:.2f} on average"
    )
    assert mean_look <= 4.5


def test_guardrail_direction_and_noninferiority_verdicts() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.normal(100, 10, 20000), rng.normal(100, 10, 20000)
    c, t = estimate(SampleStats.from_values(a)), estimate(SampleStats.from_values(b))
    g = sequential_noninferiority(c, t, 0.02, "increase", planned_units=40000)
    assert g.noninferior and not g.reject_harm
    worse = estimate(SampleStats.from_values(b * 0.9))
    for direction, harmed in (("increase", True), ("decrease", False)):
        g = sequential_noninferiority(c, worse, 0.02, direction, planned_units=40000)
        assert g.reject_harm is harmed
        assert_json_safe(g)


def test_sequential_degenerate_inputs_return_error_codes() -> None:
    ok = estimate(SampleStats.from_values([1.0, 2.0, 3.0]))
    zero = estimate(SampleStats.from_values([0.0, 0.0, 0.0]))
    one = estimate(SampleStats.from_values([1.0]))
    assert sequential_lift(one, ok).error is ErrorCode.TOO_FEW_UNITS
    assert sequential_lift(zero, zero).error is ErrorCode.ZERO_VARIANCE
    r = sequential_lift(estimate(SampleStats.from_values([-1.0, 1.0])), ok)
    assert r.relative is None and r.relative_error is ErrorCode.ZERO_CONTROL_MEAN
    g = sequential_noninferiority(estimate(SampleStats.from_values([-1.0, 1.0])), ok, 0.05, "decrease")
    assert g.error is ErrorCode.ZERO_CONTROL_MEAN and not g.reject_harm
    assert sequential_noninferiority(ok, ok, -0.1, "decrease").error is ErrorCode.INVALID_INPUT
    # a treatment of all zeros against a varying control: the relative lift has no variance
    flat = sequential_lift(ok, zero)
    assert flat.absolute is not None and flat.relative is None
    assert flat.relative_error is ErrorCode.ZERO_VARIANCE
    assert msprt_p_value(0.3, 0.0, 10) == 1.0
    for res in (r, g, sequential_lift(zero, zero)):
        assert_json_safe(res)


def test_sequential_guardrail_verdicts_agree_with_their_bounds() -> None:
    rng = np.random.default_rng(6)
    for _ in range(300):
        n_c, n_t = (int(v) for v in rng.integers(20, 5000, 2))
        mc = float(rng.choice([-1.0, 1.0]) * rng.uniform(0.01, 10))
        c = VariantEstimate(n_c, mc, float(rng.uniform(0.01, 50)))
        t = VariantEstimate(n_t, mc * float(rng.uniform(0.5, 1.5)), float(rng.uniform(0.01, 50)))
        margin = float(rng.uniform(0, 0.2))
        for direction in Direction:
            for relative in (True, False):
                g = sequential_noninferiority(
                    c, t, margin, direction, relative=relative, planned_units=n_c + n_t
                )
                assert g.error is None and g.harm is not None
                if g.harm_lower is not None:
                    assert g.harm_lower <= g.harm
                    assert g.reject_harm == (g.harm_lower > margin)
                else:
                    assert not g.reject_harm
                if g.harm_upper is not None:
                    assert g.harm_upper >= g.harm
                    assert g.noninferior == (g.harm_upper < margin)
                else:
                    assert not g.noninferior
