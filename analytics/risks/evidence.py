"""Always-valid evidence for one estimate with a known variance: the shared last step of
every RL-risk detector.

A detector reduces its data to an estimate θ̂ (a residual lift, a correlation drop, a
log-odds ratio) and a variance V (delta method or a unit-clustered bootstrap). The report
is refreshed continuously, so each one-sided test uses the half-normal mixture SPRT of
:mod:`analytics.stats.sequential` — valid under any number of looks, not only at the end:

    Λ⁺(θ0) = 2·Φ((θ̂−θ0)·τ/sqrt(V(V+τ²)))·sqrt(V/(V+τ²))·exp((θ̂−θ0)²τ²/(2V(V+τ²)))
    p(H0: θ ≤ θ0) = min(1, 1/Λ⁺),   lower bound = θ̂ − d with Λ⁺(d) = 1/α,

with τ² = ρ²·V·N tuned for ``planned_units`` N* (Howard et al. 2021). "Is θ below θ0"
is the same test on −θ̂.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analytics.stats.errors import NUMERIC_ERRORS, finite
from analytics.stats.sequential import (
    DEFAULT_PLANNED_UNITS,
    log_one_sided_lr,
    mixture_halfwidth,
    one_sided_halfwidth,
    tuning_rho2,
)


@dataclass(frozen=True, slots=True)
class Evidence:
    """θ̂ with its standard error, a two-sided always-valid interval at level alpha, and
    the always-valid one-sided p-values of "θ > θ0" (``p_above``) and "θ < θ0" (``p_below``).
    ``upper_one_sided``/``lower_one_sided`` are the one-sided bounds at level alpha."""

    estimate: float
    std_error: float
    lower: float
    upper: float
    lower_one_sided: float
    upper_one_sided: float
    p_above: float
    p_below: float
    null: float


def _tau2(variance: float, n_total: int, alpha: float, planned_units: int) -> float:
    return tuning_rho2(planned_units, alpha) * variance * max(1, n_total)


def evidence(
    estimate: float,
    variance: float,
    n_total: int,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    null: float = 0.0,
) -> Evidence | None:
    """The always-valid summary of (θ̂, V); ``None`` when V is not positive or a number
    is not finite (the caller reports the reason: no evidence is never a pass)."""
    if not (math.isfinite(estimate) and math.isfinite(variance) and variance > 0.0 and 0.0 < alpha < 1.0):
        return None
    try:
        tau2 = _tau2(variance, n_total, alpha, planned_units)
        hw = mixture_halfwidth(variance, tau2, alpha)
        d1 = one_sided_halfwidth(variance, tau2, alpha)
        diff = estimate - null
        p_above = min(1.0, math.exp(-max(0.0, log_one_sided_lr(diff, variance, tau2))))
        p_below = min(1.0, math.exp(-max(0.0, log_one_sided_lr(-diff, variance, tau2))))
    except NUMERIC_ERRORS:
        return None
    values = [finite(v) for v in (estimate, math.sqrt(variance), estimate - hw, estimate + hw)]
    if any(v is None for v in values):
        return None
    return Evidence(
        estimate=float(estimate),
        std_error=math.sqrt(variance),
        lower=float(estimate - hw),
        upper=float(estimate + hw),
        lower_one_sided=float(estimate - d1),
        upper_one_sided=float(estimate + d1),
        p_above=p_above,
        p_below=p_below,
        null=null,
    )
