"""A/A calibration: false-positive rates over thousands of simulated experiments.

Figures printed with ``-s`` are the ones quoted in docs/statistics.md.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from analytics.stats import MetricKind, SampleStats, estimate, sequential_lift, welch_lift
from tests.analytics.stats.simulate import stats_rows

EXPERIMENTS = 2000
ALPHA = 0.05
FPR_BAND = (0.035, 0.065)


def _fixed_fpr(control: list[SampleStats], treatment: list[SampleStats], kind: MetricKind) -> float:
    rejections = 0
    for c, t in zip(control, treatment, strict=True):
        r = welch_lift(estimate(c, kind), estimate(t, kind), ALPHA)
        assert r.absolute is not None
        rejections += r.absolute.p_value < ALPHA
    return rejections / len(control)


def test_fixed_horizon_false_positive_rate_is_nominal_for_mean_metrics() -> None:
    rng = np.random.default_rng(101)
    # skewed per-unit values (tokens per unit): lognormal, 300 units per arm
    x = rng.lognormal(5.0, 1.0, (2, EXPERIMENTS, 300))
    fpr = _fixed_fpr(stats_rows(x[0]), stats_rows(x[1]), MetricKind.MEAN)
    print(f"A/A fixed-horizon FPR, mean metric: {fpr:.4f}")
    assert FPR_BAND[0] <= fpr <= FPR_BAND[1]


def test_fixed_horizon_false_positive_rate_is_nominal_for_proportions() -> None:
    rng = np.random.default_rng(102)
    n = 1000
    s = rng.binomial(n, 0.12, (2, EXPERIMENTS)).astype(float)  # Σx = Σx² for 0/1 values
    arms = [[SampleStats(n, float(v), float(v)) for v in s[i]] for i in range(2)]
    fpr = _fixed_fpr(arms[0], arms[1], MetricKind.PROPORTION)
    print(f"A/A fixed-horizon FPR, proportion metric: {fpr:.4f}")
    assert FPR_BAND[0] <= fpr <= FPR_BAND[1]


def _heavy_user_arm(rng: np.random.Generator, units: int) -> tuple[np.ndarray, np.ndarray]:
    """Requests per unit are lognormal(1, 1.5) (the top 5% of units send ~40% of the
    requests) and each unit has its own propensity, so its requests are correlated."""
    requests = np.ceil(rng.lognormal(1.0, 1.5, (EXPERIMENTS, units)))
    propensity = rng.beta(0.6, 1.4, (EXPERIMENTS, units))
    return rng.binomial(requests.astype(np.int64), propensity).astype(float), requests


@pytest.mark.slow
def test_per_unit_ratio_analysis_is_calibrated_with_heavy_users_and_naive_per_request_is_not() -> None:
    rng = np.random.default_rng(103)
    xc, yc = _heavy_user_arm(rng, 1000)
    xt, yt = _heavy_user_arm(rng, 1000)
    top = np.sort(yc, axis=1)[:, -50:].sum(1) / yc.sum(1)
    assert np.median(top) > 0.3  # 5% of the units send a third or more of the requests
    fpr = _fixed_fpr(stats_rows(xc, yc), stats_rows(xt, yt), MetricKind.RATIO)
    # naive: every request an independent Bernoulli trial, n = number of requests
    naive = []
    for i in range(EXPERIMENTS):
        c = SampleStats(int(yc[i].sum()), float(xc[i].sum()), float(xc[i].sum()))
        t = SampleStats(int(yt[i].sum()), float(xt[i].sum()), float(xt[i].sum()))
        r = welch_lift(estimate(c, MetricKind.PROPORTION), estimate(t, MetricKind.PROPORTION), ALPHA)
        assert r.absolute is not None
        naive.append(r.absolute.p_value < ALPHA)
    naive_fpr = float(np.mean(naive))
    print(f"A/A heavy users: per-unit ratio (delta method) FPR {fpr:.4f}, naive per-request {naive_fpr:.4f}")
    assert FPR_BAND[0] <= fpr <= FPR_BAND[1]
    assert naive_fpr > 0.15


@pytest.mark.slow
def test_sequential_test_stays_below_alpha_under_peeking_while_naive_peeking_does_not() -> None:
    rng = np.random.default_rng(104)
    looks, batch = 20, 100
    # per-batch sums, then cumulative: a look after every batch of 100 units per arm
    x = rng.normal(1.0, 2.0, (2, EXPERIMENTS, looks, batch))
    s1 = np.cumsum(x.sum(-1), axis=-1)
    s2 = np.cumsum((x * x).sum(-1), axis=-1)
    planned = 2 * looks * batch
    n = batch * np.arange(1, looks + 1)
    var = (s2 - s1 * s1 / n) / (n - 1)
    se = np.sqrt(var[0] / n + var[1] / n)
    t_stat = (s1[1] / n - s1[0] / n) / se
    dof = (var[0] / n + var[1] / n) ** 2 / ((var[0] / n) ** 2 / (n - 1) + (var[1] / n) ** 2 / (n - 1))
    fixed_p = 2 * sps.t.sf(np.abs(t_stat), dof)  # independent Welch computation per look
    naive_fpr = float((fixed_p < ALPHA).any(axis=1).mean())
    final_fpr = float((fixed_p[:, -1] < ALPHA).mean())
    seq_reject = np.zeros(EXPERIMENTS, dtype=bool)
    for e in range(EXPERIMENTS):
        running_p = 1.0
        for k in range(looks):
            c = estimate(SampleStats(int(n[k]), float(s1[0, e, k]), float(s2[0, e, k])))
            t = estimate(SampleStats(int(n[k]), float(s1[1, e, k]), float(s2[1, e, k])))
            seq = sequential_lift(c, t, ALPHA, planned_units=planned)
            assert seq.absolute is not None
            running_p = min(running_p, seq.absolute.p_value)
            # the confidence sequence excludes 0 exactly when this look's p-value is <= alpha
            assert (seq.absolute.lower > 0 or seq.absolute.upper < 0) == (seq.absolute.p_value <= ALPHA)
        seq_reject[e] = running_p <= ALPHA
    seq_fpr = float(seq_reject.mean())
    print(
        f"A/A with {looks} looks: sequential FPR {seq_fpr:.4f}, naive peeking FPR {naive_fpr:.4f}, "
        f"single final look FPR {final_fpr:.4f}"
    )
    assert seq_fpr <= ALPHA
    assert naive_fpr > 0.10
    assert FPR_BAND[0] <= final_fpr <= FPR_BAND[1]


def test_sequential_ratio_metric_with_heavy_users_stays_below_alpha_under_peeking() -> None:
    rng = np.random.default_rng(105)
    experiments, looks, batch = 1000, 20, 50

    def arm() -> list[np.ndarray]:
        requests = np.ceil(rng.lognormal(1.0, 1.5, (experiments, looks, batch)))
        x = rng.binomial(requests.astype(np.int64), rng.beta(0.6, 1.4, requests.shape)).astype(float)
        sums = (
            x.sum(2),
            (x * x).sum(2),
            requests.sum(2),
            (requests * requests).sum(2),
            (x * requests).sum(2),
        )
        return [np.cumsum(s, axis=1) for s in sums]

    control, treatment = arm(), arm()
    rejected = 0
    for e in range(experiments):
        running_p = 1.0
        for k in range(looks):
            n = (k + 1) * batch
            c = estimate(SampleStats(n, *(float(s[e, k]) for s in control)), MetricKind.RATIO)
            t = estimate(SampleStats(n, *(float(s[e, k]) for s in treatment)), MetricKind.RATIO)
            seq = sequential_lift(c, t, ALPHA, planned_units=2 * looks * batch)
            assert seq.absolute is not None
            running_p = min(running_p, seq.absolute.p_value)
        rejected += running_p <= ALPHA
    print(f"A/A heavy users, ratio metric, {looks} looks: sequential FPR {rejected / experiments:.4f}")
    assert rejected / experiments <= ALPHA
