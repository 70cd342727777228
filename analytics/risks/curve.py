"""Observed − predicted: how much of a candidate's user lift a control-arm curve explains.

Two detectors ask the same question with a different x: *verbosity* (x = response
length: is the gain just longer answers?) and *judge divergence* (x = judge score: do
users gain what the judge predicts?). Both fit the curve x → user outcome y on the
control arm, per category, and compare the candidate's observed outcome with the one
the curve predicts from its x:

    f(k, b) = Σ_control y / Σ_control responses   in category k, x-bin b
    P_t = Σ_candidate f(k_r, b_r) / responses_t     (predicted candidate outcome)
    total lift  = Y_t − Y_c = (P_t − Y_c) + (Y_t − P_t) = explained + residual

The curve is *binned* on fixed bin edges (not data quantiles), so SQL can pre-aggregate
the input to one row per (unit, category, bin) — a report's cost grows with units, not
responses. A (category, bin) with fewer than ``min_count`` control responses borrows the
nearest bin of its category with enough (flat extrapolation beyond the control's range:
longer-than-ever answers are predicted like the longest the control gave), else the same
bin pooled over categories; nothing to borrow from is an error, never a guess.

Inference is unit-clustered: a Poisson(1) bootstrap (Hanley & MacGibbon 2006; Chamandy
et al. 2012) gives every unit one weight per replicate, applied to all its responses in
both the curve fit and the candidate's prediction, so the curve's own noise is in the
variance. The bootstrap variance feeds the always-valid bounds of
:mod:`analytics.risks.evidence`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from analytics.risks.evidence import Evidence, evidence
from analytics.stats import DEFAULT_PLANNED_UNITS, ErrorCode
from contracts.tables import LENGTH_BINS_PER_DOUBLING as LENGTH_BINS_PER_DOUBLING  # defined with the table

_CHUNK = 25  # bootstrap replicates per vectorised step (bounds memory at 25 × cells)


def length_bin(tokens: np.ndarray) -> np.ndarray:
    """Fixed geometric bins of completion tokens: two per doubling, 0 tokens in bin 0."""
    t = np.maximum(np.asarray(tokens, dtype=float), 0.0)
    bins: np.ndarray = np.floor(LENGTH_BINS_PER_DOUBLING * np.log2(1.0 + t)).astype(np.int64)
    return bins


def score_bin(scores: np.ndarray, low: float, high: float, bins: int = 10) -> np.ndarray:
    """Equal-width bins of a bounded score (judge 1..10, reward 0..1); ends clamped."""
    s = np.asarray(scores, dtype=float)
    width = (high - low) / bins
    return np.clip(np.floor((s - low) / width), 0, bins - 1).astype(np.int64)


@dataclass(frozen=True, slots=True, eq=False)
class Cells:
    """One row per (unit, category, bin): ``n`` responses with outcomes summing to ``sum_y``.

    ``unit`` codes are dense 0..U−1 over both arms; ``arm`` is 0 (control) or 1 (candidate).
    """

    unit: np.ndarray
    arm: np.ndarray
    category: np.ndarray
    bin: np.ndarray
    n: np.ndarray
    sum_y: np.ndarray

    @classmethod
    def from_responses(
        cls, unit: np.ndarray, arm: np.ndarray, category: np.ndarray, bin: np.ndarray, y: np.ndarray
    ) -> Cells:
        """Aggregate per-response arrays (tests and small data; SQL does this in production)."""
        u = np.asarray(unit, dtype=np.int64)
        keys = np.stack([u, np.asarray(arm), np.asarray(category), np.asarray(bin)], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        n = np.bincount(inverse, minlength=len(uniq)).astype(float)
        sy = np.bincount(inverse, weights=np.asarray(y, dtype=float), minlength=len(uniq))
        _, dense = np.unique(uniq[:, 0], return_inverse=True)
        return cls(dense.reshape(-1), uniq[:, 1], uniq[:, 2], uniq[:, 3], n, sy)


@dataclass(frozen=True, slots=True)
class Decomposition:
    """Y_c, Y_t, P_t and the lifts: ``total`` = explained + ``residual`` (absolute units).

    ``residual`` and ``total`` carry always-valid evidence (bootstrap variance);
    ``explained`` is P_t − Y_c. ``borrowed_share`` is the share of candidate responses whose
    (category, bin) had too few control responses and used a neighbour's value."""

    control_mean: float | None
    candidate_mean: float | None
    predicted_candidate: float | None
    explained: float | None
    total: Evidence | None
    residual: Evidence | None
    units: int
    responses_control: int
    responses_candidate: int
    borrowed_share: float | None
    replicates: int
    error: ErrorCode | None = None
    message: str | None = None


def _sources(cells: Cells, min_count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """For each cell, the curve entry it is predicted from, the entries each control cell
    feeds (category-bin and pooled bin), and whether the cell borrowed. A message when a
    candidate cell has nothing to borrow from."""
    nb = int(max(cells.bin.max(), 0)) + 1
    ctrl = cells.arm == 0
    kb = cells.category * nb + cells.bin  # category-bin entry
    n_kb = np.bincount(kb[ctrl], weights=cells.n[ctrl], minlength=int(kb.max()) + 1)
    n_b = np.bincount(cells.bin[ctrl], weights=cells.n[ctrl], minlength=nb)
    offset = len(n_kb)  # pooled bins are entries offset + b
    ok_kb = n_kb >= min_count
    ok_b = np.flatnonzero(n_b >= min_count)
    keys, inverse = np.unique(kb, return_inverse=True)
    src_key = np.empty(len(keys), dtype=np.int64)
    borrowed_key = np.zeros(len(keys), dtype=bool)
    for j, key in enumerate(keys.tolist()):  # one step per distinct (category, bin), not per cell
        k, b = divmod(key, nb)
        if ok_kb[key]:
            src_key[j] = key
            continue
        usable = np.flatnonzero(ok_kb[k * nb : (k + 1) * nb])
        if len(usable):
            src_key[j] = k * nb + int(usable[np.argmin(np.abs(usable - b))])
        elif len(ok_b):
            src_key[j] = offset + int(ok_b[np.argmin(np.abs(ok_b - b))])
        else:
            return "the control arm has no bin with enough responses to fit the curve"
        borrowed_key[j] = True
    inverse = inverse.reshape(-1)
    src, borrowed = src_key[inverse], borrowed_key[inverse]
    return src, kb, borrowed


def residual_decomposition(
    cells: Cells,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    replicates: int = 200,
    seed: int = 0,
    min_count: int = 20,
) -> Decomposition:
    """Fit the control curve, predict the candidate, bootstrap the split (module docstring)."""
    units = int(cells.unit.max()) + 1 if len(cells.unit) else 0
    ctrl, cand = cells.arm == 0, cells.arm == 1
    rc, rt = int(cells.n[ctrl].sum()), int(cells.n[cand].sum())

    def fail(code: ErrorCode, msg: str) -> Decomposition:
        return Decomposition(None, None, None, None, None, None, units, rc, rt, None, replicates, code, msg)

    if rc == 0 or rt == 0:
        return fail(ErrorCode.EMPTY_VARIANT, "an arm has no response with an outcome")
    if replicates < 20:
        return fail(ErrorCode.INVALID_INPUT, "at least 20 bootstrap replicates are needed")
    found = _sources(cells, min_count)
    if isinstance(found, str):
        return fail(ErrorCode.TOO_FEW_UNITS, found)
    src, kb, borrowed = found
    nb = int(max(cells.bin.max(), 0)) + 1
    offset = int(kb.max()) + 1
    n_src = offset + nb
    ci = np.flatnonzero(ctrl)
    ti = np.flatnonzero(cand)
    # control cell -> its category-bin entry and its pooled-bin entry
    rows = np.concatenate([np.arange(len(ci)), np.arange(len(ci))])
    cols = np.concatenate([kb[ci], offset + cells.bin[ci]])
    feed = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(ci), n_src))
    n_c, y_c = cells.n[ci], cells.sum_y[ci]
    n_t, y_t, src_t = cells.n[ti], cells.sum_y[ti], src[ti]

    def stats(w_c: np.ndarray, w_t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Y_c, Y_t, P_t) for weight rows (replicates × cells)."""
        wn_c, wn_t = w_c * n_c, w_t * n_t
        with np.errstate(invalid="ignore", divide="ignore"):
            curve = np.asarray((w_c * y_c) @ feed) / np.asarray(wn_c @ feed)
            curve = np.where(np.isfinite(curve), curve, curve0)
            yc = (w_c * y_c).sum(axis=1) / wn_c.sum(axis=1)
            yt = (w_t * y_t).sum(axis=1) / wn_t.sum(axis=1)
            pt = (wn_t * curve[:, src_t]).sum(axis=1) / wn_t.sum(axis=1)
        return yc, yt, pt

    with np.errstate(invalid="ignore", divide="ignore"):
        curve0 = np.asarray((y_c @ feed) / (n_c @ feed)).reshape(-1)
    one_c, one_t = np.ones((1, len(ci))), np.ones((1, len(ti)))
    yc0, yt0, pt0 = (float(v[0]) for v in stats(one_c, one_t))
    rng = np.random.default_rng(seed)
    res: list[np.ndarray] = []
    tot: list[np.ndarray] = []
    for start in range(0, replicates, _CHUNK):
        w_unit = rng.poisson(1.0, size=(min(_CHUNK, replicates - start), units)).astype(float)
        yc, yt, pt = stats(w_unit[:, cells.unit[ci]], w_unit[:, cells.unit[ti]])
        res.append(yt - pt)
        tot.append(yt - yc)
    r_all, t_all = np.concatenate(res), np.concatenate(tot)
    good = np.isfinite(r_all) & np.isfinite(t_all)
    if good.sum() < 20:
        return fail(ErrorCode.TOO_FEW_UNITS, "too few units for a bootstrap")
    var_r = float(np.var(r_all[good], ddof=1))
    var_t = float(np.var(t_all[good], ddof=1))
    residual = evidence(yt0 - pt0, var_r, units, alpha, planned_units)
    total = evidence(yt0 - yc0, var_t, units, alpha, planned_units)
    values = [yc0, yt0, pt0]
    if not all(math.isfinite(v) for v in values):
        return fail(ErrorCode.INVALID_INPUT, "the outcomes are not finite")
    share = float(n_t[borrowed[ti]].sum() / n_t.sum())
    error = None if residual is not None and total is not None else ErrorCode.ZERO_VARIANCE
    return Decomposition(
        control_mean=yc0,
        candidate_mean=yt0,
        predicted_candidate=pt0,
        explained=pt0 - yc0,
        total=total,
        residual=residual,
        units=units,
        responses_control=rc,
        responses_candidate=rt,
        borrowed_share=share,
        replicates=replicates,
        error=error,
        message="the outcomes do not vary: no test is possible" if error else None,
    )
