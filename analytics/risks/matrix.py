"""The capability matrix: did the candidate get worse at some kind of task (forgetting)?

For every category k (the gateway's pre-treatment task tag) and metric m, the lift of the
candidate over the control and a one-sided harm test:

    harm h = s·(m_t − m_c)   (s = +1 for a ``decrease`` metric, −1 for an ``increase`` one)
    H0: h ≤ margin_m   vs   H1: h > margin_m

with the always-valid half-normal mixture p-value of
:func:`analytics.stats.sequential_noninferiority` (continuous monitoring is the normal
use of a report). Two corrections, for two uses:

* **decisions** (``harmed``, guardrail ``breached``): Holm across the categories of one
  metric — the family-wise error "some category is flagged although none is worse" stays
  ≤ α per metric whatever the number of categories;
* **exploration** (``q_value``): Benjamini–Hochberg across every cell of the matrix.

Small categories are noisy, so the display also shows an empirical-Bayes estimate: the
lifts of one metric across categories are shrunk towards their precision-weighted mean
with the between-category variance τ² of DerSimonian & Laird (1986):

    μ̂ = Σ w_k y_k / Σ w_k,  w_k = 1/se_k²,  Q = Σ w_k (y_k − μ̂)²
    τ̂² = max(0, (Q − (K−1)) / (Σw − Σw²/Σw)),  B_k = se_k²/(se_k² + τ̂²)
    shrunk_k = μ̂* + (1 − B_k)(y_k − μ̂*),  sd_k = se_k·sqrt(1 − B_k)

(μ̂* re-weighted with 1/(se_k² + τ̂²); Efron & Morris 1975). Shrinkage is for display
only; decisions use the unshrunk tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from analytics.stats import (
    DEFAULT_PLANNED_UNITS,
    Direction,
    ErrorCode,
    MetricKind,
    SampleStats,
    SequentialGuardrail,
    VariantEstimate,
    benjamini_hochberg,
    estimate,
    holm,
    sequential_noninferiority,
)


@dataclass(frozen=True, slots=True)
class MatrixInput:
    """One cell's per-unit sufficient statistics, per arm, for units that sent at least one
    request of ``category`` (their requests of that category only)."""

    category: str
    metric: str
    direction: Direction
    kind: MetricKind
    control: SampleStats
    candidate: SampleStats


@dataclass(frozen=True, slots=True)
class Guardrail:
    """ "No category worse than ``margin`` on ``metric``" (relative to the control mean, or
    absolute in metric units)."""

    metric: str
    margin: float
    relative: bool = True


@dataclass(frozen=True, slots=True)
class MatrixCell:
    category: str
    metric: str
    direction: Direction
    n_control: int
    n_candidate: int
    control_mean: float | None
    candidate_mean: float | None
    lift: float | None  # absolute, candidate − control
    lift_std_error: float | None
    harm: float | None  # the lift in the bad direction (absolute)
    p_value_harm: float | None  # always-valid, H0: harm ≤ 0
    p_holm: float | None  # Holm across the categories of this metric
    q_value: float | None  # BH across the whole matrix
    harmed: bool  # p_holm ≤ alpha
    shrunk_lift: float | None
    shrunk_std_error: float | None
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class GuardrailCheck:
    metric: str
    category: str
    margin: float
    relative: bool
    harm: float | None  # on the margin's scale
    harm_lower: float | None
    p_value: float | None  # always-valid, H0: harm ≤ margin
    p_holm: float | None
    breached: bool
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class CapabilityMatrix:
    cells: tuple[MatrixCell, ...]
    guardrails: tuple[GuardrailCheck, ...]
    alpha: float
    harmed_categories: tuple[tuple[str, str], ...]  # (metric, category), Holm-significant harm
    breached: tuple[tuple[str, str], ...]  # (metric, category) over a declared margin

    @property
    def alarm(self) -> bool:
        return bool(self.breached or self.harmed_categories)


def shrink(
    lifts: Sequence[float | None], std_errors: Sequence[float | None]
) -> list[tuple[float, float] | None]:
    """DerSimonian–Laird empirical-Bayes shrinkage (see the module docstring)."""
    present = [
        (i, y, s)
        for i, (y, s) in enumerate(zip(lifts, std_errors, strict=True))
        if y is not None and s is not None and s > 0.0 and math.isfinite(y) and math.isfinite(s)
    ]
    out: list[tuple[float, float] | None] = [None] * len(lifts)
    if not present:
        return out
    idx = [i for i, _, _ in present]
    y = [float(yi) for _, yi, _ in present]
    v = [float(si) ** 2 for _, _, si in present]
    w = [1.0 / vi for vi in v]
    sw = sum(w)
    mu = sum(wi * yi for wi, yi in zip(w, y, strict=True)) / sw
    q = sum(wi * (yi - mu) ** 2 for wi, yi in zip(w, y, strict=True))
    denom = sw - sum(wi * wi for wi in w) / sw
    tau2 = max(0.0, (q - (len(y) - 1)) / denom) if denom > 0.0 else 0.0
    w_star = [1.0 / (vi + tau2) for vi in v]
    mu_star = sum(wi * yi for wi, yi in zip(w_star, y, strict=True)) / sum(w_star)
    for i, yi, vi in zip(idx, y, v, strict=True):
        keep = tau2 / (tau2 + vi)  # 1 − B_k
        out[i] = (mu_star + keep * (yi - mu_star), math.sqrt(vi * keep))
    return out


@dataclass(frozen=True, slots=True)
class _Tested:
    cell: MatrixInput
    control: VariantEstimate
    candidate: VariantEstimate
    test: SequentialGuardrail
    lift: float | None
    se: float | None


def _test(cell: MatrixInput, alpha: float, planned_units: int) -> _Tested:
    c, t = estimate(cell.control, cell.kind), estimate(cell.candidate, cell.kind)
    g = sequential_noninferiority(c, t, 0.0, cell.direction, alpha, planned_units, relative=False)
    lift = se = None
    if c.ok and t.ok:
        lift = float(t.mean or 0.0) - float(c.mean or 0.0)
        se = math.sqrt(float(c.variance or 0.0) + float(t.variance or 0.0))
    return _Tested(cell, c, t, g, lift, se)


def capability_matrix(
    inputs: Sequence[MatrixInput],
    guardrails: Sequence[Guardrail] = (),
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
) -> CapabilityMatrix:
    """Per category × metric lifts, harm tests, corrections and shrinkage (module docstring)."""
    tested = [_test(cell, alpha, planned_units) for cell in inputs]
    q_values = benjamini_hochberg([r.test.p_value_harm for r in tested])
    p_holm: list[float | None] = [None] * len(tested)
    shrunk: list[tuple[float, float] | None] = [None] * len(tested)
    for metric in dict.fromkeys(cell.metric for cell in inputs):
        members = [i for i, cell in enumerate(inputs) if cell.metric == metric]
        for i, p in zip(members, holm([tested[i].test.p_value_harm for i in members]), strict=True):
            p_holm[i] = p
        shrunk_m = shrink([tested[i].lift for i in members], [tested[i].se for i in members])
        for i, s in zip(members, shrunk_m, strict=True):
            shrunk[i] = s
    cells: list[MatrixCell] = []
    for r, ph, q, sh in zip(tested, p_holm, q_values, shrunk, strict=True):
        cells.append(
            MatrixCell(
                category=r.cell.category,
                metric=r.cell.metric,
                direction=r.cell.direction,
                n_control=r.cell.control.n,
                n_candidate=r.cell.candidate.n,
                control_mean=r.control.mean,
                candidate_mean=r.candidate.mean,
                lift=r.lift,
                lift_std_error=r.se,
                harm=r.test.harm,
                p_value_harm=r.test.p_value_harm,
                p_holm=ph,
                q_value=q,
                harmed=ph is not None and ph <= alpha,
                shrunk_lift=sh[0] if sh is not None else None,
                shrunk_std_error=sh[1] if sh is not None else None,
                error=r.test.error,
                message=r.test.message,
            )
        )
    checks = _guardrails(inputs, guardrails, alpha, planned_units)
    return CapabilityMatrix(
        cells=tuple(cells),
        guardrails=checks,
        alpha=alpha,
        harmed_categories=tuple((c.metric, c.category) for c in cells if c.harmed),
        breached=tuple((g.metric, g.category) for g in checks if g.breached),
    )


def _guardrails(
    inputs: Sequence[MatrixInput], guardrails: Sequence[Guardrail], alpha: float, planned_units: int
) -> tuple[GuardrailCheck, ...]:
    """Per declared guardrail, every category tested against its margin, Holm across them.

    A category whose test cannot run (no units, zero variance, a relative margin on a
    control mean of 0) is reported with its error and never counts as a pass: the
    controller treats a guardrail with an error as "hold"."""
    out: list[GuardrailCheck] = []
    for gr in guardrails:
        members = [cell for cell in inputs if cell.metric == gr.metric]
        results = []
        for cell in members:
            c, t = estimate(cell.control, cell.kind), estimate(cell.candidate, cell.kind)
            results.append(
                sequential_noninferiority(
                    c, t, gr.margin, cell.direction, alpha, planned_units, relative=gr.relative
                )
            )
        adjusted = holm([r.p_value_harm for r in results])
        for cell, r, ph in zip(members, results, adjusted, strict=True):
            out.append(
                GuardrailCheck(
                    metric=gr.metric,
                    category=cell.category,
                    margin=gr.margin,
                    relative=gr.relative,
                    harm=r.harm,
                    harm_lower=r.harm_lower,
                    p_value=r.p_value_harm,
                    p_holm=ph,
                    breached=ph is not None and ph <= alpha,
                    error=r.error,
                    message=r.message,
                )
            )
    return tuple(out)
