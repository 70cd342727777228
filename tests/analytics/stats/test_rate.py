"""The always-valid score test on a difference of event rates (rate guardrails)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import optimize
from statsmodels.stats.proportion import score_test_proportions_2indep

from analytics.stats import (
    ErrorCode,
    MetricKind,
    SampleStats,
    estimate,
    restricted_rates,
    sequential_noninferiority,
    sequential_rate_noninferiority,
)
from analytics.stats.rate import RateArm, RateContrast, rate_arm
from tests.analytics.stats.simulate import assert_json_safe


def _arm(units: int, events: int) -> SampleStats:
    """``units`` units of one request each, ``events`` of them with an event."""
    return SampleStats.from_values([1.0] * events + [0.0] * (units - events), [1.0] * units)


def _profile_argmax(et: float, nt: float, ec: float, nc: float, diff: float) -> float:
    lo, hi = max(0.0, -diff), min(1.0, 1.0 - diff)

    def negloglik(pc: float) -> float:
        pt = pc + diff
        out = 0.0
        for e, n, p in ((et, nt, pt), (ec, nc, pc)):
            out += e * math.log(max(p, 1e-300)) + (n - e) * math.log(max(1.0 - p, 1e-300))
        return -out

    res = optimize.minimize_scalar(negloglik, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12})
    return float(res.x)


@pytest.mark.parametrize(
    ("et", "nt", "ec", "nc", "diff"),
    [
        (9, 30, 0, 2970, 0.01),
        (0, 500, 0, 500, 0.01),
        (0, 500, 0, 500, -0.02),
        (30, 1000, 10, 1000, 0.01),
        (30, 1000, 10, 1000, -0.05),
        (1, 40, 3, 4000, 0.2),
        (400, 1000, 500, 1000, 0.3),
        (0, 50, 50, 50, -0.5),
        (50, 50, 0, 50, 0.999),
    ],
)
def test_restricted_rates_are_the_likelihood_maximum_under_the_margin(
    et: int, nt: int, ec: int, nc: int, diff: float
) -> None:
    pt, pc = restricted_rates(et, nt, ec, nc, diff)
    assert pt - pc == pytest.approx(diff, abs=1e-12)
    assert 0.0 <= pc <= 1.0 and 0.0 <= pt <= 1.0
    assert pc == pytest.approx(_profile_argmax(et, nt, ec, nc, diff), abs=2e-6)


def test_at_a_zero_margin_the_null_variance_and_statistic_are_statsmodels_score_test() -> None:
    """statsmodels' score test (correction=False, i.e. Farrington–Manning) at value 0 uses the
    pooled rate. At value ≠ 0 its cubic has a wrong coefficient (statsmodels issue #10269:
    ``count0`` where ``nobs0`` belongs), so there the reference is the numerical maximum above."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(200):
        nt, nc = int(rng.integers(30, 2000)), int(rng.integers(30, 2000))
        et, ec = int(rng.binomial(nt, rng.uniform(0, 0.2))), int(rng.binomial(nc, rng.uniform(0, 0.2)))
        if et + ec == 0:
            continue
        t, c = _arm(nt, et), _arm(nc, ec)
        arms = rate_arm(t, "ratio"), rate_arm(c, "ratio")
        assert isinstance(arms[0], RateArm) and isinstance(arms[1], RateArm)
        d, v = RateContrast(arms[0], arms[1], 1.0).at(0.0)
        sm = score_test_proportions_2indep(et, nt, ec, nc, value=0, correction=False, alternative="larger")
        # ours takes per arm the larger of the observed and the null variance: never smaller
        assert v >= float(sm.variance) * (1 - 1e-12)
        pooled = (et + ec) / (nt + nc)
        v_null = pooled * (1 - pooled) * (1 / nt + 1 / nc)
        assert float(sm.variance) == pytest.approx(v_null, rel=1e-12)
        assert d / math.sqrt(v_null) == pytest.approx(float(sm.statistic), rel=1e-9)
        # an always-valid rejection is also a fixed-horizon score-test rejection at that alpha
        r = sequential_rate_noninferiority(c, t, 0.0, "decrease", alpha=0.05, planned_units=4000)
        if r.reject_harm:
            assert float(sm.pvalue) < 0.05
            checked += 1
    assert checked > 5  # the implication was exercised


def test_a_30_percent_error_candidate_against_an_error_free_baseline_is_harm_where_a_relative_margin_is_undefined() -> (
    None
):
    control, candidate = _arm(5940, 0), _arm(60, 18)
    rate = sequential_rate_noninferiority(
        control, candidate, 0.01, "decrease", alpha=0.0025, planned_units=10_000
    )
    assert rate.error is None and rate.reject_harm and not rate.noninferior
    assert rate.harm == pytest.approx(0.3) and rate.harm_lower is not None and rate.harm_lower > 0.01
    assert rate.p_value_harm is not None and rate.p_value_harm <= 0.0025
    relative = sequential_noninferiority(
        estimate(control, "ratio"), estimate(candidate, "ratio"), 0.25, "decrease", 0.0025, 10_000
    )
    assert relative.error is ErrorCode.ZERO_CONTROL_MEAN and not relative.reject_harm
    assert_json_safe(rate)


def test_two_error_free_arms_show_non_inferiority_within_one_point() -> None:
    r = sequential_rate_noninferiority(
        _arm(3000, 0), _arm(3000, 0), 0.01, "decrease", alpha=0.0025, planned_units=6000, alpha_noninferiority=0.05
    )  # fmt: skip
    assert r.noninferior and not r.reject_harm
    assert r.harm == 0.0 and r.harm_upper is not None and 0.0 < r.harm_upper < 0.01
    assert r.alpha_noninferiority == 0.05
    few = sequential_rate_noninferiority(_arm(40, 0), _arm(40, 0), 0.01, "decrease", 0.0025, 6000)
    assert not few.noninferior and not few.reject_harm  # 40 clean requests prove nothing


def test_the_harm_bounds_are_where_each_test_flips() -> None:
    control, candidate = _arm(4000, 40), _arm(1000, 30)
    r = sequential_rate_noninferiority(
        control, candidate, 0.01, "decrease", 0.01, 5000, alpha_noninferiority=0.05
    )
    assert r.harm_lower is not None and r.harm_upper is not None
    assert r.harm == pytest.approx(0.02)
    assert r.harm_lower < 0.02 < r.harm_upper

    def at(m: float, **kw: float) -> tuple[bool, bool]:
        res = sequential_rate_noninferiority(
            control, candidate, m, "decrease", 0.01, 5000, alpha_noninferiority=0.05
        )
        return res.reject_harm, res.noninferior

    assert at(r.harm_lower - 1e-6)[0] and not at(r.harm_lower + 1e-6)[0]
    assert at(r.harm_upper + 1e-6)[1] and not at(r.harm_upper - 1e-6)[1]


def test_a_metric_where_more_events_are_better_is_harmed_by_fewer() -> None:
    control, candidate = _arm(2000, 400), _arm(2000, 200)  # e.g. task success 20% → 10%
    r = sequential_rate_noninferiority(control, candidate, 0.02, "increase", 0.01, 4000)
    assert r.reject_harm and r.harm == pytest.approx(0.1)
    assert not sequential_rate_noninferiority(candidate, control, 0.02, "increase", 0.01, 4000).reject_harm


def test_a_proportion_of_units_is_a_rate_with_one_trial_per_unit() -> None:
    control = SampleStats.from_values([0.0] * 990 + [1.0] * 10)
    candidate = SampleStats.from_values([0.0] * 700 + [1.0] * 300)
    r = sequential_rate_noninferiority(
        control, candidate, 0.01, "decrease", 0.01, 2000, kind=MetricKind.PROPORTION
    )
    assert r.reject_harm and r.harm == pytest.approx(0.29)
    counts = SampleStats.from_values([0.0, 2.0, 1.0])
    bad = sequential_rate_noninferiority(counts, counts, 0.01, "decrease", kind=MetricKind.PROPORTION)
    assert bad.error is ErrorCode.INVALID_INPUT and "0/1" in (bad.message or "")


@pytest.mark.parametrize(
    ("control", "candidate", "margin", "code"),
    [
        (_arm(100, 5), SampleStats(1, 1.0, 1.0, 1.0, 1.0, 1.0), 0.01, ErrorCode.TOO_FEW_UNITS),
        (_arm(100, 5), SampleStats(50, 0.0, 0.0, 0.0, 0.0, 0.0), 0.01, ErrorCode.ZERO_DENOMINATOR),
        (_arm(100, 5), SampleStats(50, 80.0, 200.0, 50.0, 50.0, 80.0), 0.01, ErrorCode.INVALID_INPUT),
        (_arm(100, 5), SampleStats(50, math.nan, 1.0, 50.0, 50.0, 1.0), 0.01, ErrorCode.INVALID_INPUT),
        (_arm(100, 5), SampleStats(50, 1.0, 1.0, math.inf, math.inf, 1.0), 0.01, ErrorCode.INVALID_INPUT),
        (_arm(100, 5), _arm(100, 5), 1.0, ErrorCode.INVALID_INPUT),
        (_arm(100, 5), _arm(100, 5), -0.01, ErrorCode.INVALID_INPUT),
    ],
)
def test_degenerate_input_is_an_error_never_a_verdict(
    control: SampleStats, candidate: SampleStats, margin: float, code: ErrorCode
) -> None:
    r = sequential_rate_noninferiority(control, candidate, margin, "decrease", 0.01, 1000)
    assert r.error is code, r
    assert not r.reject_harm and not r.noninferior and r.message
    assert_json_safe(r)


def _simulate(
    rng: np.random.Generator,
    sims: int,
    looks: int,
    units_per_look: int,
    share: float,
    p_control: float,
    p_candidate: float,
    concentration: float = 20.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative per-look sums per arm: (n, Σx, Σx², Σy, Σy², Σxy) × arm, lognormal activity
    (Poisson requests per unit) and per-unit event probabilities ~ Beta (clustered events)."""
    out = np.zeros((2, sims, looks, 6))
    for arm, (p, frac) in enumerate(((p_control, 1 - share), (p_candidate, share))):
        n_units = max(2, round(units_per_look * frac))
        lam = rng.lognormal(0.0, 0.8, (sims, looks, n_units)) * 1.5
        y = 1.0 + rng.poisson(lam)
        if p > 0:
            pi = rng.beta(p * concentration, (1 - p) * concentration, y.shape)
            x = rng.binomial(y.astype(np.int64), pi).astype(np.float64)
        else:
            x = np.zeros_like(y)
        sums = np.stack([np.full(y.shape[:2], n_units), x.sum(-1), (x * x).sum(-1), y.sum(-1),
                         (y * y).sum(-1), (x * y).sum(-1)], -1)  # fmt: skip
        out[arm] = np.cumsum(sums, axis=1)
    return out[0], out[1]


def _rejections(
    control: np.ndarray, candidate: np.ndarray, margin: float, alpha: float, planned: int
) -> np.ndarray:
    """Per simulation: the first look (0-based) at which harm was rejected, or -1."""
    sims, looks, _ = control.shape
    first = np.full(sims, -1)
    for s in range(sims):
        for k in range(looks):
            c, t = (SampleStats(int(a[s, k, 0]), *a[s, k, 1:]) for a in (control, candidate))
            r = sequential_rate_noninferiority(c, t, margin, "decrease", alpha, planned, with_bounds=False)
            if r.reject_harm:
                first[s] = k
                break
    return first


@pytest.mark.parametrize(
    ("p_control", "share"),
    [(0.0, 0.05), (0.01, 0.05), (0.01, 0.5), (0.05, 0.25)],
)
@pytest.mark.slow  # a calibration by simulation: CI runs it, the fast loop does not
def test_false_rollbacks_at_the_margin_stay_below_alpha_over_every_look(
    p_control: float, share: float
) -> None:
    """Worst case of H0: the candidate exactly one margin worse, clustered events, 12 looks."""
    started = time.monotonic()
    rng = np.random.default_rng(int(p_control * 1000) + int(share * 100))
    sims, alpha, margin = 1500, 0.05, 0.01
    control, candidate = _simulate(rng, sims, 12, 400, share, p_control, p_control + margin)
    first = _rejections(control, candidate, margin, alpha, planned=4800)
    rate = float((first >= 0).mean())
    # Monte Carlo: 1,500 runs give a standard error ≤ 0.006 around a true rate ≤ 0.05
    assert rate <= alpha + 0.015, f"false rollback rate {rate:.3f} at p_c={p_control}, share {share}"
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_an_equal_candidate_is_almost_never_rolled_back() -> None:
    rng = np.random.default_rng(11)
    control, candidate = _simulate(rng, 1000, 12, 400, 0.25, 0.02, 0.02)
    first = _rejections(control, candidate, 0.01, 0.05, planned=4800)
    assert (first >= 0).mean() <= 0.005


@pytest.mark.parametrize(
    ("p_control", "units_per_look", "looks", "min_power"),
    # stated sizes: 5% candidate share, alpha 0.0025 (0.05 over 4 guardrails × 5 stages)
    [(0.0, 400, 3, 0.95), (0.01, 400, 3, 0.95)],
)
def test_a_30_percent_error_candidate_is_caught_within_a_few_dozen_candidate_units(
    p_control: float, units_per_look: int, looks: int, min_power: float
) -> None:
    """1,200 units at a 5% share: ~60 candidate units, ~2.5 requests each."""
    rng = np.random.default_rng(3)
    control, candidate = _simulate(rng, 400, looks, units_per_look, 0.05, p_control, 0.30)
    first = _rejections(control, candidate, 0.01, 0.0025, planned=10_000)
    power = float((first >= 0).mean())
    assert power >= min_power, f"power {power:.3f} with {candidate[0, -1, 0]:.0f} candidate units"


def test_three_times_the_errors_of_a_1_percent_baseline_is_caught_at_a_50_percent_stage() -> None:
    """Harm 0.02 against a 0.01 margin: 10,000 units (~31,000 requests) at 50%, alpha 0.0025."""
    rng = np.random.default_rng(5)
    control, candidate = _simulate(rng, 200, 10, 1000, 0.5, 0.01, 0.03)
    first = _rejections(control, candidate, 0.01, 0.0025, planned=10_000)
    assert (first >= 0).mean() >= 0.8
    # and it rolled back no earlier than the data allow: not on the first look
    assert (first == 0).mean() < 0.5
