"""The report's RL-risks section (``Report.rl_risks``): one :class:`RlRisks` per candidate.

Every part carries a ``state``:

- ``ok``: computed; its alarm (if any) is meaningful;
- ``insufficient_data``: fewer units than the tests need (``reason`` says how many), or a
  detector could not estimate a variance yet — never an alarm, never a pass;
- ``unavailable``: the data it needs is not collected (no judge configured, content
  logging off);
- ``error``: the inputs are degenerate in a way more data will not fix (``reason``).

Numbers follow the report's conventions (finite floats or ``None``); formulas are in
``docs/rl-risks.md``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    # As analytics.report.schema's models (which import this module): NaN/inf serialise as null.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="null")


RiskState = Literal["ok", "insufficient_data", "unavailable", "error"]
AlarmName = Literal["forgetting", "category_guardrail", "category_mix", "verbosity", "goodhart", "stuffing"]
ALARM_NAMES: tuple[AlarmName, ...] = (
    "forgetting",
    "category_guardrail",
    "category_mix",
    "verbosity",
    "goodhart",
    "stuffing",
)


class RiskEvidence(_Model):
    """An estimate with its always-valid two-sided interval and one-sided bounds/p-values."""

    estimate: float
    std_error: float
    lower: float
    upper: float
    lower_one_sided: float
    upper_one_sided: float
    p_above: float
    p_below: float


class RiskAlarm(_Model):
    name: AlarmName
    firing: bool
    state: RiskState
    detail: str | None = None
    categories: list[str] = Field(default_factory=list)


class CategoryShareRow(_Model):
    category: str
    control: float | None
    candidate: float | None
    difference: float | None
    std_error: float | None


class CategoryMixPart(_Model):
    state: RiskState
    reason: str | None = None
    flagged: bool = False
    p_value: float | None = None
    chi2: float | None = None
    dof: int = 0
    threshold: float = 0.001
    shares: list[CategoryShareRow] = Field(default_factory=list)


class MatrixCellRow(_Model):
    category: str
    metric: str
    direction: Literal["increase", "decrease"]
    state: RiskState
    reason: str | None = None
    n_control: int
    n_candidate: int
    control_mean: float | None = None
    candidate_mean: float | None = None
    lift: float | None = None
    lift_std_error: float | None = None
    p_value_harm: float | None = None
    p_holm: float | None = None
    q_value: float | None = None
    harmed: bool = False
    shrunk_lift: float | None = None
    shrunk_std_error: float | None = None


class CategoryGuardrailRow(_Model):
    metric: str
    category: str
    margin: float
    relative: bool
    state: RiskState
    reason: str | None = None
    harm: float | None = None
    harm_lower: float | None = None
    p_value: float | None = None
    p_holm: float | None = None
    breached: bool = False


class CapabilityPart(_Model):
    state: RiskState
    reason: str | None = None
    metrics: list[str] = Field(default_factory=list)
    categories: list[str] = Field(default_factory=list)
    cells: list[MatrixCellRow] = Field(default_factory=list)
    guardrails: list[CategoryGuardrailRow] = Field(default_factory=list)
    harmed: list[str] = Field(default_factory=list)  # "metric/category", Holm-significant
    breached: list[str] = Field(default_factory=list)  # "metric/category", over a declared margin


class CurvePoint(_Model):
    """One bin of a curve x → user outcome: the control's and the candidate's mean outcome."""

    bin: int
    low: float
    high: float
    control_n: int
    control_outcome: float | None
    candidate_n: int
    candidate_outcome: float | None


class DecompositionOut(_Model):
    control_mean: float | None = None
    candidate_mean: float | None = None
    predicted_candidate: float | None = None
    explained: float | None = None
    total: RiskEvidence | None = None
    residual: RiskEvidence | None = None
    units: int = 0
    responses_control: int = 0
    responses_candidate: int = 0
    borrowed_share: float | None = None


class VerbosityPart(_Model):
    state: RiskState
    reason: str | None = None
    outcome: str
    tokens_control: float | None = None
    tokens_candidate: float | None = None
    shift: RiskEvidence | None = None
    relative_shift: float | None = None
    longer: bool = False
    decomposition: DecompositionOut | None = None
    gain_is_length: bool = False
    no_gain: bool = False
    alarm: bool = False
    curve: list[CurvePoint] = Field(default_factory=list)


class JudgePart(_Model):
    state: RiskState
    reason: str | None = None
    outcome: str
    judges: list[str] = Field(default_factory=list)
    judged_control: int = 0
    judged_candidate: int = 0
    # The share of units whose judged responses were read (a hash sample, the same units
    # in every arm; below 1 above ``max_units`` units or ``max_judged`` judged responses).
    judged_share: float = 1.0
    mean_score_control: float | None = None
    mean_score_candidate: float | None = None
    judge_says: float | None = None
    users_say: float | None = None
    summary: str | None = None
    divergence: RiskEvidence | None = None
    diverged: bool = False
    decomposition: DecompositionOut | None = None
    correlation_control: float | None = None
    correlation_candidate: float | None = None
    correlation_drop: RiskEvidence | None = None
    correlation_dropped: bool = False
    alarm: bool = False
    curve: list[CurvePoint] = Field(default_factory=list)


class PhraseRow(_Model):
    # The phrase's text; with content logging ``hashed`` its hash (``hash``) unless the
    # operator's phrase list resolves it (``resolved``).
    phrase: str
    hash: str | None = None  # 16 hex digits of the keyed hash (content logging hashed)
    resolved: bool = True
    rate_control: float
    rate_candidate: float
    log_odds: float
    z: float
    p_value: float
    q_value: float
    flagged: bool
    categories: list[str] = Field(default_factory=list)  # where the candidate uses it, most first
    responses_with: int = 0  # candidate responses containing it
    outcome_with: float | None = None
    outcome_without: float | None = None
    judge_with: float | None = None
    judge_without: float | None = None


class PhrasePart(_Model):
    state: RiskState
    reason: str | None = None
    source: Literal["text", "hashed"] = "text"  # stored texts, or the gateway's n-gram hashes
    responses_control: int = 0
    responses_candidate: int = 0
    tested: int = 0
    phrases: list[PhraseRow] = Field(default_factory=list)
    flagged: list[str] = Field(default_factory=list)


class RlRisks(_Model):
    """The RL-risk detectors for one candidate against the control, on all data so far."""

    variant: str
    control: str
    outcome: str  # the user outcome of the decomposition and judge parts
    units_control: int
    units_candidate: int
    min_units: int
    # The share of the experiment's units read (a hash sample above RiskOptions.max_units).
    units_share: float = 1.0
    alarms: list[RiskAlarm]
    category_mix: CategoryMixPart
    capability: CapabilityPart
    verbosity: VerbosityPart
    judge: JudgePart
    phrases: PhrasePart
    build_seconds: float | None = None
    # When the section was computed (a report may reuse a recent snapshot's section: the
    # service's LIFTGATE_RL_RISKS_MAX_AGE_S).
    computed_at: datetime | None = None

    def alarm(self, name: str) -> RiskAlarm | None:
        return next((a for a in self.alarms if a.name == name), None)
