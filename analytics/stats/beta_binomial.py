"""Exact Beta–binomial model for proportions: chance to beat, risk and credible intervals.

Beside the Gaussian approximation of :mod:`analytics.stats.bayes` (GrowthBook's default), the
conjugate model many Bayesian A/B tools use for conversion rates (e.g. Evan Miller's
formulas): with a Beta(a, b) prior and e events in n trials, each arm's rate has the posterior
Beta(a + e, b + n − e), independently. Then, with X the control's rate and Y the treatment's:

    chance to beat = P(Y > X) = E_X[1 − F_Y(X)]                    (``increase``; P(Y < X) for ``decrease``)
    risk of shipping = E[max(0, X − Y)] = E_X[X·F_Y(X) − m_Y·F_{Y⁺}(X)]   (m_Y = E[Y], Y⁺ ~ Beta(α_Y+1, β_Y))
    P(Y − X ≤ d) = E_X[F_Y(X + d)],  P(Y/X − 1 ≤ r) = E_X[F_Y((1 + r)·X)]

Each expectation is a one-dimensional integral over the quantiles of the outer posterior
(256-node Gauss–Legendre in u = F(x), so a density singularity at 0 or 1 does not matter). The
NARROWER posterior is the outer one: the wider one's CDF is then smooth over its nodes (the
other way round it is a step the nodes would straddle). Credible intervals are equal-tailed,
found by root finding on these CDFs from a Gaussian bracket. Exact for any real prior (no Gaussian
approximation), checked against Evan Miller's closed form for integer parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from analytics.stats.errors import (
    NUMERIC_ERRORS,
    Direction,
    ErrorCode,
    check_alpha,
    check_finite,
    finite,
    numeric_message,
)

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(256)
_U = 0.5 * (_NODES + 1.0)  # quantile levels in (0, 1)
_W = 0.5 * _WEIGHTS


@dataclass(frozen=True, slots=True)
class BetaPrior:
    """Beta(a, b) prior on each arm's rate (default uniform; Jeffreys is a = b = 0.5)."""

    a: float = 1.0
    b: float = 1.0


@dataclass(frozen=True, slots=True)
class BetaBinomialResult:
    chance_to_beat_control: float | None
    risk_treatment: float | None  # expected loss (rate points) if the treatment is shipped
    risk_control: float | None  # expected loss if the control is kept
    control_rate: float | None  # posterior means
    treatment_rate: float | None
    lower: float | None  # (1 − alpha) equal-tailed credible interval of p_t − p_c
    upper: float | None
    relative_lower: float | None  # … of p_t/p_c − 1
    relative_upper: float | None
    alpha: float
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class _Posterior:
    a: float
    b: float

    @property
    def mean(self) -> float:
        return self.a / (self.a + self.b)

    @property
    def sd(self) -> float:
        s = self.a + self.b
        return math.sqrt(self.a * self.b / (s * s * (s + 1.0)))

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(special.betainc(self.a, self.b, np.clip(x, 0.0, 1.0)), dtype=np.float64)

    def nodes(self) -> np.ndarray:
        return np.asarray(special.betaincinv(self.a, self.b, _U), dtype=np.float64)


def _risk(outer: _Posterior, xs: np.ndarray, inner: _Posterior, outer_is_x: bool) -> float:
    """E[max(0, X − Y)] with the nodes ``xs`` of the outer posterior."""
    plus = _Posterior(inner.a + 1.0, inner.b)
    if outer_is_x:  # E_X[X·F_Y(X) − m_Y·F_{Y+}(X)]
        vals = xs * inner.cdf(xs) - inner.mean * plus.cdf(xs)
    else:  # E_Y[m_X·S_{X+}(Y) − Y·S_X(Y)]
        vals = inner.mean * (1.0 - plus.cdf(xs)) - xs * (1.0 - inner.cdf(xs))
    return float(_W @ vals)


def _quantile(
    cdf: Callable[[float], float], level: float, guess: float, step: float, lo: float, hi: float
) -> float:
    """The ``level`` quantile of a CDF on [lo, hi], bracketed from a Gaussian ``guess``."""
    a = b = min(hi, max(lo, guess))
    step = step if step > 0.0 else 1e-6
    for _ in range(200):  # widen until bracketed: a few steps from a Gaussian guess
        if cdf(a) <= level:
            break
        a = max(lo, a - step)
        step *= 2.0
    step = max(step / 2.0, 1e-6)
    for _ in range(200):
        if cdf(b) >= level:
            break
        b = min(hi, b + step)
        step *= 2.0
    return float(optimize.brentq(lambda d: cdf(d) - level, a, b, xtol=1e-10))


def _beta_binomial(
    control_events: float,
    control_trials: float,
    treatment_events: float,
    treatment_trials: float,
    direction: Direction,
    prior: BetaPrior,
    alpha: float,
    with_intervals: bool,
) -> BetaBinomialResult:
    def fail(code: ErrorCode, msg: str) -> BetaBinomialResult:
        return BetaBinomialResult(None, None, None, None, None, None, None, None, None, alpha, code, msg)

    if (msg := check_alpha(alpha)) is not None:
        return fail(ErrorCode.INVALID_INPUT, msg)
    named = {
        "control_events": control_events, "control_trials": control_trials,
        "treatment_events": treatment_events, "treatment_trials": treatment_trials,
        "prior.a": prior.a, "prior.b": prior.b,
    }  # fmt: skip
    if (msg := check_finite(**named)) is not None:
        return fail(ErrorCode.INVALID_INPUT, msg)
    if prior.a <= 0.0 or prior.b <= 0.0:
        return fail(ErrorCode.INVALID_INPUT, "the prior's a and b must be > 0")
    for name, e, n in (
        ("control", control_events, control_trials),
        ("treatment", treatment_events, treatment_trials),
    ):
        if not 0.0 <= e <= n:
            return fail(ErrorCode.INVALID_INPUT, f"{name}: {e:g} events in {n:g} trials is not a proportion")
        if n == 0.0:
            return fail(ErrorCode.EMPTY_VARIANT, f"{name}: no trials")
    x = _Posterior(prior.a + control_events, prior.b + control_trials - control_events)
    y = _Posterior(prior.a + treatment_events, prior.b + treatment_trials - treatment_events)
    x_outer = x.sd <= y.sd
    outer, inner = (x, y) if x_outer else (y, x)
    nodes = outer.nodes()
    p_y_gt_x = float(_W @ (1.0 - inner.cdf(nodes))) if x_outer else float(_W @ inner.cdf(nodes))
    risk_x_minus_y = _risk(outer, nodes, inner, x_outer)  # E[max(0, X − Y)]
    risk_y_minus_x = risk_x_minus_y + (y.mean - x.mean)  # E[max(0, Y − X)] = E[max(0, X − Y)] + E[Y − X]

    lo = hi = r_lo = r_hi = None
    if with_intervals:
        lo, hi, r_lo, r_hi = _intervals(x, y, nodes, x_outer, alpha)
    if direction is Direction.INCREASE:
        beat, risk_t, risk_c = p_y_gt_x, risk_x_minus_y, risk_y_minus_x
    else:
        beat, risk_t, risk_c = 1.0 - p_y_gt_x, risk_y_minus_x, risk_x_minus_y
    return BetaBinomialResult(
        finite(min(1.0, max(0.0, beat))), finite(max(0.0, risk_t)), finite(max(0.0, risk_c)),
        finite(x.mean), finite(y.mean), finite(lo), finite(hi), finite(r_lo), finite(r_hi), alpha,
    )  # fmt: skip


def _intervals(
    x: _Posterior, y: _Posterior, nodes: np.ndarray, x_outer: bool, alpha: float
) -> tuple[float, float, float | None, float | None]:
    """Equal-tailed credible intervals of Y − X and Y/X − 1 (the latter ``None`` if unbounded)."""

    def diff_cdf(d: float) -> float:  # P(Y − X ≤ d)
        if x_outer:
            return float(_W @ y.cdf(nodes + d))
        return float(_W @ (1.0 - x.cdf(nodes - d)))

    def ratio_cdf(r: float) -> float:  # P(Y/X − 1 ≤ r)
        if x_outer:
            return float(_W @ y.cdf((1.0 + r) * nodes))
        return float(_W @ (1.0 - x.cdf(nodes / (1.0 + r))))

    z = float(special.ndtri(1.0 - alpha / 2.0))
    d_mean, d_sd = y.mean - x.mean, math.hypot(x.sd, y.sd)
    lo = _quantile(diff_cdf, alpha / 2.0, d_mean - z * d_sd, d_sd, -1.0, 1.0)
    hi = _quantile(diff_cdf, 1.0 - alpha / 2.0, d_mean + z * d_sd, d_sd, -1.0, 1.0)
    r_lo = r_hi = None
    if ratio_cdf(1e12) > 1.0 - alpha / 2.0:  # the relative lift is bounded at this level
        r_mean = y.mean / x.mean - 1.0
        r_sd = math.hypot(y.sd / x.mean, y.mean * x.sd / x.mean**2)
        r_lo = _quantile(ratio_cdf, alpha / 2.0, r_mean - z * r_sd, r_sd, -1.0 + 1e-15, 1e12)
        r_hi = _quantile(ratio_cdf, 1.0 - alpha / 2.0, r_mean + z * r_sd, r_sd, -1.0 + 1e-15, 1e12)
    return lo, hi, r_lo, r_hi


def beta_binomial(
    control_events: float,
    control_trials: float,
    treatment_events: float,
    treatment_trials: float,
    direction: Direction | str = Direction.INCREASE,
    prior: BetaPrior | None = None,
    alpha: float = 0.05,
    *,
    with_intervals: bool = True,
) -> BetaBinomialResult:
    """Exact Beta–binomial comparison of two proportions (module doc). Trials are the
    randomisation units (one 0/1 outcome each): per-request events of correlated units
    belong in the delta-method analyses instead. ``with_intervals=False`` skips the credible
    intervals' root finding (simulations)."""
    try:
        return _beta_binomial(
            control_events, control_trials, treatment_events, treatment_trials,
            Direction(direction), prior or BetaPrior(), alpha, with_intervals,
        )  # fmt: skip
    except NUMERIC_ERRORS as exc:
        return BetaBinomialResult(
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            alpha,
            ErrorCode.INVALID_INPUT,
            numeric_message(exc),
        )
