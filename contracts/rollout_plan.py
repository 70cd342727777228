"""The shape of a rollout plan (``experiments.rollout_plan``, JSON) and its structural rules.

Shared by the gateway's admin API, which refuses a plan that breaks them when it is stored,
and the analytics rollout controller (:mod:`analytics.rollout.plan` adds behaviour,
:mod:`analytics.rollout.check` the checks that need the metric catalogue and statistics).
Every key is optional; ``docs/rollouts.md`` describes each one.

Structural rules (no statistics needed): stages strictly increasing in (0, 100]; stage
overrides keyed by a stage; each guardrail listed once; a ``control_holdback`` leaves every
earlier stage below the final one; and at least one stage keeps control traffic, because
promotion needs non-inferiority shown on data where both arms had traffic.
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_STAGES: tuple[float, ...] = (1, 5, 10, 25, 50, 100)
#: Bounds on list sizes: a plan is a few stages and guardrails, never a bulk payload.
MAX_STAGES = 20
MAX_METRICS = 20

OnSrm = Literal["hold", "rollback", "warn"]
OnComplete = Literal["promote", "hold"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GuardrailSpec(_Strict):
    metric: str = Field(min_length=1, max_length=128)
    # Relative: 0.25 = the candidate may be up to 25% worse than the control's mean.
    margin: float | None = Field(default=None, ge=0, le=10)
    # Absolute, in the metric's unit: 0.01 = one percentage point for a rate. With both,
    # the tolerated harm is max(margin × |control mean|, absolute_margin).
    absolute_margin: float | None = Field(default=None, ge=0)
    # Test the metric as a rate of 0/1 events (score test on the difference); None = auto
    # (the catalogue's event rates and proportions).
    rate: bool | None = None
    # "auto": the always-valid per-unit tests. "mann_whitney": a rank test on request-level
    # samples (Kayenta's canary judge) — the test for quantile metrics (latency_p95): the
    # per-batch quantiles of whole units are compared, with a relative margin (0.10 = the
    # candidate's quantile may be 10% worse). A fixed-horizon test: judged once the stage's
    # minimums are met.
    method: Literal["auto", "mann_whitney"] = "auto"

    @model_validator(mode="after")
    def _rank_test_takes_a_relative_margin(self) -> GuardrailSpec:
        if self.method == "mann_whitney" and (self.absolute_margin is not None or self.rate):
            raise ValueError("method mann_whitney takes a relative margin only (no absolute_margin, no rate)")
        return self


#: Planned looks of a group-sequential plan: a few interim analyses, never one per tick.
MAX_LOOKS = 50


class SequentialSpec(_Strict):
    """How guardrails are tested over the looks of a stage (``docs/rollouts.md``).

    ``always_valid`` (default): a confidence sequence, valid at every controller look.
    ``group``: Lan–DeMets alpha spending over ``looks`` planned looks at information
    fractions 1/K, 2/K, …, 1 of ``planned_units`` (units of both arms in the guardrail
    window); decisions change only at those looks.
    """

    mode: Literal["always_valid", "group"] = "always_valid"
    spending: Literal["obrien_fleming", "pocock"] | None = None
    looks: int | None = Field(default=None, ge=1, le=MAX_LOOKS)

    @model_validator(mode="after")
    def _group_needs_looks(self) -> SequentialSpec:
        if self.mode == "always_valid" and (self.spending is not None or self.looks is not None):
            raise ValueError("spending and looks apply to mode group only")
        if self.mode == "group" and self.looks is None:
            raise ValueError("mode group needs looks (the number of planned looks, >= 1)")
        return self

    @property
    def spending_function(self) -> str:
        return self.spending or "obrien_fleming"


#: The RL-risk alarms a plan may act on (``analytics.report.risks_schema.ALARM_NAMES``
#: without ``category_guardrail``, which ``category_guardrails`` declares).
RiskAlarm = Literal["forgetting", "category_mix", "verbosity", "goodhart", "stuffing"]
#: Metrics of the capability matrix (``analytics.report.risks.MATRIX_METRICS``).
CategoryMetric = Literal["thumbs_down_rate", "thumbs_up_rate", "satisfaction"]


class CategoryGuardrailSpec(_Strict):
    """No task category may be worse than ``margin`` on ``metric`` (relative to the
    control's mean in that category, or absolute in the metric's unit)."""

    metric: CategoryMetric
    margin: float = Field(ge=0, le=10)
    relative: bool = True


class RlRiskRules(_Strict):
    """What the controller does on the RL-risk detectors (``docs/rl-risks.md``)."""

    category_guardrails: tuple[CategoryGuardrailSpec, ...] = Field(default=(), max_length=MAX_METRICS)
    # A category over its margin: roll back (default) or hold.
    on_category_breach: Literal["rollback", "hold"] = "rollback"
    hold_on: tuple[RiskAlarm, ...] = Field(default=(), max_length=5)
    rollback_on: tuple[RiskAlarm, ...] = Field(default=(), max_length=5)

    @model_validator(mode="after")
    def _distinct(self) -> RlRiskRules:
        names = [g.metric for g in self.category_guardrails]
        if len(set(names)) != len(names):
            raise ValueError("a category guardrail metric is listed twice")
        for field in ("hold_on", "rollback_on"):
            values = getattr(self, field)
            if len(set(values)) != len(values):
                raise ValueError(f"{field} lists an alarm twice")
        if both := sorted(set(self.hold_on) & set(self.rollback_on)):
            raise ValueError(f"{', '.join(both)} in both hold_on and rollback_on")
        return self


class StageMinimums(_Strict):
    min_duration_s: float | None = Field(default=None, ge=0, le=30 * 86_400)
    min_units: int | None = Field(default=None, ge=0)


class Baseline(_Strict):
    """A guardrail's expected control mean and per-unit standard deviation (plan checks)."""

    mean: float
    sd: float | None = Field(default=None, ge=0)


class RolloutPlanSchema(_Strict):
    stages: tuple[float, ...] = Field(default=DEFAULT_STAGES, max_length=MAX_STAGES)
    min_duration_s: float = Field(default=900.0, ge=0, le=30 * 86_400)
    min_units: int = Field(default=100, ge=0)
    stage_overrides: dict[str, StageMinimums] = Field(default_factory=dict, max_length=MAX_STAGES)
    guardrails: tuple[GuardrailSpec, ...] | None = Field(default=None, max_length=MAX_METRICS)
    success_metrics: tuple[str, ...] = Field(default=(), max_length=MAX_METRICS)
    on_srm: OnSrm = "hold"
    on_complete: OnComplete = "promote"
    # False rollback: family-wise over guardrails and stages (see docs/rollouts.md).
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    # False promotion: each guardrail's non-inferiority at the promotion stage.
    noninferiority_alpha: float = Field(default=0.05, gt=0, lt=0.5)
    interval_s: float = Field(default=30.0, ge=0, le=86_400)
    planned_units: int = Field(default=10_000, ge=10, le=10**9)
    min_test_units: int = Field(default=30, ge=2)
    require_noninferiority: bool = False
    guardrail_window: Literal["stage", "cumulative"] = "stage"
    # Percent of traffic the control keeps in the final stage, where promotion is then decided.
    control_holdback: float = Field(default=0.0, ge=0, lt=100)
    # Expected traffic and baselines, for the plan check's detectable effects per stage.
    expected_units_per_s: float | None = Field(default=None, gt=0, le=1e7)
    expected_requests_per_s: float | None = Field(default=None, gt=0, le=1e8)
    baselines: dict[str, float | Baseline] = Field(default_factory=dict, max_length=MAX_METRICS)
    # "if_declared": the candidate gets no traffic until the experiment's declared offline gate
    # passed for it as configured now; "required": the same, and a missing declaration holds.
    offline_gate: Literal["if_declared", "required"] = "if_declared"
    sequential: SequentialSpec = Field(default_factory=SequentialSpec)
    # Per-category guardrails and RL-risk alarms the controller acts on (None: none).
    rl_risks: RlRiskRules | None = None

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
    def _consistent(self) -> RolloutPlanSchema:
        known = {pct_key(s) for s in self.stages}
        for key in self.stage_overrides:
            if pct_key(as_percent(key)) not in known:
                raise ValueError(f"stage_overrides key {key!r} is not one of the stages {list(self.stages)}")
        names = [g.metric for g in self.guardrails or ()]
        if len(set(names)) != len(names):
            raise ValueError("a guardrail metric is listed twice")
        percents = self.percents()
        if any(b <= a for a, b in itertools.pairwise(percents)):
            final = percents[-1]
            raise ValueError(
                f"control_holdback {self.control_holdback:g} caps the final stage at {final:g}%, "
                f"but an earlier stage is already at or above it"
            )
        if self.sequential.mode == "group":
            if "planned_units" not in self.model_fields_set:
                raise ValueError(
                    "sequential mode group needs planned_units: the information fraction at a look is "
                    "the units in the guardrail window over planned_units"
                )
            if self.guardrail_window != "stage":
                raise ValueError(
                    "sequential mode group needs guardrail_window stage: across stages the split changes, "
                    "so units stop measuring the information the boundaries assume"
                )
        if self.promotion_index() is None:
            raise ValueError(
                "no stage keeps control traffic: promotion needs non-inferiority shown where both "
                "arms have traffic (add a stage below 100, or a control_holdback)"
            )
        return self

    def percents(self) -> tuple[float, ...]:
        """The candidate's share in each stage: the final stage leaves ``control_holdback`` to the control."""
        if self.control_holdback <= 0:
            return self.stages
        return (*self.stages[:-1], min(self.stages[-1], 100.0 - self.control_holdback))

    def promotion_index(self) -> int | None:
        """The stage where promotion is decided: the last one that still has control traffic.

        A final 100% stage is never evaluated: serving the candidate to everyone *is* the
        promotion, so it is decided one stage earlier.
        """
        with_control = [i for i, p in enumerate(self.percents()) if p < 100]
        return with_control[-1] if with_control else None


def as_percent(key: str) -> float:
    try:
        return float(key)
    except ValueError:
        return -1.0


def pct_key(value: float) -> str:
    return f"{value:.6g}"


def validation_reasons(exc: ValidationError, prefix: str = "") -> str:
    """One line: ``field: reason; field: reason`` (what the APIs answer with)."""

    def where(loc: tuple[int | str, ...]) -> str:
        path = ".".join(str(p) for p in loc)
        return f"{prefix}.{path}" if prefix and path else (path or prefix or "rollout_plan")

    return "; ".join(f"{where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())


def plan_problems(raw: Any) -> str | None:
    """Why ``raw`` is not a structurally valid plan (``rollout_plan.<field>: reason``), or None."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        return "rollout_plan must be a JSON object"
    try:
        RolloutPlanSchema.model_validate(raw)
    except ValidationError as exc:
        return validation_reasons(exc, "rollout_plan")
    return None
