"""Group-sequential designs: Lan–DeMets alpha spending with a few planned looks.

An alternative to the always-valid mode of :mod:`analytics.stats.sequential`: when the
looks are few and planned (``sequential: {mode: group, spending: obrien_fleming,
looks: 5}``) a spending function buys tighter boundaries than a confidence sequence.

With information fraction t ∈ (0, 1] (units so far / planned units) and a one-sided level
a, the cumulative type-I error spent by t is (Lan & DeMets 1983; gsDesign's sfLDOF and
sfLDPocock):

    O'Brien–Fleming type:  α(t) = 2 − 2·Φ(z_{1−a/2} / √t)
    Pocock type:           α(t) = a · ln(1 + (e − 1)·t)

Look k's boundary c_k solves P_H0(Z_1 < c_1, …, Z_{k−1} < c_{k−1}, Z_k ≥ c_k) = α(t_k) − α(t_{k−1}),
where Z_k = B(t_k)/√t_k for a Brownian motion B (the canonical joint distribution, Jennison
& Turnbull 2000 ch. 3). The probabilities are integrated numerically over a grid
(Armitage, McPherson & Rowe 1969), look after look. A two-sided test at level α uses
a = α/2 on each side (symmetric boundaries ±c_k). The boundaries of look k depend only on
the fractions of looks 1..k, so unplanned timing is fine; at t ≥ 1 all α is spent.

At look k: reject H0 when |Z_k| ≥ c_k (``nominal_alpha`` = the per-look p-value threshold);
the repeated confidence interval θ̂ ± c_k·SE covers θ at every look simultaneously with
probability ≥ 1 − α (Jennison & Turnbull 1989). The one-sided non-inferiority form tests
the guardrail contrast D(margin) of :mod:`analytics.stats.harm` against c_k at level a.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

import numpy as np
from scipy import optimize
from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, check_alpha, finite, numeric_message
from analytics.stats.estimate import MetricKind, VariantEstimate
from analytics.stats.harm import HarmContrast, flip_point
from analytics.stats.lift import Interval, precheck, relative_variance
from analytics.stats.rate import RateContrast, rate_contrast
from analytics.stats.sufficient import SampleStats

#: Grid points per unit of Brownian-motion scale (√t): boundaries to ~1e-8 (Simpson).
_GRID_PER_SD = 40
#: How far below the boundary the continuation region's grid reaches, in sd of B(t).
_GRID_SDS = 9.0


class Spending(StrEnum):
    OBRIEN_FLEMING = "obrien_fleming"
    POCOCK = "pocock"


def spent(t: float, a: float, spending: Spending | str) -> float:
    """Cumulative one-sided alpha spent by information fraction ``t`` at level ``a``."""
    if t <= 0.0:
        return 0.0
    t = min(1.0, t)
    if Spending(spending) is Spending.OBRIEN_FLEMING:
        return float(2.0 - 2.0 * sps.norm.cdf(sps.norm.ppf(1.0 - a / 2.0) / math.sqrt(t)))
    return a * math.log(1.0 + (math.e - 1.0) * t)


def _simpson_weights(n: int, h: float) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * h / 3.0


def _grid(lo: float, hi: float, sd: float) -> tuple[np.ndarray, np.ndarray]:
    n = max(101, int((hi - lo) / sd * _GRID_PER_SD)) | 1  # odd, for Simpson
    g = np.linspace(lo, hi, n)
    return g, _simpson_weights(n, (hi - lo) / (n - 1))


def _crossing(
    c: float, t: float, prior: tuple[np.ndarray, np.ndarray] | None, dt: float, two_sided: bool
) -> float:
    """P(cross look k's boundary c, one side, having continued so far). ``prior``: the grid of
    B(t_{k−1}) and its weighted sub-density; ``None`` at the first look."""
    if prior is None:
        return float(sps.norm.sf(c))
    g, wd = prior
    b, sd = c * math.sqrt(t), math.sqrt(dt)
    up = float(wd @ sps.norm.sf((b - g) / sd))
    if two_sided:  # symmetric: average the two sides
        up = 0.5 * (up + float(wd @ sps.norm.cdf((-b - g) / sd)))
    return up


def _excess(
    c: float, t: float, prior: tuple[np.ndarray, np.ndarray] | None, dt: float, two_sided: bool, target: float
) -> float:
    return _crossing(c, t, prior, dt, two_sided) - target


@lru_cache(maxsize=256)
def boundaries(
    fractions: tuple[float, ...], alpha: float, spending: Spending, two_sided: bool
) -> tuple[float, ...]:
    """Critical |z| per look (see the module doc); ``inf`` where a look spends nothing."""
    a = alpha / 2.0 if two_sided else alpha
    out: list[float] = []
    prior: tuple[np.ndarray, np.ndarray] | None = None  # B(t) grid, weights × sub-density
    grid = np.zeros(0)
    prev_t = 0.0
    for t in fractions:
        target = spent(t, a, spending) - spent(prev_t, a, spending)
        dt = t - prev_t
        c = math.inf
        if target > 0.0:
            args = (t, prior, dt, two_sided, target)
            c = float(optimize.brentq(_excess, -10.0, 40.0, args=args, xtol=1e-10))
        out.append(c)
        # sub-density of B(t) where the test continued
        top = c * math.sqrt(t) if math.isfinite(c) else _GRID_SDS * math.sqrt(t)
        bottom = -top if two_sided else -_GRID_SDS * math.sqrt(t)
        new_grid, new_w = _grid(bottom, top, math.sqrt(t))
        if prior is None:
            dens = sps.norm.pdf(new_grid / math.sqrt(t)) / math.sqrt(t)
        else:
            sd = math.sqrt(dt)
            u = (new_grid[:, None] - grid[None, :]) / sd
            dens = (np.exp(-0.5 * u * u) / (sd * math.sqrt(2.0 * math.pi))) @ prior[1]
        grid, prior = new_grid, (new_grid, new_w * dens)
        prev_t = t
    return tuple(out)


@dataclass(frozen=True, slots=True)
class GroupSequentialDesign:
    fractions: tuple[float, ...]
    z_bounds: tuple[float | None, ...]  # |z| to cross at each look (None: nothing spent there)
    nominal_alpha: tuple[float, ...]  # per-look p-value threshold (two-sided when two_sided)
    cumulative_alpha: tuple[float, ...]  # total alpha spent by each look
    alpha: float
    spending: Spending
    two_sided: bool
    error: ErrorCode | None = None
    message: str | None = None


def _check_fractions(fractions: Sequence[float]) -> str | None:
    if not fractions:
        return "no look yet"
    prev = 0.0
    for i, t in enumerate(fractions):
        if not math.isfinite(t) or t <= prev:
            return f"information fractions must be finite and increasing from 0, look {i + 1} has {t!r}"
        prev = t
    return None


def group_sequential_design(
    fractions: Sequence[float],
    alpha: float = 0.05,
    spending: Spending | str = Spending.OBRIEN_FLEMING,
    two_sided: bool = True,
) -> GroupSequentialDesign:
    """Boundaries for looks at information ``fractions`` (e.g. (0.2, 0.4, 0.6, 0.8, 1.0)).

    Fractions above 1 (more units than planned) count as 1: the look spends what is left.
    """
    spending = Spending(spending)

    def fail(msg: str) -> GroupSequentialDesign:
        return GroupSequentialDesign(
            (),  # the bad input is named in the message, never echoed as NaN
            (),
            (),
            (),
            alpha,
            spending,
            two_sided,
            ErrorCode.INVALID_INPUT,
            msg,
        )

    if (msg := check_alpha(alpha) or _check_fractions(fractions)) is not None:
        return fail(msg)
    capped = tuple(min(1.0, float(t)) for t in fractions)
    if len(set(capped)) != len(capped):
        return fail("more than one look at or beyond the planned information (t >= 1)")
    try:
        return _design(capped, float(alpha), spending, two_sided)
    except NUMERIC_ERRORS as exc:
        return fail(numeric_message(exc))


@lru_cache(maxsize=1024)
def _design(
    capped: tuple[float, ...], alpha: float, spending: Spending, two_sided: bool
) -> GroupSequentialDesign:
    # cached whole: a report or a simulation asks for the same few designs again and again
    zs = boundaries(capped, alpha, spending, two_sided)
    a = alpha / 2.0 if two_sided else alpha
    sides = 2.0 if two_sided else 1.0
    nominal = tuple(float(sides * sps.norm.sf(z)) for z in zs)
    cumulative = tuple(sides * spent(t, a, spending) for t in capped)
    bounds = tuple(z if math.isfinite(z) else None for z in zs)
    return GroupSequentialDesign(capped, bounds, nominal, cumulative, alpha, spending, two_sided)


@dataclass(frozen=True, slots=True)
class GroupSequentialResult:
    """Look k of a two-sided group-sequential test of the lift.

    ``reject`` ⇔ |z| ≥ ``z_bound`` ⇔ the repeated CI excludes 0 (absolute lift).
    """

    look: int
    reject: bool
    z: float | None
    z_bound: float | None
    nominal_alpha: float | None
    absolute: (
        Interval | None
    )  # repeated CI at this look; p_value = fixed-horizon p (compare to nominal_alpha)
    relative: Interval | None
    design: GroupSequentialDesign
    error: ErrorCode | None = None
    message: str | None = None


def _repeated(est: float, var: float, c: float | None) -> Interval | None:
    """θ̂ ± c·SE; ``None`` at a look that spends no alpha (the interval is unbounded)."""
    se = math.sqrt(var)
    if c is None or not se > 0.0:
        return None
    p = float(2.0 * sps.norm.sf(abs(est) / se))
    vals = [finite(v) for v in (est, se, est - c * se, est + c * se, p)]
    if any(v is None for v in vals):
        return None
    e, s, lo, hi, pv = (float(v) for v in vals if v is not None)
    return Interval(e, s, lo, hi, min(1.0, pv))


def group_sequential_lift(
    control: VariantEstimate,
    treatment: VariantEstimate,
    fractions: Sequence[float],
    alpha: float = 0.05,
    spending: Spending | str = Spending.OBRIEN_FLEMING,
) -> GroupSequentialResult:
    """Two-sided test and repeated CIs at the latest look (``fractions[-1]``)."""
    design = group_sequential_design(fractions, alpha, spending, two_sided=True)
    k = len(fractions)

    def fail(code: ErrorCode, msg: str) -> GroupSequentialResult:
        return GroupSequentialResult(k, False, None, None, None, None, None, design, code, msg)

    if design.error is not None:
        return fail(design.error, design.message or "")
    try:
        if (bad := precheck(control, treatment, alpha)) is not None:
            return fail(*bad)
        mc, mt = float(control.mean or 0.0), float(treatment.mean or 0.0)
        var = (control.variance or 0.0) + (treatment.variance or 0.0)
        c = design.z_bounds[-1]
        z = (mt - mc) / math.sqrt(var)
        absolute = _repeated(mt - mc, var, c)
        relative = None
        if mc != 0.0 and (rv := relative_variance(control, treatment)) > 0.0:
            relative = _repeated((mt - mc) / abs(mc), rv, c)
        reject = c is not None and abs(z) >= c
        return GroupSequentialResult(
            k, reject, finite(z), c, design.nominal_alpha[-1], absolute, relative, design
        )
    except NUMERIC_ERRORS as exc:
        return fail(ErrorCode.INVALID_INPUT, numeric_message(exc))


@dataclass(frozen=True, slots=True)
class GroupSequentialGuardrail:
    """One-sided group-sequential guardrail at look k (same fields as the always-valid one).

    ``reject_harm`` ⇔ D(margin)/SE ≥ c_k ⇔ ``harm_lower`` > margin (roll back, at ``alpha``);
    ``noninferior`` ⇔ −D(margin)/SE ≥ c'_k ⇔ ``harm_upper`` < margin, with c'_k the boundary
    of the same spending at ``alpha_noninferiority`` (default ``alpha``). ``p_value_harm`` is
    the look's nominal one-sided p of "harm > margin": compare it with ``nominal_alpha``.
    """

    look: int
    reject_harm: bool
    noninferior: bool
    harm: float | None
    harm_lower: float | None
    harm_upper: float | None
    z_bound: float | None
    nominal_alpha: float | None
    margin: float
    relative: bool
    direction: Direction
    design: GroupSequentialDesign
    error: ErrorCode | None = None
    message: str | None = None
    p_value_harm: float | None = None
    z_bound_noninferiority: float | None = None
    nominal_alpha_noninferiority: float | None = None
    alpha_noninferiority: float | None = None


class _Contrast(Protocol):
    """What the one-sided test needs of a harm contrast (:class:`HarmContrast`, :class:`RateContrast`)."""

    @property
    def harm(self) -> float: ...
    @property
    def scale(self) -> float: ...
    def at(self, m: float) -> tuple[float, float]: ...


def _one_sided(
    contrast: _Contrast,
    margin: float,
    relative: bool,
    direction: Direction,
    design: GroupSequentialDesign,
    ni_design: GroupSequentialDesign,
    edges: tuple[float, float] | None,
) -> GroupSequentialGuardrail:
    """Both one-sided verdicts and bounds at the latest look of ``design``/``ni_design``."""
    k = len(design.fractions)
    c, c_ni = design.z_bounds[-1], ni_design.z_bounds[-1]
    d, v = contrast.at(margin)
    ni_fields = (c_ni, ni_design.nominal_alpha[-1], ni_design.alpha)
    if not v > 0.0:
        return GroupSequentialGuardrail(
            k, False, False, finite(contrast.harm), None, None, c, design.nominal_alpha[-1], margin,
            relative, direction, design, ErrorCode.ZERO_VARIANCE, "the contrast's variance is 0", None,
            *ni_fields,
        )  # fmt: skip
    p = float(sps.norm.sf(d / math.sqrt(v)))

    def z_at(m: float, sign: float, bound: float) -> float:
        dm, vm = contrast.at(m)
        return sign * dm / math.sqrt(vm) - bound if vm > 0.0 else -bound

    def bound(sign: float, cb: float | None) -> float | None:
        if cb is None:  # a look that spends nothing: the bound is unbounded
            return None

        def f(m: float) -> float:
            return z_at(m, sign, cb)

        if edges is None:
            return flip_point(f, contrast.harm, contrast.scale, -sign)
        lo, hi = edges
        h = min(hi, max(lo, contrast.harm))
        end = lo if sign > 0 else hi
        if f(end) < 0.0:
            return end
        return float(optimize.brentq(f, min(h, end), max(h, end), xtol=1e-12))

    return GroupSequentialGuardrail(
        k, c is not None and z_at(margin, +1.0, c) >= 0.0, c_ni is not None and z_at(margin, -1.0, c_ni) >= 0.0,
        finite(contrast.harm), finite(bound(+1.0, c)), finite(bound(-1.0, c_ni)), c, design.nominal_alpha[-1],
        margin, relative, direction, design, None, None, finite(p), *ni_fields,
    )  # fmt: skip


def _guardrail_setup(
    fractions: Sequence[float],
    alpha: float,
    alpha_noninferiority: float | None,
    spending: Spending | str,
    margin: float,
    relative: bool,
    direction: Direction,
) -> tuple[
    GroupSequentialDesign, GroupSequentialDesign, Callable[[ErrorCode, str], GroupSequentialGuardrail]
]:
    """The harm and non-inferiority designs of a group-sequential guardrail, and its failure."""
    a_ni = alpha if alpha_noninferiority is None else alpha_noninferiority
    design = group_sequential_design(fractions, alpha, spending, two_sided=False)
    ni_design = group_sequential_design(fractions, a_ni, spending, two_sided=False)

    def fail(code: ErrorCode, msg: str) -> GroupSequentialGuardrail:
        return GroupSequentialGuardrail(
            len(fractions), False, False, None, None, None, None, None, margin, relative, direction, design,
            code, msg, alpha_noninferiority=a_ni,
        )  # fmt: skip

    return design, ni_design, fail


def group_sequential_noninferiority(
    control: VariantEstimate,
    treatment: VariantEstimate,
    margin: float,
    direction: Direction | str,
    fractions: Sequence[float],
    alpha: float = 0.05,
    spending: Spending | str = Spending.OBRIEN_FLEMING,
    relative: bool = True,
    alpha_noninferiority: float | None = None,
) -> GroupSequentialGuardrail:
    """One-sided test of "worse than control by more than ``margin``" at the latest look
    (the Fieller contrast of :mod:`analytics.stats.harm`; relative or absolute margin)."""
    direction = Direction(direction)
    design, ni_design, fail = _guardrail_setup(
        fractions, alpha, alpha_noninferiority, spending, margin, relative, direction
    )
    for d in (design, ni_design):
        if d.error is not None:
            return fail(d.error, d.message or "")
    try:
        if (bad := precheck(control, treatment, alpha)) is not None:
            return fail(*bad)
        if not (math.isfinite(margin) and margin >= 0.0):
            return fail(ErrorCode.INVALID_INPUT, "margin must be finite and >= 0")
        if relative and control.mean == 0.0:
            return fail(ErrorCode.ZERO_CONTROL_MEAN, "relative margin with a control mean of 0")
        hc = HarmContrast.of(control, treatment, direction, relative)
        return _one_sided(hc, margin, relative, direction, design, ni_design, None)
    except NUMERIC_ERRORS as exc:
        return fail(ErrorCode.INVALID_INPUT, numeric_message(exc))


def group_sequential_rate_noninferiority(
    control: SampleStats,
    treatment: SampleStats,
    margin: float,
    direction: Direction | str,
    fractions: Sequence[float],
    alpha: float = 0.05,
    spending: Spending | str = Spending.OBRIEN_FLEMING,
    *,
    kind: MetricKind | str = MetricKind.RATIO,
    alpha_noninferiority: float | None = None,
) -> GroupSequentialGuardrail:
    """The group-sequential form of :func:`analytics.stats.sequential_rate_noninferiority`:
    the score statistic of the rate difference at an absolute ``margin`` (variance from the
    rates restricted to harm = margin, so defined at a control rate of 0) against c_k."""
    direction = Direction(direction)
    design, ni_design, fail = _guardrail_setup(
        fractions, alpha, alpha_noninferiority, spending, margin, False, direction
    )
    for d in (design, ni_design):
        if d.error is not None:
            return fail(d.error, d.message or "")
    if not (math.isfinite(margin) and 0.0 <= margin < 1.0):
        return fail(ErrorCode.INVALID_INPUT, "a rate margin must lie in [0, 1)")
    try:
        contrast = rate_contrast(control, treatment, kind, direction)
        if not isinstance(contrast, RateContrast):
            return fail(*contrast)
        return _one_sided(contrast, margin, False, direction, design, ni_design, (-1.0 + 1e-9, 1.0 - 1e-9))
    except NUMERIC_ERRORS as exc:
        return fail(ErrorCode.INVALID_INPUT, numeric_message(exc))
