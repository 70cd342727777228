"""Mann–Whitney U test with the Hodges–Lehmann shift and its CI (Kayenta's canary judge).

For request-level samples x (control, m values) and y (treatment, n values), rank-based
and so robust to the heavy tails of latencies:

    U = R_y − n(n+1)/2        (R_y: sum of the treatment's mid-ranks in the pooled sample)
    E[U] = mn/2,  Var[U] = mn/12 · ((N+1) − Σ(t³ − t)/(N(N−1)))   (ties t, N = m + n)
    z = (U − mn/2 ∓ ½) / sqrt(Var U)                       (continuity ½, as scipy and R)

``auc`` = U/(mn) estimates P(Y > X) + ½P(Y = X). The Hodges–Lehmann shift is the median of
the mn pairwise differences y_j − x_i; its (1 − α) CI (Moses) is [D_(k), D_(mn+1−k)] with
k = ⌊mn/2 − z_{1−α/2}·sqrt(Var U) + ½⌋ — the shifts the test does not reject. Order
statistics of the mn differences are found without forming them (bisection on the value,
counting with sorted arrays: O((m+n)·log(m+n)) per step), so 10⁴ samples per arm are cheap.

``log_scale=True`` compares log values: the shift is then a log-ratio, reported as
``ratio`` = e^shift (1.3 = the treatment's typical request 30% slower), the natural scale
for latencies (a canary 30% slower is slower by a factor, not by a fixed number of ms).

:func:`mann_whitney_guardrail` is the one-sided form for rollouts with a relative margin:
H0 "the treatment is at most ``margin`` worse" is rejected when the test of the treatment
shifted back by the margin, y − log(1+margin), is significant one-sided at α.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps

from analytics.stats.errors import NUMERIC_ERRORS, Direction, ErrorCode, check_alpha, finite, numeric_message

Values = Sequence[float] | NDArray[np.float64]

#: Bisection steps for an order statistic of the pairwise differences: enough to shrink
#: any float64 range to adjacent values, after which the exact difference is picked.
_BISECTION_STEPS = 200


@dataclass(frozen=True, slots=True)
class MannWhitneyResult:
    n_control: int
    n_treatment: int
    u: float | None  # the treatment's U
    auc: float | None  # U/(mn): P(treatment > control) + ½P(tie)
    p_value: float | None  # two-sided
    shift: float | None  # Hodges–Lehmann: median of y − x (log-ratio when log_scale)
    shift_lower: float | None  # (1 − alpha) Moses CI of the shift; None when too few samples
    shift_upper: float | None
    ratio: float | None  # e^shift when log_scale (None otherwise)
    ratio_lower: float | None
    ratio_upper: float | None
    log_scale: bool
    alpha: float
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class _Prepared:
    x: NDArray[np.float64]  # sorted control
    y: NDArray[np.float64]  # sorted treatment

    @property
    def mn(self) -> int:
        return len(self.x) * len(self.y)


def _prepare(control: Values, treatment: Values, log_scale: bool) -> _Prepared | tuple[ErrorCode, str]:
    arrays = []
    for name, values in (("control", control), ("treatment", treatment)):
        a = np.asarray(values, dtype=np.float64).ravel()
        if a.size == 0:
            return ErrorCode.NO_DATA, f"{name}: no samples"
        if not np.isfinite(a).all():
            return (
                ErrorCode.INVALID_INPUT,
                f"{name}: {int((~np.isfinite(a)).sum())} samples are NaN or infinite",
            )
        if log_scale:
            if (a <= 0.0).any():
                return ErrorCode.INVALID_INPUT, f"{name}: log scale needs positive values"
            a = np.log(a)
        arrays.append(np.sort(a))
    return _Prepared(arrays[0], arrays[1])


def _u_and_variance(p: _Prepared) -> tuple[float, float]:
    m, n = len(p.x), len(p.y)
    pooled = np.concatenate([p.x, p.y])
    ranks = sps.rankdata(pooled)
    u = float(ranks[m:].sum()) - n * (n + 1) / 2.0
    big_n = m + n
    _, counts = np.unique(pooled, return_counts=True)
    ties = float((counts.astype(np.float64) ** 3 - counts).sum())
    var = m * n / 12.0 * ((big_n + 1) - ties / (big_n * (big_n - 1)))
    return u, var


def _count_at_most(p: _Prepared, t: float) -> int:
    """#{(i, j): y_j − x_i ≤ t}."""
    return int(np.searchsorted(p.y, p.x + t, side="right").sum())


def kth_difference(p: _Prepared, k: int) -> float:
    """The k-th smallest (1-based) of the pairwise differences y_j − x_i."""
    lo, hi = float(p.y[0] - p.x[-1]), float(p.y[-1] - p.x[0])
    if k <= 1:
        return lo
    if k >= p.mn:
        return hi
    lo = math.nextafter(lo, -math.inf)  # invariant: count(lo) < k ≤ count(hi)
    for _ in range(_BISECTION_STEPS):
        mid = lo + (hi - lo) / 2.0
        if mid <= lo or mid >= hi:
            break
        if _count_at_most(p, mid) >= k:
            hi = mid
        else:
            lo = mid
    # the k-th difference is the smallest difference > lo: take each row's first one
    j = np.searchsorted(p.y, p.x + lo, side="right")
    rows = j < len(p.y)
    return float((p.y[j[rows]] - p.x[rows]).min())


def _median_difference(p: _Prepared) -> float:
    mn = p.mn
    if mn % 2:
        return kth_difference(p, (mn + 1) // 2)
    return 0.5 * (kth_difference(p, mn // 2) + kth_difference(p, mn // 2 + 1))


def _moses_k(p: _Prepared, var_u: float, alpha_one_side: float) -> int:
    z = float(sps.norm.ppf(1.0 - alpha_one_side))
    return math.floor(p.mn / 2.0 - z * math.sqrt(var_u) + 0.5)


def _mann_whitney(
    control: Values, treatment: Values, alpha: float, log_scale: bool, continuity: bool, with_interval: bool
) -> MannWhitneyResult:
    def fail(code: ErrorCode, msg: str, m: int = 0, n: int = 0) -> MannWhitneyResult:
        return MannWhitneyResult(
            m, n, None, None, None, None, None, None, None, None, None, log_scale, alpha, code, msg
        )

    if (msg := check_alpha(alpha)) is not None:
        return fail(ErrorCode.INVALID_INPUT, msg)
    prep = _prepare(control, treatment, log_scale)
    if not isinstance(prep, _Prepared):
        return fail(*prep)
    m, n = len(prep.x), len(prep.y)
    u, var = _u_and_variance(prep)
    if not var > 0.0:
        return fail(ErrorCode.ZERO_VARIANCE, "all samples are equal: no ranking", m, n)
    dev = abs(u - m * n / 2.0) - (0.5 if continuity else 0.0)
    p = min(1.0, float(2.0 * sps.norm.sf(max(0.0, dev) / math.sqrt(var))))
    shift = lower = upper = None
    if with_interval:
        shift = _median_difference(prep)
        k = _moses_k(prep, var, alpha / 2.0)
        if k >= 1:
            lower, upper = kth_difference(prep, k), kth_difference(prep, prep.mn + 1 - k)
    ratio = ratio_lo = ratio_hi = None
    if log_scale and shift is not None:
        ratio = finite(math.exp(shift))
        ratio_lo = None if lower is None else finite(math.exp(lower))
        ratio_hi = None if upper is None else finite(math.exp(upper))
    return MannWhitneyResult(
        m, n, u, u / (m * n), p, finite(shift), finite(lower), finite(upper),
        ratio, ratio_lo, ratio_hi, log_scale, alpha,
    )  # fmt: skip


def mann_whitney(
    control: Values,
    treatment: Values,
    alpha: float = 0.05,
    *,
    log_scale: bool = False,
    continuity: bool = True,
    with_interval: bool = True,
) -> MannWhitneyResult:
    """Two-sided Mann–Whitney U test, Hodges–Lehmann shift of treatment − control and its CI.

    ``shift_lower``/``shift_upper`` are ``None`` (with a p-value) when the samples are too
    few for a (1 − alpha) Moses interval. ``with_interval=False`` skips the shift (simulations).
    """
    try:
        return _mann_whitney(control, treatment, alpha, log_scale, continuity, with_interval)
    except NUMERIC_ERRORS as exc:
        return MannWhitneyResult(
            0, 0, None, None, None, None, None, None, None, None, None, log_scale, alpha,
            ErrorCode.INVALID_INPUT, numeric_message(exc),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RankGuardrail:
    """One-sided rank test of harm on the log scale (relative margin), e.g. latency.

    ``harm`` is the Hodges–Lehmann ratio − 1 in the bad direction (0.3 = the candidate's
    typical request 30% slower for a ``decrease`` metric); ``harm_lower``/``harm_upper``
    its one-sided (1 − alpha) bounds; ``reject_harm`` ⇔ ``p_value_harm`` ≤ alpha.
    """

    reject_harm: bool
    noninferior: bool
    harm: float | None
    harm_lower: float | None
    harm_upper: float | None
    p_value_harm: float | None
    margin: float
    direction: Direction
    alpha: float
    n_control: int
    n_treatment: int
    error: ErrorCode | None = None
    message: str | None = None


def _one_sided_p(p: _Prepared, shift: float, continuity: bool) -> float:
    """P-value of "treatment − shift is stochastically larger than control" (one-sided)."""
    moved = _Prepared(p.x, p.y - shift)
    u, var = _u_and_variance(moved)
    if not var > 0.0:
        return 1.0
    dev = u - len(p.x) * len(p.y) / 2.0 - (0.5 if continuity else 0.0)
    return float(sps.norm.sf(dev / math.sqrt(var)))


def mann_whitney_guardrail(
    control: Values,
    treatment: Values,
    margin: float,
    direction: Direction | str = Direction.DECREASE,
    alpha: float = 0.05,
    *,
    continuity: bool = True,
    with_bounds: bool = True,
) -> RankGuardrail:
    """Is the treatment worse than control by more than ``margin`` (relative, e.g. 0.10)?

    Positive values only (latencies, token counts); compared on the log scale, so the
    margin is a ratio: harm > margin ⇔ the typical treatment value exceeds (1 + margin)×
    the control's (``decrease``: lower is better) or falls below it by the factor
    1/(1 + margin) (``increase``). Degenerate input: neither verdict, with an ``error``.
    """
    direction = Direction(direction)

    def fail(code: ErrorCode, msg: str, m: int = 0, n: int = 0) -> RankGuardrail:
        return RankGuardrail(False, False, None, None, None, None, margin, direction, alpha, m, n, code, msg)

    try:
        if (msg := check_alpha(alpha)) is not None:
            return fail(ErrorCode.INVALID_INPUT, msg)
        if not (math.isfinite(margin) and margin >= 0.0):
            return fail(ErrorCode.INVALID_INPUT, f"margin must be finite and >= 0, got {margin!r}")
        prep = _prepare(control, treatment, True)
        if not isinstance(prep, _Prepared):
            return fail(*prep)
        m, n = len(prep.x), len(prep.y)
        s = 1.0 if direction is Direction.DECREASE else -1.0
        # harm on the log scale is s·shift; test s·(y − x) against log(1 + margin)
        bad = _Prepared(np.sort(s * prep.x), np.sort(s * prep.y))
        _, var = _u_and_variance(bad)
        if not var > 0.0:
            return fail(ErrorCode.ZERO_VARIANCE, "all samples are equal: no ranking", m, n)
        log_margin = math.log1p(margin)
        p_harm = _one_sided_p(bad, log_margin, continuity)
        p_ni = _one_sided_p(_Prepared(bad.y, bad.x), -log_margin, continuity)  # mirror: x − y > −log m
        harm = lo = hi = None
        if with_bounds:
            harm = math.expm1(_median_difference(bad))
            k = _moses_k(bad, var, alpha)
            if k >= 1:
                lo = math.expm1(kth_difference(bad, k))
                hi = math.expm1(kth_difference(bad, bad.mn + 1 - k))
        return RankGuardrail(
            p_harm <= alpha, p_ni <= alpha, finite(harm), finite(lo), finite(hi), finite(p_harm),
            margin, direction, alpha, m, n,
        )  # fmt: skip
    except NUMERIC_ERRORS as exc:
        return fail(ErrorCode.INVALID_INPUT, numeric_message(exc))


def batch_quantiles(
    values: Values, batches: Sequence[int] | NDArray[np.int64], q: float, min_size: int = 20
) -> NDArray[np.float64]:
    """The q-quantile of each batch's values, for batches with at least ``min_size`` values.

    A rank test on request values compares typical requests; a tail metric (p95 latency) is
    compared, as Kayenta compares metric time series, on the p95 of each batch. With
    batches made of whole units (a hash of the unit), batch quantiles are independent
    across batches even when one unit's requests are correlated, so the rank test on them
    stays calibrated under clustering. Batches with fewer than ``min_size`` values are
    dropped (their p95 would be one or two requests).
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    b = np.asarray(batches).ravel()
    if v.shape != b.shape:
        raise ValueError("one batch id per value")
    order = np.lexsort((v, b))
    v, b = v[order], b[order]
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    ends = np.r_[starts[1:], len(b)]
    out = [float(np.quantile(v[s:e], q)) for s, e in zip(starts, ends, strict=True) if e - s >= min_size]
    return np.asarray(out, dtype=np.float64)
