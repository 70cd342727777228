"""Quantile CIs from log-bucketed histograms: coverage on simulated lognormal latencies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import (
    BUCKETS_PER_E,
    ErrorCode,
    SampleStats,
    bucket_bounds,
    bucket_of,
    design_effect,
    estimated_design_effect,
    quantile_ci,
    quantile_diff,
)
from tests.analytics.stats.simulate import assert_json_safe

MU, SIGMA = 5.0, 0.8  # median latency e^5 ≈ 148 ms


def _histograms(latencies: np.ndarray) -> list[dict[int, int]]:
    buckets = np.floor(BUCKETS_PER_E * np.log(latencies)).astype(np.int64)
    out = []
    for row in buckets:
        keys, counts = np.unique(row, return_counts=True)
        out.append(dict(zip(keys.tolist(), counts.tolist(), strict=True)))
    return out


def test_bucket_rule_matches_the_ingest_definition() -> None:
    for v in (0.5, 1.0, 148.4, 2500.0):
        k = bucket_of(v)
        lo, hi = bucket_bounds(k)
        assert k == math.floor(20 * math.log(v)) and lo <= v < hi


def test_quantile_estimate_is_within_bucket_resolution_of_the_exact_sample_quantile() -> None:
    rng = np.random.default_rng(61)
    lat = rng.lognormal(MU, SIGMA, 20000)
    (hist,) = _histograms(lat[None, :])
    for q in (0.5, 0.95, 0.99):
        r = quantile_ci(hist, q)
        assert r.estimate == pytest.approx(np.quantile(lat, q), rel=0.01)
        assert r.lower is not None and r.upper is not None and r.estimate is not None
        assert r.lower < r.estimate < r.upper
        assert_json_safe(r)


@pytest.mark.parametrize("q", [0.5, 0.95])
def test_quantile_ci_covers_the_true_quantile_at_the_nominal_rate(q: float) -> None:
    rng = np.random.default_rng(62)
    sims = 1000
    hists = _histograms(rng.lognormal(MU, SIGMA, (sims, 2000)))
    truth = math.exp(MU + SIGMA * float(sps.norm.ppf(q)))
    covered = 0
    for h in hists:
        r = quantile_ci(h, q)
        assert r.lower is not None and r.upper is not None
        covered += r.lower <= truth <= r.upper
    print(f"quantile CI coverage p{int(q * 100)}: {covered / sims:.3f}")
    assert 0.93 <= covered / sims <= 0.975


def test_difference_of_p95_between_variants_covers_a_ten_percent_slowdown() -> None:
    rng = np.random.default_rng(63)
    sims = 600
    control = _histograms(rng.lognormal(MU, SIGMA, (sims, 3000)))
    same = _histograms(rng.lognormal(MU, SIGMA, (sims, 3000)))
    treatment = _histograms(rng.lognormal(MU, SIGMA, (sims, 3000)) * 1.10)
    covered = detected = false_alarms = 0
    for c, s, t in zip(control, same, treatment, strict=True):
        r = quantile_diff(c, t, 0.95)
        assert r.relative is not None
        covered += r.relative.lower <= 0.10 <= r.relative.upper
        detected += r.relative.p_value < 0.05
        aa = quantile_diff(c, s, 0.95)
        assert aa.absolute is not None
        false_alarms += aa.absolute.p_value < 0.05
    print(
        f"p95 difference: CI coverage {covered / sims:.3f}, power for +10% at 3000 requests/arm "
        f"{detected / sims:.3f}, A/A false positives {false_alarms / sims:.3f}"
    )
    assert 0.92 <= covered / sims <= 0.985
    assert 0.02 <= false_alarms / sims <= 0.08
    assert detected / sims > 0.3


def test_design_effect_restores_coverage_when_requests_cluster_in_units() -> None:
    rng = np.random.default_rng(64)
    sims, units, per_unit, sd_unit, sd_req = 600, 200, 10, 0.5, 0.6
    unit_effect = rng.normal(0, sd_unit, (sims, units, 1))
    lat = np.exp(MU + unit_effect + rng.normal(0, sd_req, (sims, units, per_unit))).reshape(sims, -1)
    hists = _histograms(lat)
    truth = math.exp(MU)  # median of the marginal lognormal
    icc = sd_unit**2 / (sd_unit**2 + sd_req**2)
    deff = design_effect(per_unit, icc)
    naive = adjusted = 0
    for h in hists:
        a, b = quantile_ci(h, 0.5), quantile_ci(h, 0.5, design_effect=deff)
        assert a.lower is not None and a.upper is not None and b.lower is not None and b.upper is not None
        naive += a.lower <= truth <= a.upper
        adjusted += b.lower <= truth <= b.upper
    print(
        f"clustered requests: p50 coverage naive {naive / sims:.3f}, with design effect {deff:.2f} {adjusted / sims:.3f}"
    )
    assert naive / sims < 0.85
    assert adjusted / sims >= 0.93


def test_design_effect_estimated_from_per_unit_sums_restores_coverage() -> None:
    rng = np.random.default_rng(65)
    sims, units, max_requests = 400, 200, 20
    unit_effect = rng.normal(0, 0.5, (sims, units, 1))
    requests = rng.integers(1, max_requests, (sims, units, 1))
    sent = np.arange(max_requests)[None, None, :] < requests
    lat = np.exp(MU + unit_effect + rng.normal(0, 0.6, (sims, units, max_requests)))
    naive = adjusted = 0
    deffs = []
    for i in range(sims):
        (hist,) = _histograms(lat[i][sent[i]][None, :])
        per_unit = SampleStats.from_values((lat[i] * sent[i]).sum(1), sent[i].sum(1).astype(float))
        deff = estimated_design_effect(per_unit, hist)
        deffs.append(deff)
        a, b = quantile_ci(hist, 0.5), quantile_ci(hist, 0.5, design_effect=deff)
        assert a.lower is not None and a.upper is not None and b.lower is not None and b.upper is not None
        naive += a.lower <= math.exp(MU) <= a.upper
        adjusted += b.lower <= math.exp(MU) <= b.upper
    print(
        f"estimated design effect {np.mean(deffs):.2f}: p50 coverage {naive / sims:.3f} -> {adjusted / sims:.3f}"
    )
    assert naive / sims < 0.85
    assert adjusted / sims >= 0.93
    # one request per unit: no clustering, the estimate stays near 1
    single = rng.lognormal(MU, SIGMA, 3000)
    (hist,) = _histograms(single[None, :])
    alone = estimated_design_effect(SampleStats.from_values(single, np.ones(3000)), hist)
    assert 1.0 <= alone < 1.3


def test_degenerate_histograms_return_error_codes() -> None:
    assert quantile_ci({}, 0.5).error is ErrorCode.NO_DATA
    assert quantile_ci({100: 1}, 0.5).error is ErrorCode.TOO_FEW_UNITS
    assert quantile_ci({100: 5}, 1.5).error is ErrorCode.INVALID_INPUT
    r = quantile_diff({}, {100: 5, 101: 3}, 0.5)
    assert r.error is ErrorCode.NO_DATA and r.absolute is None
    same = quantile_diff({100: 50}, {100: 50}, 0.5)
    assert_json_safe(same)
    assert_json_safe(r)
