"""Pairwise win rates of a candidate against the baseline, raw and length-controlled.

Per item the judge's verdict (asked in both orders, ``evals.scorers.judge.judge_pairwise``)
is an outcome y: 1 candidate wins, 0 baseline wins, ½ tie.

* **Win rate** = mean(y). 95% CI: Wilson score interval with the (fractional) number of
  wins over n — y's variance is at most p(1 − p), so ties make it conservative, and it
  stays inside [0, 1] when every item is won. p-value: exact two-sided sign test of wins
  against losses (ties dropped), H0: either answer equally likely to be preferred.
* **Length-controlled win rate** (the idea of AlpacaEval's LC win rate): a logistic
  regression of y (fractional response, quasi-likelihood) on the standardised length
  difference z = (len(candidate) − len(baseline)) / sd(len difference) — scaled, not
  centred — fitted by Newton-Raphson; LC = σ(θ̂), the predicted win rate at zero
  length difference. CI and p-value (H0: θ = 0) from the sandwich (robust) variance of θ̂
  with the small-sample factor n/(n − 2). A judge that simply prefers longer answers gives a
  verbose candidate a high raw win rate and an LC win rate near ½.
* Degenerate data returns a result with ``error`` set instead of raising: fewer than
  ``MIN_ITEMS`` items, or outcomes a logistic fit cannot hold (all the same, or perfectly
  separated by length) — the LC fields are then None, never a pass.
* Categories: Holm across the categories of one comparison, on each kind of p-value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

from evals.stats import holm

MIN_ITEMS = 10
Z95 = 1.959963984540054
_MAX_ITER = 50
#: |θ| beyond this means σ(θ) within 2e-9 of 0 or 1: the fit is running off to infinity
#: (separation), not converging.
_THETA_MAX = 20.0


@dataclass(frozen=True, slots=True)
class WinRate:
    n: int
    wins: int
    losses: int
    ties: int
    rate: float
    ci_low: float
    ci_high: float
    p_value: float
    lc_rate: float | None = None
    lc_low: float | None = None
    lc_high: float | None = None
    lc_p_value: float | None = None
    length_coef: float | None = None
    mean_length_diff: float = 0.0
    error: str | None = None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def wilson(successes: float, n: int) -> tuple[float, float]:
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(max(p * (1 - p), 0.0) / n + Z95**2 / (4 * n * n)) / denom
    # At 0 or n successes the bound is exactly 0 or 1 (rounding would leave 1 − 1e-16).
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


def fit_length_controlled(y: np.ndarray, z: np.ndarray) -> tuple[float, float, float] | None:
    """(θ̂, its robust standard error, β̂) of y ~ σ(θ + β z), or None when the fit diverges.
    ``z`` all zero fits the intercept alone (β = 0)."""
    n = y.size
    with_slope = bool(np.any(z != 0))
    x = np.column_stack([np.ones(n), z]) if with_slope else np.ones((n, 1))
    k = x.shape[1]
    if n <= k:
        return None
    beta = np.zeros(k)
    converged = False
    for _ in range(_MAX_ITER):
        mu = _sigmoid(x @ beta)
        w = mu * (1 - mu)
        grad = x.T @ (y - mu)
        hess = x.T @ (x * w[:, None])
        try:
            step = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            return None
        beta = beta + step
        if not np.all(np.isfinite(beta)) or abs(beta[0]) > _THETA_MAX:
            return None
        if np.max(np.abs(step)) < 1e-10:
            converged = True
            break
    if not converged:
        return None
    mu = _sigmoid(x @ beta)
    bread = np.linalg.inv(x.T @ (x * (mu * (1 - mu))[:, None]))
    resid = (y - mu)[:, None] * x
    cov = bread @ (resid.T @ resid) @ bread * n / (n - k)
    se = math.sqrt(max(float(cov[0, 0]), 0.0))
    if se == 0.0 or not math.isfinite(se):
        return None
    return float(beta[0]), se, float(beta[1]) if with_slope else 0.0


def win_rate(
    outcomes: npt.ArrayLike, candidate_lengths: npt.ArrayLike, baseline_lengths: npt.ArrayLike
) -> WinRate:
    """Raw and length-controlled win rate of the candidate (outcomes in {0, ½, 1})."""
    y = np.asarray(outcomes, dtype=float)
    d = np.asarray(candidate_lengths, dtype=float) - np.asarray(baseline_lengths, dtype=float)
    if y.size != d.size:
        raise ValueError("outcomes and lengths differ in size")
    if not np.all(np.isin(y, (0.0, 0.5, 1.0))) or not np.all(np.isfinite(d)):
        raise ValueError("outcomes must be 0, 0.5 or 1 and lengths finite")
    n = int(y.size)
    wins, losses = int(np.sum(y == 1.0)), int(np.sum(y == 0.0))
    ties = n - wins - losses
    if n == 0:
        return WinRate(0, 0, 0, 0, math.nan, math.nan, math.nan, math.nan, error="no_items")
    rate = float(y.mean())
    low, high = wilson(float(y.sum()), n)
    p = float(sps.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    base = WinRate(n, wins, losses, ties, rate, low, high, p, mean_length_diff=float(d.mean()))
    if n < MIN_ITEMS:
        return _replace_error(base, "too_few_items")
    sd = float(d.std(ddof=1))
    z = d / sd if sd > 0 else np.zeros(n)
    fit = fit_length_controlled(y, z)
    if fit is None:
        return _replace_error(base, "length_fit_diverged")
    theta, se, slope = fit
    zstat = theta / se
    return WinRate(n, wins, losses, ties, rate, low, high, p,
                   lc_rate=float(_sigmoid(np.array(theta))), lc_low=float(_sigmoid(np.array(theta - Z95 * se))),
                   lc_high=float(_sigmoid(np.array(theta + Z95 * se))),
                   lc_p_value=float(2 * sps.norm.sf(abs(zstat))), length_coef=slope,
                   mean_length_diff=float(d.mean()))  # fmt: skip


def _replace_error(w: WinRate, error: str) -> WinRate:
    return WinRate(w.n, w.wins, w.losses, w.ties, w.rate, w.ci_low, w.ci_high, w.p_value,
                   mean_length_diff=w.mean_length_diff, error=error)  # fmt: skip


@dataclass(frozen=True, slots=True)
class CategoryWinRate:
    category: str
    result: WinRate
    p_holm: float | None
    lc_p_holm: float | None


def by_category(
    groups: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
) -> list[CategoryWinRate]:
    """Per category (outcomes, candidate lengths, baseline lengths) -> win rates with
    Holm-adjusted p-values across the categories (raw and length-controlled apart)."""
    names = sorted(groups)
    results = [win_rate(*groups[c]) for c in names]
    raw = holm([None if math.isnan(r.p_value) else r.p_value for r in results])
    lc = holm([r.lc_p_value for r in results])
    return [CategoryWinRate(c, r, a, b) for c, r, a, b in zip(names, results, raw, lc, strict=True)]
