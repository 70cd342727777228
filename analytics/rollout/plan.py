"""The rollout plan: what ``experiments.rollout_plan`` (JSONB) holds, validated with reasons.

The shape and the structural rules are the shared schema of :mod:`contracts.rollout_plan`
(the admin API, ``control``, refuses a plan that breaks them when it is stored); this module
adds the behaviour the controller needs: stages with their minimums and effective percent,
the stage where promotion is decided, and the default guardrails. The controller parses
the plan at every look and holds with the reasons when it is invalid
(:func:`analytics.rollout.check.check_plan` adds the checks that need the metric catalogue).
JSON shape (every key optional; see ``docs/rollouts.md``)::

    {"stages": [1, 5, 10, 25, 50, 100],          # candidate percent per stage
     "min_duration_s": 900, "min_units": 100,     # per-stage minimums (global default)
     "stage_overrides": {"50": {"min_duration_s": 3600, "min_units": 1000}},
     "guardrails": ["error_rate", {"metric": "latency_mean", "margin": 0.1},
                    {"metric": "fallback_rate", "absolute_margin": 0.005}],
     "success_metrics": ["thumbs_up_rate"],
     "on_srm": "hold", "on_complete": "promote", "control_holdback": 0,
     "alpha": 0.05, "noninferiority_alpha": 0.05, "interval_s": 30, "planned_units": 10000,
     "min_test_units": 30, "require_noninferiority": false, "guardrail_window": "stage",
     "expected_units_per_s": null, "expected_requests_per_s": null, "baselines": {}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from contracts.rollout_plan import (
    DEFAULT_STAGES,
    GuardrailSpec,
    RolloutPlanSchema,
    StageMinimums,
    as_percent,
    pct_key,
    validation_reasons,
)

__all__ = [
    "DEFAULT_GUARDRAILS",
    "DEFAULT_STAGES",
    "GuardrailSpec",
    "PlanError",
    "RolloutPlan",
    "Stage",
    "StageMinimums",
    "parse_plan",
]

#: Default guardrails. Event rates take absolute margins (one percentage point), which stay
#: defined at a control rate of 0; means take relative ones. ``latency_mean`` stands in for
#: p95 latency: quantiles are request-level histograms with no per-unit sufficient
#: statistics, so no always-valid unit-level test exists for them here.
DEFAULT_GUARDRAILS: tuple[GuardrailSpec, ...] = (
    GuardrailSpec(metric="error_rate", absolute_margin=0.01),
    GuardrailSpec(metric="latency_mean", margin=0.10),
    GuardrailSpec(metric="thumbs_down_rate", absolute_margin=0.01),
    GuardrailSpec(metric="completion_tokens_per_response", margin=0.25),
)


class PlanError(ValueError):
    """A plan the controller refuses to act on; the message lists the reasons."""


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    percent: float  # the candidate's share in this stage (after any control holdback)
    min_duration_s: float
    min_units: int
    last: bool
    promotion: bool  # promotion is decided here (the last stage with control traffic)
    evaluated: bool  # the controller tests guardrails here (every stage up to the promotion one)


class RolloutPlan(RolloutPlanSchema):
    def guardrail_specs(self) -> tuple[GuardrailSpec, ...]:
        return DEFAULT_GUARDRAILS if self.guardrails is None else self.guardrails

    def promotion_stage(self) -> int:
        index = self.promotion_index()
        assert index is not None  # the schema refuses a plan without one
        return index

    def evaluated_stages(self) -> int:
        """How many stages test guardrails (each is a fresh family of tests with stage windows)."""
        return self.promotion_stage() + 1

    def stage(self, index: int) -> Stage:
        pct = self.percents()[index]
        over = next(
            (
                o
                for k, o in self.stage_overrides.items()
                if pct_key(as_percent(k)) == pct_key(self.stages[index])
            ),
            None,
        )
        promotion = self.promotion_stage()
        return Stage(
            index=index,
            percent=pct,
            min_duration_s=over.min_duration_s
            if over and over.min_duration_s is not None
            else self.min_duration_s,
            min_units=over.min_units if over and over.min_units is not None else self.min_units,
            last=index == len(self.stages) - 1,
            promotion=index == promotion,
            evaluated=index <= promotion,
        )

    def public(self) -> dict[str, Any]:
        """The plan with defaults filled in (API responses, decision evidence)."""
        data = self.model_dump(mode="json")
        data["guardrails"] = [g.model_dump(mode="json") for g in self.guardrail_specs()]
        data["promotion_stage"] = self.promotion_stage()
        return data


def parse_plan(raw: Any) -> RolloutPlan:
    """Validate ``experiments.rollout_plan`` (``None`` = all defaults); PlanError lists why not."""
    if raw is None:
        return RolloutPlan()
    if not isinstance(raw, dict):
        raise PlanError("rollout_plan must be a JSON object")
    try:
        return RolloutPlan.model_validate(raw)
    except ValidationError as exc:
        raise PlanError(validation_reasons(exc)) from None
