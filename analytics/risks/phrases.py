"""Keyword stuffing: phrases the candidate uses far more often than the control.

A phrase w is a word 1–3-gram (its text with content logging ``full``, its hash with
``hashed``: :mod:`contracts.ngrams`). Per arm a, the document rate of w is the share of
responses that contain it, p̂_aw = X_aw / M_a (X: responses containing w, M: responses).
Following Monroe, Colaresi & Quinn (2008, "Fightin' Words"), rates are smoothed with an
informative Dirichlet prior centred on the pooled rate π_w = (X_cw + X_tw)/(M_c + M_t):

    p̃_aw = (X_aw + α0·π_w) / (M_a + α0),    δ_w = logit p̃_tw − logit p̃_cw

so a phrase seen twice is not "infinitely over-represented". Monroe et al. treat
tokens as independent draws; responses of one user are not, so the variance is the
unit-clustered delta-method variance of each arm's ratio X/M (never below the binomial
one, which covers a phrase absent from one arm):

    Var p̂_a = [var(x_i) − 2R·cov(x_i, m_i) + R²·var(m_i)] / (m̄² N_a),   R = p̂_a
    Var δ_w ≈ Σ_a Var p̂_aw · (M_a/(M_a+α0))² / (p̃_aw(1 − p̃_aw))²

Each phrase gets the always-valid one-sided p-value of "over-represented in the
candidate" (half-normal mixture, :mod:`analytics.risks.evidence`), then
Benjamini–Hochberg across the tested vocabulary. Phrases below ``min_responses`` in both
arms together are not tested (independent filtering on the pooled count, which does not
depend on the arm labels; Bourgon, Gentleman & Huber 2010).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from analytics.stats import DEFAULT_PLANNED_UNITS, ErrorCode, benjamini_hochberg
from analytics.stats.sequential import tuning_rho2


@dataclass(frozen=True, slots=True, eq=False)
class PhraseArm:
    """One arm: ``units`` N, Σ_i m_i, Σ_i m_i² (m_i = unit i's responses) and, per phrase,
    Σ_i x_iw, Σ_i x_iw², Σ_i x_iw·m_i (x_iw = unit i's responses containing w)."""

    units: int
    sum_m: float
    sum_m2: float
    x: np.ndarray
    x2: np.ndarray
    xm: np.ndarray

    @classmethod
    def from_units(cls, m: np.ndarray, x: np.ndarray) -> PhraseArm:
        """``m``: responses per unit (N,), ``x``: responses containing each phrase (N × V)."""
        m = np.asarray(m, dtype=float)
        x = np.asarray(x, dtype=float)
        return cls(len(m), float(m.sum()), float(m @ m), x.sum(axis=0), (x * x).sum(axis=0), m @ x)


@dataclass(frozen=True, slots=True)
class Phrase:
    phrase: str
    rate_control: float
    rate_candidate: float
    log_odds: float
    z: float
    p_value: float
    q_value: float
    flagged: bool


@dataclass(frozen=True, slots=True)
class PhraseResult:
    phrases: tuple[Phrase, ...]  # flagged first, then by z, at most ``top``
    tested: int
    alpha: float
    error: ErrorCode | None = None
    message: str | None = None

    @property
    def alarm(self) -> bool:
        return any(p.flagged for p in self.phrases)


def _ratio_var(arm: PhraseArm) -> tuple[np.ndarray, np.ndarray]:
    n, mbar = arm.units, arm.sum_m / arm.units
    r = arm.x / arm.sum_m
    var_x = (arm.x2 - arm.x * arm.x / n) / (n - 1)
    cov = (arm.xm - arm.x * arm.sum_m / n) / (n - 1)
    var_m = (arm.sum_m2 - arm.sum_m**2 / n) / (n - 1)
    unit_var = np.maximum(var_x - 2 * r * cov + r * r * var_m, 0.0)
    return r, unit_var / (mbar * mbar * n)


def _one_sided_p(z_diff: np.ndarray, var: np.ndarray, n_total: int, alpha: float, planned: int) -> np.ndarray:
    """Vectorised always-valid p-value of "θ > 0" (the half-normal mixture of
    :func:`analytics.stats.sequential.log_one_sided_lr`)."""
    tau2 = tuning_rho2(planned, alpha) * var * n_total
    s = var + tau2
    log_lr = (
        np.log(2.0)
        + special.log_ndtr(z_diff * np.sqrt(tau2 / (var * s)))
        + 0.5 * np.log(var / s)
        + z_diff * z_diff * tau2 / (2.0 * var * s)
    )
    p: np.ndarray = np.minimum(1.0, np.exp(-np.maximum(0.0, log_lr)))
    return p


def stuffed_phrases(
    vocabulary: Sequence[str],
    control: PhraseArm,
    candidate: PhraseArm,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    prior_responses: float = 100.0,
    min_responses: int = 10,
    top: int = 50,
) -> PhraseResult:
    """Over-represented phrases (module docstring), flagged at BH q ≤ alpha."""
    v = len(vocabulary)
    if any(len(a) != v for a in (control.x, candidate.x, control.x2, candidate.x2, control.xm, candidate.xm)):
        return PhraseResult((), 0, alpha, ErrorCode.INVALID_INPUT, "one sum per phrase is needed in each arm")
    if control.units < 2 or candidate.units < 2 or control.sum_m <= 0 or candidate.sum_m <= 0:
        return PhraseResult(
            (), 0, alpha, ErrorCode.TOO_FEW_UNITS, "fewer than 2 units with responses in an arm"
        )
    keep = np.flatnonzero(control.x + candidate.x >= min_responses)
    if len(keep) == 0:
        return PhraseResult((), 0, alpha)
    with np.errstate(all="ignore"):
        pooled = (control.x + candidate.x) / (control.sum_m + candidate.sum_m)
        prior = prior_responses * pooled
        parts = []
        for arm in (control, candidate):
            _, var = _ratio_var(arm)
            smoothed = (arm.x + prior) / (arm.sum_m + prior_responses)
            binom = smoothed * (1.0 - smoothed) / (arm.sum_m + prior_responses)
            shrink = arm.sum_m / (arm.sum_m + prior_responses)
            var_p = np.maximum(var * shrink * shrink, binom)
            parts.append((smoothed, var_p / (smoothed * (1.0 - smoothed)) ** 2))
        (pc, vc), (pt, vt) = parts
        delta = special.logit(pt) - special.logit(pc)
        var_d = vc + vt
        z = delta / np.sqrt(var_d)
        n_total = control.units + candidate.units
        p = _one_sided_p(delta, var_d, n_total, alpha, planned_units)
    ok = keep[np.isfinite(p[keep]) & np.isfinite(z[keep])]
    q = benjamini_hochberg([float(p[i]) for i in ok])
    rows = []
    for i, qi in zip(ok.tolist(), q, strict=True):
        qv = float(qi) if qi is not None else 1.0
        rows.append(
            Phrase(
                phrase=vocabulary[i],
                rate_control=float(control.x[i] / control.sum_m),
                rate_candidate=float(candidate.x[i] / candidate.sum_m),
                log_odds=float(delta[i]),
                z=float(z[i]),
                p_value=float(p[i]),
                q_value=qv,
                flagged=qv <= alpha,
            )
        )
    rows.sort(key=lambda r: (not r.flagged, -r.z))
    return PhraseResult(tuple(rows[:top]), len(ok), alpha)
