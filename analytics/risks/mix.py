"""Category mix per arm: a candidate must not change which tasks it is credited with.

The category is assigned before treatment (from what the user sent), so both arms see
the same mix in expectation; a difference means the tagging, the assignment or the
logging depends on the treatment (a candidate that makes users ask differently shows
up here too) and per-category comparisons are then biased.

Requests of one unit are correlated, so the shares are ratio metrics over units. Per
arm, with n_ik = unit i's requests in category k and n_i = Σ_k n_ik:

    p̂_k = Σ_i n_ik / Σ_i n_i,   L_ik = (n_ik − p̂_k·n_i) / n̄          (delta method)
    Cov(p̂) = Cov(L) / N,  Cov(L)_kl = [C_kl − p̂_l·C_k· − p̂_k·C_l· + p̂_k p̂_l·C··] / n̄²

where C is the covariance matrix of the per-unit counts. The Wald statistic on the first
K−1 shares, W = dᵀ(V_c + V_t)⁻¹d with d = p̂_t − p̂_c, is χ²(K−1) under equal mixes;
flagged at p < 0.001 like the sample-ratio check (Fabijan et al. 2019), because a
mismatch invalidates the matrix rather than describing the candidate.

Sufficient statistics per arm: the number of units N, Σ_i n_ik (vector) and
Σ_i n_ik·n_il (matrix) — one SQL aggregate over per-unit category counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from analytics.stats import SRM_THRESHOLD, ErrorCode
from analytics.stats.errors import finite


@dataclass(frozen=True, slots=True)
class MixStats:
    """One arm: ``units``, ``sums[k]`` = Σ_i n_ik and ``cross[k][l]`` = Σ_i n_ik·n_il."""

    units: int
    sums: tuple[float, ...]
    cross: tuple[tuple[float, ...], ...]

    @classmethod
    def from_counts(cls, counts: np.ndarray) -> MixStats:
        """From a (units × categories) matrix of request counts (tests, small data)."""
        m = np.asarray(counts, dtype=float)
        return cls(
            units=int(m.shape[0]),
            sums=tuple(float(v) for v in m.sum(axis=0)),
            cross=tuple(tuple(float(v) for v in row) for row in m.T @ m),
        )


@dataclass(frozen=True, slots=True)
class CategoryShare:
    category: str
    control: float | None
    candidate: float | None
    difference: float | None
    std_error: float | None


@dataclass(frozen=True, slots=True)
class MixResult:
    shares: tuple[CategoryShare, ...]
    flagged: bool
    p_value: float | None
    chi2: float | None
    dof: int
    threshold: float
    error: ErrorCode | None = None
    message: str | None = None


def _share_cov(arm: MixStats) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(arm.sums, dtype=float)
    q = np.asarray(arm.cross, dtype=float)
    n = arm.units
    total = s.sum()
    p = s / total
    mean = s / n
    cov = (q - n * np.outer(mean, mean)) / (n - 1)  # Cov(n_k, n_l)
    row = cov.sum(axis=1)  # Cov(n_k, n_·)
    var_tot = row.sum()
    cov_l = cov - np.outer(row, p) - np.outer(p, row) + np.outer(p, p) * var_tot
    nbar = total / n
    return p, cov_l / (nbar * nbar) / n


def category_mix(
    categories: Sequence[str],
    control: MixStats,
    candidate: MixStats,
    threshold: float = SRM_THRESHOLD,
) -> MixResult:
    """The Wald test of equal category mixes (module docstring); degenerate input gives
    ``flagged=False`` with an ``error`` (the report shows the check could not run)."""
    k = len(categories)

    def fail(code: ErrorCode, msg: str) -> MixResult:
        return MixResult((), False, None, None, 0, threshold, code, msg)

    if len(control.sums) != k or len(candidate.sums) != k or k == 0:
        return fail(ErrorCode.INVALID_INPUT, "one sum per category is needed in each arm")
    if control.units < 2 or candidate.units < 2 or sum(control.sums) <= 0 or sum(candidate.sums) <= 0:
        return fail(ErrorCode.TOO_FEW_UNITS, "fewer than 2 units with requests in an arm")
    with np.errstate(all="ignore"):
        pc, vc = _share_cov(control)
        pt, vt = _share_cov(candidate)
    if not (np.all(np.isfinite(vc)) and np.all(np.isfinite(vt))):
        return fail(ErrorCode.INVALID_INPUT, "the sums are not finite")
    d = pt - pc
    v = vc + vt
    shares = tuple(
        CategoryShare(
            categories[i],
            finite(pc[i]),
            finite(pt[i]),
            finite(d[i]),
            finite(float(np.sqrt(max(v[i, i], 0.0)))),
        )
        for i in range(k)
    )
    # Categories seen in neither arm carry no information; the shares sum to 1, so one
    # more is dropped (the last seen one) to make the covariance invertible.
    seen = [i for i in range(k) if pc[i] > 0.0 or pt[i] > 0.0]
    if len(seen) < 2:
        return MixResult(shares, False, 1.0, 0.0, 0, threshold)
    keep = seen[:-1]
    dk, vk = d[keep], v[np.ix_(keep, keep)]
    if np.any(np.diag(vk) <= 0.0):
        # A category present in one arm only, with no variance to weigh it: a mismatch
        # as certain as a unit in a variant with weight 0 (the SRM convention).
        return MixResult(
            shares, True, 0.0, None, len(keep), threshold, message="a category appears in one arm only"
        )
    chi2 = float(dk @ np.linalg.lstsq(vk, dk, rcond=None)[0])
    dof = int(np.linalg.matrix_rank(vk))
    p = finite(float(sps.chi2.sf(chi2, dof))) if dof > 0 else 1.0
    p = 0.0 if p is None else p
    return MixResult(shares, p < threshold, p, finite(chi2), dof, threshold)
