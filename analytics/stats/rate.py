"""Rate guardrails: an always-valid one-sided score test on the difference of two event rates.

For a guardrail on a rate of 0/1 events — errors, fallbacks or thumbs-down per request, or
the share of units with an event — and an ABSOLUTE margin δ (0.01 = one percentage point):

    harm h = s·(p_t − p_c)          s = +1 when fewer events are better, −1 otherwise
    H0: h ≤ δ (at most δ worse)     H1: h > δ (roll back)

The statistic D(δ) = s·(p̂_t − p̂_c) − δ is standardised by its variance evaluated *under
H0*, at the restricted maximum-likelihood rates (p̃_t, p̃_c) with s·(p̃_t − p̃_c) = δ
(Farrington & Manning 1990, the closed-form root of the likelihood cubic). At a
control rate of 0 the control's observed variance is 0 — a Wald test, and any relative
margin, is undefined there — while the null variance is not: a 30%-error candidate against
an error-free baseline is detected from a few dozen requests. (statsmodels'
``score_test_proportions_2indep(compare="diff")`` solves a differently arranged cubic whose
root is not always the likelihood maximum; the tests compare both with a numerical maximum.)

Units (users) are the randomisation unit and one user's requests are correlated, so each
arm contributes the larger of its observed unit-level (delta-method) variance and its
binomial variance under H0 (n = trials, e.g. requests):

    V(δ) = Σ_arm max( Var̂(p̂_arm), p̃_arm·(1 − p̃_arm) / n_arm )

The observed term carries the clustering (design effect) once events are seen; the null
term keeps the test defined, and conservative against a small observed variance, when
they are not.

D(δ) and V(δ) enter the normal-mixture always-valid framework of
:mod:`analytics.stats.sequential` (half-normal mixture over the alternative, τ² = ρ²·V·N tuned
at ``planned_units``): H0 is rejected at a look when Λ⁺(D, V) ≥ 1/α, and by Ville's inequality
P(any false rejection over all looks) ≤ α (asymptotically). Non-inferiority (H0': h ≥ δ) is
the mirror test of −D(δ) at ``alpha_noninferiority``; the always-valid bounds of h are the
margins at which each test flips (found by root finding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import optimize

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, finite, numeric_message
from analytics.stats.estimate import MetricKind, estimate
from analytics.stats.sequential import (
    DEFAULT_PLANNED_UNITS,
    SequentialGuardrail,
    log_one_sided_lr,
    tuning_rho2,
)
from analytics.stats.sufficient import SampleStats

#: Harm of a rate lies in (−1, 1); bounds are searched inside it.
_EDGE = 1e-9


@dataclass(frozen=True, slots=True)
class RateArm:
    """One variant's rate: events over trials, with the observed variance of that rate."""

    units: int
    events: float
    trials: float
    observed_variance: float

    @property
    def rate(self) -> float:
        return self.events / self.trials


def rate_arm(stats: SampleStats, kind: MetricKind | str) -> RateArm | tuple[ErrorCode, str]:
    """The rate of a ``ratio`` (events x over trials y per unit) or ``proportion`` (0/1 per
    unit) metric, or the reason it is not a rate of 0/1 events."""
    kind = MetricKind(kind)
    if stats.n < 2:
        return ErrorCode.TOO_FEW_UNITS, "fewer than 2 units"
    if kind is MetricKind.PROPORTION:
        events, trials = stats.sum_x, float(stats.n)
        if abs(stats.sum_x2 - stats.sum_x) > 1e-9 * max(1.0, stats.sum_x):
            return ErrorCode.INVALID_INPUT, "per-unit values are not 0/1"
    elif kind is MetricKind.RATIO:
        events, trials = stats.sum_x, stats.sum_y
    else:
        return ErrorCode.INVALID_INPUT, "a rate test needs a ratio or proportion metric"
    if not (math.isfinite(events) and math.isfinite(trials)):
        return ErrorCode.INVALID_INPUT, "the sums are not finite"
    if not trials > 0.0:
        return ErrorCode.ZERO_DENOMINATOR, "no trials (the rate's denominator sums to 0)"
    if events < 0.0 or events > trials * (1.0 + 1e-12):
        return ErrorCode.INVALID_INPUT, (
            f"{events:g} events in {trials:g} trials: not a rate of 0/1 events (use a mean-based guardrail)"
        )
    est = estimate(stats, kind)
    if est.variance is None:
        return est.error or ErrorCode.INVALID_INPUT, est.message or "no variance"
    return RateArm(stats.n, events, trials, est.variance)


def restricted_rates(
    events_t: float, trials_t: float, events_c: float, trials_c: float, diff: float
) -> tuple[float, float]:
    """Maximum-likelihood (p_t, p_c) under p_t − p_c = ``diff`` (|diff| < 1), binomial arms.

    Farrington & Manning's (1990) closed-form root of the likelihood equation's cubic; a
    bracketed root of the (monotone) profile score where the closed form leaves the domain.
    """
    if diff == 0.0:
        pooled = (events_t + events_c) / (trials_t + trials_c)
        return pooled, pooled
    p1, p2 = events_t / trials_t, events_c / trials_c
    theta = trials_c / trials_t
    a = 1.0 + theta
    b = -(1.0 + theta + p1 + theta * p2 + diff * (theta + 2.0))
    c = diff * diff + diff * (2.0 * p1 + theta + 1.0) + p1 + theta * p2
    d = -p1 * diff * (1.0 + diff)
    try:
        v = b**3 / (3.0 * a) ** 3 - b * c / (6.0 * a * a) + d / (2.0 * a)
        u = math.copysign(math.sqrt(b * b / (3.0 * a) ** 2 - c / (3.0 * a)), v)
        w = (math.pi + math.acos(max(-1.0, min(1.0, v / u**3)))) / 3.0
        pc = 2.0 * u * math.cos(w) - b / (3.0 * a) - diff
    except (ArithmeticError, ValueError):
        pc = math.nan
    lo, hi = max(0.0, -diff), min(1.0, 1.0 - diff)
    if not (lo - 1e-9 <= pc <= hi + 1e-9):
        pc = _profile_root(events_t, trials_t, events_c, trials_c, diff, lo, hi)
    pc = min(hi, max(lo, pc))
    return pc + diff, pc


def _profile_root(et: float, nt: float, ec: float, nc: float, diff: float, lo: float, hi: float) -> float:
    """argmax of the profile log-likelihood in p_c on [lo, hi] (it is concave)."""

    def score(pc: float) -> float:
        pt = pc + diff
        out = 0.0
        if et > 0.0:
            out += et / pt
        if nt - et > 0.0:
            out -= (nt - et) / (1.0 - pt)
        if ec > 0.0:
            out += ec / pc
        if nc - ec > 0.0:
            out -= (nc - ec) / (1.0 - pc)
        return out

    a, b = lo + 1e-12, hi - 1e-12
    if a >= b:
        return lo
    fa, fb = score(a), score(b)
    if fa <= 0.0:
        return lo
    if fb >= 0.0:
        return hi
    return float(optimize.brentq(score, a, b, xtol=1e-15))


@dataclass(frozen=True, slots=True)
class RateContrast:
    """The harm contrast of two rates; ``at(m)`` gives (D(m), V(m)) with V under h = m."""

    treatment: RateArm
    control: RateArm
    s: float  # +1: fewer events are better (errors); −1: more events are better

    @property
    def harm(self) -> float:
        return self.s * (self.treatment.rate - self.control.rate)

    def at(self, m: float) -> tuple[float, float]:
        t, c = self.treatment, self.control
        pt, pc = restricted_rates(t.events, t.trials, c.events, c.trials, self.s * m)
        vt = max(t.observed_variance, pt * (1.0 - pt) / t.trials)
        vc = max(c.observed_variance, pc * (1.0 - pc) / c.trials)
        return self.harm - m, vt + vc

    @property
    def scale(self) -> float:
        """A rough standard error of the harm (at the observed rates)."""
        return math.sqrt(self.treatment.observed_variance + self.control.observed_variance)


def rate_contrast(
    control: SampleStats, treatment: SampleStats, kind: MetricKind | str, direction: Direction
) -> RateContrast | tuple[ErrorCode, str]:
    """The harm contrast of two arms' rates, or (code, reason) naming the arm that has none."""
    arms = []
    for name, stats in (("control", control), ("treatment", treatment)):
        arm = rate_arm(stats, kind)
        if not isinstance(arm, RateArm):
            return arm[0], f"{name}: {arm[1]}"
        arms.append(arm)
    return RateContrast(arms[1], arms[0], 1.0 if direction is Direction.DECREASE else -1.0)


def _evidence(
    contrast: RateContrast, m: float, sign: float, alpha: float, n_total: int, planned: int
) -> float:
    """log Λ⁺ − log(1/α) for "h > m" (sign +1) or "h < m" (sign −1); ≥ 0 rejects."""
    target = math.log(1.0 / alpha)
    d, v = contrast.at(m)
    if not v > 0.0:  # both arms at 0 or 1 with the boundary there: no variance, no evidence
        return -target
    tau2 = tuning_rho2(planned, alpha) * v * n_total
    return log_one_sided_lr(sign * d, v, tau2) - target


def _bound(f: object, start: float, end: float) -> float:
    """The margin between ``start`` (f < 0) and ``end`` where f crosses 0; ``end`` when it never does."""
    assert callable(f)
    if f(end) < 0.0:
        return end
    return float(optimize.brentq(f, min(start, end), max(start, end), xtol=1e-12))


def _sequential_rate_noninferiority(
    control: SampleStats,
    treatment: SampleStats,
    margin: float,
    direction: Direction | str,
    alpha: float,
    planned_units: int,
    kind: MetricKind | str,
    alpha_noninferiority: float | None,
    with_bounds: bool,
) -> SequentialGuardrail:
    direction = Direction(direction)
    a_ni = alpha if alpha_noninferiority is None else alpha_noninferiority
    n = control.n + treatment.n

    def fail(code: ErrorCode, msg: str) -> SequentialGuardrail:
        return SequentialGuardrail(
            False, False, None, None, None, None, margin, False, direction, alpha, n, code, msg, a_ni
        )

    if not (0.0 < alpha < 1.0 and 0.0 < a_ni < 1.0):
        return fail(ErrorCode.INVALID_INPUT, "alpha must lie in (0, 1)")
    if not (0.0 <= margin < 1.0) or planned_units < 1:
        return fail(ErrorCode.INVALID_INPUT, "a rate margin must lie in [0, 1) and planned_units be >= 1")
    contrast = rate_contrast(control, treatment, kind, direction)
    if not isinstance(contrast, RateContrast):
        return fail(*contrast)
    harm_side = _evidence(contrast, margin, +1.0, alpha, n, planned_units)
    ni_side = _evidence(contrast, margin, -1.0, a_ni, n, planned_units)
    d, v = contrast.at(margin)
    p = 1.0
    if v > 0.0:
        tau2 = tuning_rho2(planned_units, alpha) * v * n
        p = min(1.0, math.exp(-max(0.0, log_one_sided_lr(d, v, tau2))))
    harm = contrast.harm
    lower = upper = None
    if with_bounds:
        lo_edge, hi_edge = -1.0 + _EDGE, 1.0 - _EDGE
        h = min(hi_edge, max(lo_edge, harm))
        lower = _bound(lambda m: _evidence(contrast, m, +1.0, alpha, n, planned_units), h, lo_edge)
        upper = _bound(lambda m: _evidence(contrast, m, -1.0, a_ni, n, planned_units), h, hi_edge)
    return SequentialGuardrail(
        harm_side >= 0.0,
        ni_side >= 0.0,
        finite(harm),
        finite(lower),
        finite(upper),
        finite(p),
        margin,
        False,
        direction,
        alpha,
        n,
        alpha_noninferiority=a_ni,
    )


def sequential_rate_noninferiority(
    control: SampleStats,
    treatment: SampleStats,
    margin: float,
    direction: Direction | str,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    *,
    kind: MetricKind | str = MetricKind.RATIO,
    alpha_noninferiority: float | None = None,
    with_bounds: bool = True,
) -> SequentialGuardrail:
    """Always-valid one-sided test of "the treatment's event rate is worse by more than
    ``margin``" (absolute difference), valid at a control rate of 0 (see the module doc).

    ``reject_harm`` at level ``alpha`` (roll back), ``noninferior`` at level
    ``alpha_noninferiority`` (default ``alpha``); ``harm_lower``/``harm_upper`` are the
    matching always-valid bounds of the harm (``with_bounds=False`` skips their root finding,
    for simulations). Degenerate input gives neither, with an ``error``: the caller holds.
    """
    try:
        return _sequential_rate_noninferiority(
            control,
            treatment,
            margin,
            direction,
            alpha,
            planned_units,
            kind,
            alpha_noninferiority,
            with_bounds,
        )
    except NUMERIC_ERRORS as exc:
        a_ni = alpha if alpha_noninferiority is None else alpha_noninferiority
        return SequentialGuardrail(
            False, False, None, None, None, None, margin, False, Direction(direction), alpha,
            control.n + treatment.n, ErrorCode.INVALID_INPUT, numeric_message(exc), a_ni,
        )  # fmt: skip
