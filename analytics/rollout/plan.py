"""The rollout plan: what ``experiments.rollout_plan`` (JSONB) holds, validated with reasons.

The gateway's admin API stores the plan after a shallow shape check (it may not import
analytics); this module is the authority. The controller parses the plan every time it
evaluates an experiment, and an invalid plan makes it *hold* with the reasons instead of
acting on a guess. JSON shape (every key optional; see ``docs/rollouts.md``)::

    {"stages": [1, 5, 10, 25, 50, 100],          # candidate percent per stage
     "min_duration_s": 900, "min_units": 100,     # per-stage minimums (global default)
     "stage_overrides": {"50": {"min_duration_s": 3600, "min_units": 1000}},
     "guardrails": ["error_rate", {"metric": "latency_mean", "margin": 0.1}],
     "success_metrics": ["thumbs_up_rate"],
     "on_srm": "hold", "on_complete": "promote",
     "alpha": 0.05, "interval_s": 30, "planned_units": 10000,
     "min_test_units": 30, "require_noninferiority": false}
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_STAGES: tuple[float, ...] = (1, 5, 10, 25, 50, 100)
#: Default guardrails with relative non-inferiority margins. ``latency_mean`` stands in for
#: the issue's p95 latency: quantile metrics are request-level histograms with no per-unit
#: sufficient statistics, so no always-valid unit-level test exists for them here.
DEFAULT_GUARDRAILS: tuple[tuple[str, float], ...] = (
    ("error_rate", 0.25),
    ("latency_mean", 0.10),
    ("thumbs_down_rate", 0.10),
    ("completion_tokens_per_response", 0.25),
)
DEFAULT_MARGIN = 0.10
OnSrm = Literal["hold", "rollback", "warn"]
OnComplete = Literal["promote", "hold"]


class PlanError(ValueError):
    """A plan the controller refuses to act on; the message lists the reasons."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GuardrailSpec(_Strict):
    metric: str = Field(min_length=1, max_length=128)
    # Relative: 0.25 = the candidate may be up to 25% worse than the control. None = the
    # metric catalogue's margin for a guardrail metric, else DEFAULT_MARGIN.
    margin: float | None = Field(default=None, ge=0, le=10)


class StageMinimums(_Strict):
    min_duration_s: float | None = Field(default=None, ge=0)
    min_units: int | None = Field(default=None, ge=0)


class RolloutPlan(_Strict):
    stages: tuple[float, ...] = DEFAULT_STAGES
    min_duration_s: float = Field(default=900.0, ge=0, le=30 * 86_400)
    min_units: int = Field(default=100, ge=0)
    stage_overrides: dict[str, StageMinimums] = Field(default_factory=dict)
    guardrails: tuple[GuardrailSpec, ...] | None = None
    success_metrics: tuple[str, ...] = ()
    on_srm: OnSrm = "hold"
    on_complete: OnComplete = "promote"
    # Family-wise: each of k guardrails is tested at alpha / k (Bonferroni), so the chance
    # of any false rollback over the whole rollout is at most alpha (see docs/rollouts.md).
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    interval_s: float = Field(default=30.0, ge=0, le=86_400)
    # Tunes the confidence sequences (tightest near this many units); validity holds for any.
    planned_units: int = Field(default=10_000, ge=10)
    # Units per variant before a guardrail may roll back: the tests are asymptotic (CLT).
    min_test_units: int = Field(default=30, ge=2)
    # Advance only when every guardrail is non-inferior with confidence (not merely unharmed).
    require_noninferiority: bool = False
    # "stage": guardrails compare the variants on the current stage's traffic only (the
    # gateway tags each call with its stage), so a drift over time (load, time of day, units
    # joining the candidate later) cannot pass for a difference between the variants; each
    # stage's tests then run at alpha / (k · stages) so the whole rollout keeps ≤ alpha.
    # "cumulative": every unit's totals since the rollout started (more data, confoundable).
    guardrail_window: Literal["stage", "cumulative"] = "stage"

    @field_validator("guardrails", mode="before")
    @classmethod
    def _names_to_specs(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"metric": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("stages")
    @classmethod
    def _stages(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("needs at least one stage")
        if any(not (0 < s <= 100) for s in value):
            raise ValueError("every stage is a candidate percentage in (0, 100]")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("stages must be strictly increasing")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RolloutPlan:
        known = {_pct_key(s) for s in self.stages}
        for key in self.stage_overrides:
            if _pct_key(_as_float(key)) not in known:
                raise ValueError(f"stage_overrides key {key!r} is not one of the stages {list(self.stages)}")
        names = [g.metric for g in self.guardrails or ()]
        if len(set(names)) != len(names):
            raise ValueError("a guardrail metric is listed twice")
        return self

    def guardrail_specs(self) -> tuple[GuardrailSpec, ...]:
        if self.guardrails is None:
            return tuple(GuardrailSpec(metric=m, margin=g) for m, g in DEFAULT_GUARDRAILS)
        return self.guardrails

    def stage(self, index: int) -> Stage:
        pct = self.stages[index]
        over = next(
            (o for k, o in self.stage_overrides.items() if _pct_key(_as_float(k)) == _pct_key(pct)), None
        )
        return Stage(
            index=index,
            percent=pct,
            min_duration_s=over.min_duration_s
            if over and over.min_duration_s is not None
            else self.min_duration_s,
            min_units=over.min_units if over and over.min_units is not None else self.min_units,
            last=index == len(self.stages) - 1,
        )

    def public(self) -> dict[str, Any]:
        """The plan with defaults filled in (API responses, decision evidence)."""
        data = self.model_dump(mode="json")
        data["guardrails"] = [g.model_dump(mode="json") for g in self.guardrail_specs()]
        return data


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    percent: float
    min_duration_s: float
    min_units: int
    last: bool


def _as_float(key: str) -> float:
    try:
        return float(key)
    except ValueError:
        return -1.0


def _pct_key(value: float) -> str:
    return f"{value:.6g}"


def parse_plan(raw: Any) -> RolloutPlan:
    """Validate ``experiments.rollout_plan`` (``None`` = all defaults); PlanError lists why not."""
    if raw is None:
        return RolloutPlan()
    if not isinstance(raw, dict):
        raise PlanError("rollout_plan must be a JSON object")
    try:
        return RolloutPlan.model_validate(raw)
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'rollout_plan'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise PlanError(reasons) from None
