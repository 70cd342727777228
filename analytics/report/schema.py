"""The experiment report as it crosses process boundaries (API, CLI, dashboard, rollout).

Everything the report API returns, and what ``analysis_snapshots.report`` stores, is a
:class:`Report`. Conventions:

- Numbers are finite floats or ``None``; never NaN or infinity. When a value cannot be
  computed the object carries ``error`` (a stable ``code`` and a human ``message``).
- Lifts compare a candidate with the control: ``absolute = mean_t - mean_c`` and
  ``relative = absolute / |mean_c|``. Intervals are two-sided at ``1 - alpha``.
- ``ci`` is the fixed-horizon interval (valid for one look at a pre-planned sample
  size); ``sequential_ci`` is the always-valid confidence sequence (valid however often
  the report is looked at). The verdict uses the sequential evidence (see ``VerdictPolicy``).
- Corrections: ``p_holm`` and ``p_bh`` correct the fixed-horizon p-values across all
  metrics × candidates of the report (across metrics × candidates × segments for
  segment breakdowns); ``p_sequential_holm`` is the Holm correction of the always-valid
  p-values and is what the verdict uses.
- Metric ``direction`` says which way is good: ``increase`` (thumbs-up rate) or
  ``decrease`` (error rate, latency). "better"/"worse" always take it into account.

Verdicts (one per candidate, see :class:`Verdict`):

- ``srm``: the observed split differs from the configured weights (chi-square p < 0.001);
  no other conclusion is trustworthy until the assignment/logging bug is found.
- ``harm``: a guardrail failed (worse than its non-inferiority margin with confidence),
  or any metric is significantly worse (sequential, Holm-corrected p < alpha).
- ``ship``: at least one non-guardrail metric is significantly better, none is
  significantly worse, and every guardrail passed non-inferiority.
- ``no_difference_yet``: none of the above; ``progress`` says how far the experiment is
  from the sample size needed to detect each metric's MDE.
- ``insufficient_data``: the candidate or the control has fewer than the tests' minimum
  of units (``min_units``, 30 by default: the rollout controller's ``min_test_units``).

A comparison row is ``insufficient_data`` (its ``error``) when an arm has fewer than that
minimum or its interval has zero width: it keeps its point estimates but has no interval
or p-value, so it is never significant and never fails or passes a guardrail.

Fixed-horizon results (quantile metrics: ``p_value`` and ``ci`` only, ``guardrail.test``
``fixed_horizon``) are valid at one planned look: before the experiment reaches its planned
sample (``planned_units``, both arms together) and while it runs, a fixed-horizon guardrail
is ``inconclusive`` with ``error.code`` ``not_yet_valid`` and never drives a verdict.

Rollouts (``mode: rollout``): ``rollout`` carries the plan's guardrails, the controller's
evidence on the current stage window (``look``) and its last decisions; the verdict is
derived from that evidence — the same guardrail definitions and the same window the
controller acts on — and ``Verdict.basis`` names it. Where the cumulative table (all units
since the start) disagrees, ``Verdict.differences`` says how and why.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from analytics.report.risks_schema import RlRisks

SCHEMA_VERSION = 1

MetricKind = Literal["proportion", "mean", "ratio", "quantile"]
Direction = Literal["increase", "decrease"]
GuardrailOutcome = Literal["pass", "fail", "inconclusive"]
VerdictName = Literal["ship", "no_difference_yet", "harm", "srm", "insufficient_data"]
VerdictPolicy = Literal["sequential_holm"]
Mode = Literal["ab", "shadow", "rollout"]
GuardrailTest = Literal["sequential", "fixed_horizon"]
SrmMethod = Literal["all_units", "per_stage", "first_exposure"]


class _Model(BaseModel):
    # A NaN/inf that slipped past the engine's guards still serialises as null, never NaN.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="null")


class ErrorInfo(_Model):
    """Why a value is missing, e.g. ``no_data``, ``too_few_units``, ``zero_variance``,
    ``zero_control_mean``, ``empty_variant``, ``no_control``, ``no_snapshots``."""

    code: str
    message: str


class Interval(_Model):
    lower: float
    upper: float


class MetricInfo(_Model):
    """A metric as defined in the catalogue (``analytics.report.catalogue``)."""

    name: str
    label: str
    kind: MetricKind
    direction: Direction
    guardrail: bool = False
    # Non-inferiority margin, relative to the control (0.05 = up to 5% worse is acceptable).
    margin: float | None = None
    # Minimum detectable effect (relative) used for the progress/sample-size figures.
    mde: float | None = None
    quantile: float | None = None
    description: str = ""
    # How a rollout plan states this guardrail's margin (e.g. "+0.01 absolute"); ``margin``
    # is then set only when the margin is relative.
    margin_text: str | None = None


class AllocationRow(_Model):
    variant: str
    is_control: bool
    expected_weight: float
    expected_share: float
    observed_units: int
    observed_share: float | None


class StageSrm(_Model):
    """One rollout stage's split: units seen in the stage against the stage's weights."""

    stage: int
    percent: float | None  # the candidate's weight in this stage
    units: dict[str, int]
    expected_share: dict[str, float]
    chi2: float | None
    p_value: float | None
    flagged: bool
    error: ErrorInfo | None = None


class SrmCheck(_Model):
    """Sample-ratio mismatch: chi-square goodness of fit of observed units vs weights.

    ``method``: ``all_units`` (A/B: every unit against the weights); ``per_stage``
    (rollouts: each stage's units — from the gateway's ``rollout_stage`` tag — against that
    stage's weights, ``stages`` lists them; ``p_value`` is the smallest stage p-value times
    the number of stages tested, Bonferroni); ``first_exposure`` (rollouts without stage
    tags: units whose first call in any variant fell in the current stage, each counted
    once where it was first served).
    """

    chi2: float | None
    p_value: float | None
    flagged: bool
    threshold: float = 0.001
    method: SrmMethod | None = None
    stages: list[StageSrm] = Field(default_factory=list)
    error: ErrorInfo | None = None


class Guardrail(_Model):
    """Non-inferiority of a guardrail metric (one-sided).

    ``bound`` is the worst-direction end of the relative-lift interval: the candidate
    passes when even that bound is within ``margin``, fails when the whole interval is
    beyond it, and is inconclusive otherwise. ``test``: ``sequential`` (always-valid
    confidence sequence, per-unit) or ``fixed_horizon`` (quantiles: request-level
    order-statistic interval, valid only at the planned look — see ``not_yet_valid``).
    """

    outcome: GuardrailOutcome
    margin: float
    bound: float | None
    p_value: float | None = None
    test: GuardrailTest = "sequential"
    error: ErrorInfo | None = None
    # "absolute": ``margin`` and ``bound`` are in the metric's unit (a rollout guardrail
    # with an absolute margin, e.g. +0.01 error rate); "relative" otherwise.
    scale: Literal["relative", "absolute"] = "relative"
    margin_text: str | None = None


class Cuped(_Model):
    theta: float | None  # the common θ; None with the per-arm convention (``thetas``)
    variance_reduction: float  # 1 - Var(adjusted)/Var(raw), in [0, 1)
    covered_units: int
    convention: Literal["pooled", "pooled_sums", "per_arm"] = "pooled"
    thetas: list[float | None] = Field(default_factory=list)  # per variant, control first


class Method(_Model):
    """Which convention produced each number of a comparison (docs/statistics.md names the engines).

    ``test``/``interval``: the fixed-horizon p-value and CI (``welch_t``: Welch t on the per-unit
    values, delta method for ratios; ``pooled_z``: the pooled two-proportion z = χ² test with the
    unpooled Wald z interval). ``sequential``: the always-valid mixture SPRT behind
    ``p_value_sequential`` and the sequential CIs, tuned at ``planned_units``. ``cuped``: the
    θ convention, or ``none``. ``correction``: ``p_holm``/``p_sequential_holm`` (Holm) and
    ``p_bh`` (Benjamini–Hochberg). ``bayes``: the model behind ``chance_to_beat_control``.
    """

    test: Literal["welch_t", "pooled_z"]
    interval: Literal["welch_t", "wald_z"]
    sequential: Literal["always_valid"] = "always_valid"
    planned_units: int
    cuped: Literal["none", "pooled", "pooled_sums", "per_arm"] = "none"
    correction: Literal["holm+bh"] = "holm+bh"
    bayes: Literal["gaussian"] = "gaussian"


class Progress(_Model):
    """Units so far over the units per variant needed to detect ``mde`` (alpha, power)."""

    units: int
    required: int | None
    fraction: float | None
    mde: float | None
    power: float = 0.8
    error: ErrorInfo | None = None


class VariantResult(_Model):
    """One metric for one variant. The control row has no lift fields."""

    metric: str
    variant: str
    is_control: bool
    units: int
    mean: float | None  # per-unit mean; for ratio metrics the ratio Σnum/Σden
    std_error: float | None = None
    numerator: float | None = None
    denominator: float | None = None
    lift_absolute: float | None = None
    lift_relative: float | None = None
    ci_absolute: Interval | None = None
    ci_relative: Interval | None = None
    sequential_ci_absolute: Interval | None = None
    sequential_ci_relative: Interval | None = None
    p_value: float | None = None
    p_value_sequential: float | None = None
    p_holm: float | None = None
    p_bh: float | None = None
    p_sequential_holm: float | None = None
    significant: bool = False  # sequential Holm-corrected p < alpha
    better: bool | None = None  # direction-aware sign of the lift (None: no lift)
    chance_to_beat_control: float | None = None
    expected_loss: float | None = None
    guardrail: Guardrail | None = None
    cuped: Cuped | None = None
    progress: Progress | None = None
    error: ErrorInfo | None = None
    method: Method | None = None  # on candidate rows with a test


class Verdict(_Model):
    variant: str
    verdict: VerdictName
    reason: str
    better: list[str] = Field(default_factory=list)
    worse: list[str] = Field(default_factory=list)
    failed_guardrails: list[str] = Field(default_factory=list)
    # The evidence the verdict rests on, when it is not the report's own table (rollouts:
    # "promoted at 50% on stage-window evidence (stage 3, …)").
    basis: str | None = None
    # Where the cumulative table disagrees with that evidence, and why.
    differences: list[str] = Field(default_factory=list)


class TimePoint(_Model):
    """A cumulative estimate at one snapshot time (one metric, one candidate)."""

    t: datetime
    units: int
    lift_relative: float | None
    ci_relative: Interval | None
    sequential_ci_relative: Interval | None


class TimeSeries(_Model):
    metric: str
    variant: str
    points: list[TimePoint]


class SegmentBreakdown(_Model):
    """The report's table restricted to units seen with one tag value (``task=code``).

    Corrections in ``results`` run across metrics × candidates × segments.
    """

    segment: str
    tag: str
    value: str
    units: int
    results: list[VariantResult]


class PairedMetric(_Model):
    """Mean difference candidate − baseline over pairs of calls on the same prompt."""

    name: str  # latency_ms, response_chars, error, completion_tokens
    pairs: int
    baseline_mean: float | None
    candidate_mean: float | None
    mean_difference: float | None
    ci: Interval | None
    p_value: float | None
    error: ErrorInfo | None = None


class PairedComparison(_Model):
    """Shadow experiments: candidate vs baseline on the same prompts (``pair_id``)."""

    variant: str
    baseline: str
    window_start: datetime | None
    window_end: datetime | None
    pairs: int
    sampled: bool  # True when the pair count hit the query's bound
    metrics: list[PairedMetric]
    # Share of pairs whose responses agree (same content hash/text when content is logged,
    # else same finish reason and status); None when nothing comparable was logged.
    agreement: float | None
    agreement_basis: str | None = None
    error: ErrorInfo | None = None


class RolloutGuardrail(_Model):
    """A guardrail as the rollout plan defines it (the controller's definition): a relative
    ``margin`` (0.1 = 10% worse than the control), an ``absolute_margin`` in the metric's
    unit (the default for event rates), or both (the larger tolerated harm applies)."""

    metric: str
    margin: float | None
    absolute_margin: float | None = None
    margin_text: str = ""


class RolloutDecision(_Model):
    """One decision of the controller (or an operator) with the evidence it acted on.

    ``evidence`` is the controller's record as stored (guardrails with estimate, bounds,
    margin and units per arm; SRM counts; stage minimums; …); keys may be added over time.
    """

    id: int
    created_at: datetime
    decision: str
    reason: str
    actor: str
    stage: int | None
    to_stage: int | None
    evidence: dict[str, Any] = Field(default_factory=dict)


class RolloutLook(_Model):
    """The controller's evidence on the current stage window at the report's time, and
    what the controller's rules decide on it (``decision``/``reason``)."""

    at: datetime
    decision: str
    reason: str
    evidence: dict[str, Any]


class RolloutSection(_Model):
    """What the rollout verdict rests on: the plan's guardrails, the live look and the
    controller's last decisions. ``basis`` names the evidence the verdict used."""

    window: str  # "stage" or "cumulative": the window the controller tests guardrails on
    stage: int | None
    stage_percent: float | None
    min_test_units: int
    planned_units: int
    guardrails: list[RolloutGuardrail]
    look: RolloutLook | None = None
    decisions: list[RolloutDecision] = Field(default_factory=list)
    basis: str | None = None
    error: ErrorInfo | None = None


class Report(_Model):
    schema_version: int = SCHEMA_VERSION
    experiment_id: int
    name: str
    route: str
    mode: Mode
    status: str
    stage: int | None = None
    started_at: datetime | None
    generated_at: datetime
    alpha: float = 0.05
    # Units per arm below which no comparison is tested (insufficient_data), and the
    # planned sample (both arms) at which fixed-horizon results become valid.
    min_units: int = 30
    planned_units: int = 10_000
    verdict_policy: VerdictPolicy = "sequential_holm"
    control: str | None
    units: int
    metrics: list[MetricInfo]
    allocation: list[AllocationRow]
    srm: SrmCheck
    results: list[VariantResult]
    verdicts: list[Verdict]
    timeseries: list[TimeSeries] = Field(default_factory=list)
    # The tag keys the experiment declares for segments (experiments.segment_tags): only
    # these, and rollout_stage, are rolled up at ingest and can appear in ``segments``.
    segment_tags: list[str] = Field(default_factory=list)
    segments: list[SegmentBreakdown] = Field(default_factory=list)
    paired: list[PairedComparison] = Field(default_factory=list)
    rollout: RolloutSection | None = None
    # RL-risk detectors, one entry per candidate (analytics.report.risks_schema)
    rl_risks: list[RlRisks] = Field(default_factory=list)
    build_seconds: float | None = None
    errors: list[ErrorInfo] = Field(default_factory=list)

    def result(self, metric: str, variant: str) -> VariantResult | None:
        for r in self.results:
            if r.metric == metric and r.variant == variant:
                return r
        return None

    def headline(self) -> VerdictName | None:
        return headline(self.verdicts)


_SEVERITY: tuple[VerdictName, ...] = ("srm", "harm", "insufficient_data", "no_difference_yet", "ship")


def headline(verdicts: list[Verdict]) -> VerdictName | None:
    """The worst verdict over candidates (srm > harm > insufficient_data > no_difference_yet > ship)."""
    found = {v.verdict for v in verdicts}
    return next((name for name in _SEVERITY if name in found), None)


class ExperimentSummary(_Model):
    """One row of ``GET /api/experiments``."""

    id: int
    name: str
    route: str
    mode: Mode
    status: str
    stage: int | None
    # The candidate's share at that stage (percent), what the dashboard and CLI show.
    stage_percent: float | None = None
    units: int
    verdict: VerdictName | None
    started_at: datetime | None
    report_at: datetime | None
