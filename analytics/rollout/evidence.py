"""The evidence for one look at a rollout stage: guardrail tests, success metrics, SRM.

Pure functions over sufficient statistics (no I/O). Each guardrail is the statistics
engine's one-sided always-valid test (:func:`analytics.stats.sequential_noninferiority`,
half-normal mixture boundary): harm h = relative lift in the bad direction; the
candidate is rolled back as soon as the always-valid lower bound of h exceeds the margin.
Because the bound is valid at every look simultaneously (Ville's inequality), checking
it every interval keeps P(any false rollback | h ≤ margin) ≤ alpha per guardrail; with k
guardrails each at alpha/k the union bound gives ≤ alpha for the whole rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from analytics.metrics import Metric
from analytics.stats import (
    Direction,
    MetricKind,
    SampleStats,
    estimate,
    sequential_lift,
    sequential_noninferiority,
    srm_check,
)

Outcome = Literal["harm", "noninferior", "inconclusive", "no_data"]


@dataclass(frozen=True, slots=True)
class GuardrailCheck:
    """One guardrail at one look; ``harm``/bounds are relative (0.1 = 10% worse)."""

    metric: str
    outcome: Outcome
    margin: float
    alpha: float
    direction: str
    n_control: int
    n_candidate: int
    control_mean: float | None = None
    candidate_mean: float | None = None
    harm: float | None = None
    lower: float | None = None
    upper: float | None = None
    p_value: float | None = None
    message: str | None = None

    def evidence(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SuccessCheck:
    """A success metric's always-valid relative lift (reported, never gating)."""

    metric: str
    n_control: int
    n_candidate: int
    lift: float | None
    lower: float | None
    upper: float | None
    p_value: float | None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class SrmLook:
    flagged: bool
    p_value: float | None
    counts: dict[str, int]
    weights: dict[str, float]
    message: str | None = None


def _kind(metric: Metric) -> MetricKind:
    return MetricKind(metric.kind)


def _direction(metric: Metric) -> Direction:
    return Direction.INCREASE if metric.direction == "higher_is_better" else Direction.DECREASE


def check_guardrail(
    metric: Metric,
    margin: float,
    control: SampleStats | None,
    candidate: SampleStats | None,
    *,
    alpha: float,
    planned_units: int,
    min_test_units: int,
) -> GuardrailCheck:
    direction = _direction(metric)
    nc, nt = (control.n if control else 0), (candidate.n if candidate else 0)
    base = {"metric": metric.name, "margin": margin, "alpha": alpha, "direction": direction.value}
    if control is None or candidate is None or min(nc, nt) < min_test_units:
        msg = f"{min(nc, nt)} units in the smaller variant; the test needs {min_test_units}"
        return GuardrailCheck(**base, outcome="no_data", n_control=nc, n_candidate=nt, message=msg)  # type: ignore[arg-type]
    ec, et = estimate(control, _kind(metric)), estimate(candidate, _kind(metric))
    res = sequential_noninferiority(ec, et, margin, direction, alpha, planned_units, relative=True)
    outcome: Outcome
    if res.error is not None:
        outcome = "no_data"
    elif res.reject_harm:
        outcome = "harm"
    elif res.noninferior:
        outcome = "noninferior"
    else:
        outcome = "inconclusive"
    return GuardrailCheck(
        **base,  # type: ignore[arg-type]
        outcome=outcome,
        n_control=nc,
        n_candidate=nt,
        control_mean=ec.mean,
        candidate_mean=et.mean,
        harm=res.harm,
        lower=res.harm_lower,
        upper=res.harm_upper,
        p_value=res.p_value_harm,
        message=res.message,
    )


def check_success(
    metric: Metric,
    control: SampleStats | None,
    candidate: SampleStats | None,
    *,
    alpha: float,
    planned_units: int,
) -> SuccessCheck:
    nc, nt = (control.n if control else 0), (candidate.n if candidate else 0)
    if control is None or candidate is None:
        return SuccessCheck(metric.name, nc, nt, None, None, None, None, "no data")
    res = sequential_lift(
        estimate(control, _kind(metric)), estimate(candidate, _kind(metric)), alpha, planned_units
    )
    rel = res.relative
    if rel is None:
        return SuccessCheck(
            metric.name, nc, nt, None, None, None, None, res.message or str(res.relative_error)
        )
    return SuccessCheck(metric.name, nc, nt, rel.estimate, rel.lower, rel.upper, rel.p_value)


def look_srm(counts: Mapping[str, int], weights: Mapping[str, float], threshold: float = 0.001) -> SrmLook:
    """χ² of units active in this stage against the stage's weights (p < ``threshold`` flags)."""
    names = list(weights)
    res = srm_check([counts.get(n, 0) for n in names], [weights[n] for n in names], threshold)
    stray = sum(v for k, v in counts.items() if k not in weights)
    if stray:
        return SrmLook(True, 0.0, dict(counts), dict(weights), f"{stray} units in unknown variants")
    return SrmLook(res.flagged, res.p_value, dict(counts), dict(weights), res.message)


def guardrail_alpha(plan_alpha: float, guardrails: Sequence[object]) -> float:
    """Bonferroni: each of k guardrails at alpha/k keeps the family-wise rate ≤ alpha."""
    return plan_alpha / max(1, len(guardrails))
