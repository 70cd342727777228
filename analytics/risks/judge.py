"""Judge vs users (the Goodhart alarm): does the candidate win its judge but not its users?

* **Divergence** — calibrate judge score → user outcome on the control arm (binned curve
  per category, :mod:`analytics.risks.curve`), predict the candidate's user outcome from
  its judge scores, and test one-sided whether the judge-predicted user lift exceeds the
  observed one: D = P_t − Y_t = −residual, H0: D ≤ 0, always-valid with a unit-clustered
  bootstrap variance. Alarm text: "the judge says +X, users say +Y" with X = P_t − Y_c
  and Y = Y_t − Y_c.
* **Correlation drop** — the response-level correlation of judge score and user outcome
  on each arm, compared on Fisher's z scale: Δ = atanh(r_c) − atanh(r_t), H0: Δ ≤ 0, with a
  Poisson bootstrap over units for Var Δ (responses of one unit are not independent).

Each alarm fires on an honest candidate (judge as calibrated on both arms) with
probability ≤ α.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analytics.risks.curve import Cells, Decomposition, residual_decomposition
from analytics.risks.evidence import Evidence, evidence
from analytics.stats import DEFAULT_PLANNED_UNITS, ErrorCode

_CHUNK = 50


@dataclass(frozen=True, slots=True, eq=False)
class PairMoments:
    """Per unit of one arm, over its judged responses with an outcome: count, Σs, Σy, Σs²,
    Σy², Σsy (s = judge score, y = user outcome). Rows are units."""

    n: np.ndarray
    s: np.ndarray
    y: np.ndarray
    ss: np.ndarray
    yy: np.ndarray
    sy: np.ndarray

    @classmethod
    def from_responses(cls, unit: np.ndarray, s: np.ndarray, y: np.ndarray) -> PairMoments:
        _, u = np.unique(np.asarray(unit), return_inverse=True)
        u = u.reshape(-1)
        s, y = np.asarray(s, dtype=float), np.asarray(y, dtype=float)

        def add(w: np.ndarray | None) -> np.ndarray:
            return np.bincount(u, weights=w)

        return cls(add(None).astype(float), add(s), add(y), add(s * s), add(y * y), add(s * y))

    def matrix(self) -> np.ndarray:
        return np.stack([self.n, self.s, self.y, self.ss, self.yy, self.sy], axis=1)


def _corr(t: np.ndarray) -> np.ndarray:
    """Correlations from total rows (…, 6) = (n, Σs, Σy, Σs², Σy², Σsy)."""
    n, s, y, ss, yy, sy = (t[..., i] for i in range(6))
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = sy - s * y / n
        r: np.ndarray = cov / np.sqrt((ss - s * s / n) * (yy - y * y / n))
    return r


@dataclass(frozen=True, slots=True)
class CorrelationDrop:
    control: float | None
    candidate: float | None
    drop: Evidence | None  # on Fisher's z scale: atanh(r_c) − atanh(r_t)
    dropped: bool
    error: ErrorCode | None = None
    message: str | None = None


def correlation_drop(
    control: PairMoments,
    candidate: PairMoments,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    replicates: int = 400,
    seed: int = 0,
) -> CorrelationDrop:
    mc, mt = control.matrix(), candidate.matrix()
    if len(mc) < 2 or len(mt) < 2:
        return CorrelationDrop(
            None, None, None, False, ErrorCode.TOO_FEW_UNITS, "fewer than 2 units in an arm"
        )
    rc, rt = float(_corr(mc.sum(axis=0))), float(_corr(mt.sum(axis=0)))
    if not (math.isfinite(rc) and math.isfinite(rt)) or max(abs(rc), abs(rt)) >= 1.0:
        return CorrelationDrop(
            None, None, None, False, ErrorCode.ZERO_VARIANCE, "scores or outcomes do not vary in an arm"
        )
    rng = np.random.default_rng(seed)
    draws: list[np.ndarray] = []
    for start in range(0, replicates, _CHUNK):
        b = min(_CHUNK, replicates - start)
        zc = np.arctanh(_corr(rng.poisson(1.0, (b, len(mc))) @ mc))
        zt = np.arctanh(_corr(rng.poisson(1.0, (b, len(mt))) @ mt))
        draws.append(zc - zt)
    d = np.concatenate(draws)
    d = d[np.isfinite(d)]
    ev = None
    if len(d) >= 20:
        ev = evidence(
            math.atanh(rc) - math.atanh(rt), float(np.var(d, ddof=1)), len(mc) + len(mt), alpha, planned_units
        )
    if ev is None:
        return CorrelationDrop(rc, rt, None, False, ErrorCode.ZERO_VARIANCE, "no bootstrap variance")
    return CorrelationDrop(rc, rt, ev, ev.p_above <= alpha)


@dataclass(frozen=True, slots=True)
class JudgeDivergence:
    decomposition: Decomposition
    judge_says: float | None  # judge-predicted user lift, P_t − Y_c
    users_say: float | None  # observed user lift, Y_t − Y_c
    divergence: Evidence | None  # P_t − Y_t
    diverged: bool
    correlation: CorrelationDrop | None
    alpha: float

    @property
    def alarm(self) -> bool:
        return self.diverged or bool(self.correlation and self.correlation.dropped)

    @property
    def summary(self) -> str | None:
        if self.judge_says is None or self.users_say is None:
            return None
        return f"the judge says {self.judge_says:+.4g}, users say {self.users_say:+.4g}"


def judge_divergence(
    cells: Cells,
    pairs: tuple[PairMoments, PairMoments] | None = None,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    replicates: int = 200,
    seed: int = 0,
) -> JudgeDivergence:
    """``cells`` binned on the judge score (:func:`analytics.risks.curve.score_bin`);
    ``pairs`` (control, candidate) for the correlation check, when available."""
    dec = residual_decomposition(cells, alpha, planned_units, replicates, seed)
    corr = correlation_drop(pairs[0], pairs[1], alpha, planned_units, seed=seed) if pairs else None
    div = None
    if dec.residual is not None:
        r = dec.residual
        # the same evidence with the sign flipped: D = −residual
        div = evidence(-r.estimate, r.std_error**2, dec.units, alpha, planned_units)
    judge_says = users_say = None
    if dec.error is None and dec.total is not None:
        judge_says, users_say = dec.explained, dec.total.estimate
    return JudgeDivergence(
        decomposition=dec,
        judge_says=judge_says,
        users_say=users_say,
        divergence=div,
        diverged=div is not None and div.p_above <= alpha,
        correlation=corr,
        alpha=alpha,
    )
