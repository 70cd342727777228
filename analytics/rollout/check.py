"""Checking a rollout plan before it runs: errors (refused), warnings, and the detectable harm
per guardrail per stage at the expected traffic (pure; the caller supplies the metric
catalogue and, when known, the route's recent traffic and baselines).

Errors make the plan unusable: it does not parse, a metric is unknown, a guardrail is a
quantile (no per-unit always-valid test), an absolute margin no rate can exceed. The
controller holds instead of starting such a plan; the CLI refuses to create it.

Warnings are accepted with an explicit message: ``min_units`` below ``min_test_units``,
a rate guardrail with only a relative margin (undefined at a zero rate), no guardrails,
unknown traffic, a stage that cannot see a harm of twice its margin before it may end, a
stage that will last longer than its minimum because its guardrails need units, and a
promotion stage too short to show non-inferiority of an equal candidate.

Detectable harm (MDE) of a stage: with expected traffic U units/s and R requests/s, the
stage may end after T = max(min_duration_s, the time until min_units candidate units and
min_test_units units per variant). The MDE is the harm the stage's rollback test catches
with 80% power by then, at the stage's alpha, for the always-valid boundary at T (one look
at T: looking every interval only catches it sooner):

    h = margin + (z_av + z_0.8)·√V(h),   z_av = the one-sided mixture boundary / √V

with V the test's variance at T (the rate test's null variance from expected counts; for
means σ²/n_t + σ²/n_c with σ the per-unit standard deviation). At the promotion stage,
``noninferiority_s`` is the time an equal candidate needs to be shown non-inferior with
80% power: margin = (z_av + z_0.8)·√V(T).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scipy import stats as sps

from analytics.report.catalogue import Metric
from analytics.rollout.evidence import guardrail_alpha, look_bin
from analytics.rollout.margins import Margin, resolve_margin
from analytics.rollout.plan import PlanError, RolloutPlan, Stage, parse_plan
from analytics.stats.group_sequential import group_sequential_design
from analytics.stats.rate import RateArm, RateContrast
from analytics.stats.sequential import one_sided_halfwidth, tuning_rho2
from contracts.rollout_plan import Baseline

POWER = 0.8
#: A stage "cannot see" a harm when its MDE exceeds this multiple of the margin.
DETECTABLE_MULTIPLE = 2.0
#: Baseline of an event rate when neither the plan nor the route gives one.
ASSUMED_RATE = 0.01


@dataclass(frozen=True, slots=True)
class Traffic:
    """Expected traffic. ``windows`` are measured (seconds, distinct units) pairs: returning
    users make distinct units grow slower than time, so a stage's units are interpolated
    from them; beyond the longest window (or without any) they grow at ``units_per_s``."""

    units_per_s: float
    requests_per_s: float
    source: str  # "plan" or "route <route>: experiment <name>, …"
    windows: tuple[tuple[float, float], ...] = ()

    def units_in(self, seconds: float) -> float:
        """Distinct units expected in a window of ``seconds``."""
        if not self.windows:
            return self.units_per_s * seconds
        pts = sorted(self.windows)
        if seconds <= pts[0][0]:
            return pts[0][1] * seconds / pts[0][0]
        for (t0, u0), (t1, u1) in itertools.pairwise(pts):
            if seconds <= t1:
                return u0 + (u1 - u0) * (seconds - t0) / (t1 - t0)
        t_last, u_last = pts[-1]
        return u_last + self.units_per_s * (seconds - t_last)

    def seconds_for(self, units: float) -> float:
        """The window in which ``units`` distinct units are expected (inverse of ``units_in``)."""
        hi = 1.0
        while self.units_in(hi) < units and hi < 1e9:
            hi *= 2.0
        lo = 0.0
        for _ in range(60):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if self.units_in(mid) < units else (lo, mid)
        return hi


@dataclass(frozen=True, slots=True)
class BaselineStat:
    mean: float
    sd: float | None  # per-unit standard deviation (linearised for ratios)
    source: str


@dataclass(frozen=True, slots=True)
class MdeRow:
    metric: str
    stage_index: int
    stage_percent: float
    seconds: float | None
    units_control: float | None
    units_candidate: float | None
    baseline: float | None
    baseline_source: str | None
    harm_scale: str
    margin: float | None
    mde: float | None
    detectable: bool | None
    noninferiority_s: float | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class PlanCheck:
    errors: list[str]
    warnings: list[str]
    mde: list[MdeRow] = field(default_factory=list)
    promotion_stage: int | None = None
    promotion_percent: float | None = None
    traffic: Traffic | None = None
    guardrails: list[dict[str, Any]] = field(default_factory=list)
    sequential: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def public(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": self.errors,
            "warnings": self.warnings,
            "promotion_stage": self.promotion_stage,
            "promotion_percent": self.promotion_percent,
            "traffic": None if self.traffic is None else asdict(self.traffic),
            "guardrails": self.guardrails,
            "mde": [asdict(r) for r in self.mde],
            "sequential": self.sequential,
        }


def plan_metric_names(raw: Any) -> list[str]:
    """Every metric a (possibly invalid) plan names, to load from the catalogue."""
    try:
        plan = parse_plan(raw)
    except PlanError:
        return []
    return [g.metric for g in plan.guardrail_specs()] + list(plan.success_metrics)


def guardrails_of(plan: RolloutPlan, catalogue: Mapping[str, Metric]) -> list[tuple[Metric, Margin]]:
    """(metric, margin) per guardrail; PlanError when one cannot be tested."""
    problems, out = [], []
    for spec in plan.guardrail_specs():
        metric = catalogue.get(spec.metric)
        if metric is None:
            problems.append(f"metric {spec.metric!r} is not defined")
            continue
        if metric.kind == "quantile" and spec.method != "mann_whitney":
            problems.append(
                f"guardrail {metric.name} is a quantile metric: no always-valid per-unit test exists for it; "
                "use method: mann_whitney (a rank test on request-level samples) or e.g. latency_mean"
            )
            continue
        if spec.method == "mann_whitney" and metric.kind != "quantile":
            problems.append(
                f"guardrail {metric.name}: method mann_whitney compares request-level samples of a quantile "
                "metric (latency_p95, ttft_p95, ...)"
            )
            continue
        margin = resolve_margin(spec, metric)
        if margin.rate and metric.kind not in ("ratio", "proportion"):
            problems.append(f"guardrail {metric.name}: rate: true needs a ratio or proportion metric")
            continue
        if margin.rate and margin.absolute is not None and margin.absolute >= 1.0:
            problems.append(
                f"guardrail {metric.name}: an absolute margin of {margin.absolute:g} on a rate can never be exceeded"
            )
            continue
        out.append((metric, margin))
    for name in plan.success_metrics:
        metric = catalogue.get(name)
        if metric is None:
            problems.append(f"metric {name!r} is not defined")
        elif metric.kind == "quantile":
            problems.append(
                f"success metric {name} is a quantile metric: no always-valid per-unit test exists for it"
            )
    if problems:
        raise PlanError("; ".join(problems))
    return out


def _test_name(margin: Margin) -> str:
    if margin.method == "mann_whitney":
        return "mann_whitney"
    return "rate_score" if margin.rate and margin.absolute is not None else "mean"


def rl_risk_warnings(plan: RolloutPlan) -> list[str]:
    """What the plan's ``rl_risks`` rules depend on that the plan cannot ensure by itself."""
    rules = plan.rl_risks
    if rules is None:
        return []
    out: list[str] = []
    acted = set(rules.hold_on) | set(rules.rollback_on)
    if "goodhart" in acted:
        out.append(
            "rl_risks acts on goodhart: it needs judge scores (the gateway's LIFTGATE_JUDGE_URL and "
            "LIFTGATE_JUDGE_SAMPLE_RATE > 0); without them promotion holds"
        )
    if "stuffing" in acted:
        out.append(
            "rl_risks acts on stuffing: it needs stored responses (the experiment's content_logging full "
            "or redacted); without them promotion holds"
        )
    if rules.category_guardrails and plan.min_test_units < 30:
        out.append(
            f"category guardrails are tested per category from {plan.min_test_units} units per arm: "
            "small categories are noisy; 30 or more is advised"
        )
    for g in rules.category_guardrails:
        if g.relative and g.metric != "satisfaction":
            out.append(
                f"category guardrail {g.metric} has a relative margin: undefined in a category where the "
                "control has no such event (that category is then untested, never a pass)"
            )
        if g.relative and g.metric == "satisfaction":
            out.append(
                "category guardrail satisfaction has a relative margin on a mean that can be 0 or negative: "
                'use "relative": false (an absolute margin)'
            )
    return out


def check_plan(
    raw: Any,
    catalogue: Mapping[str, Metric],
    *,
    traffic: Traffic | None = None,
    baselines: Mapping[str, BaselineStat] | None = None,
    catalogue_errors: Sequence[str] = (),
) -> PlanCheck:
    """Errors, warnings and the MDE table of a plan (see the module doc)."""
    try:
        plan = parse_plan(raw)
    except PlanError as exc:
        return PlanCheck([str(exc)], [])
    try:
        guards = guardrails_of(plan, catalogue)
    except PlanError as exc:
        promotion = plan.promotion_stage()
        return PlanCheck([*catalogue_errors, str(exc)], [], [], promotion, plan.stage(promotion).percent)
    warnings: list[str] = []
    if plan.min_units < plan.min_test_units:
        warnings.append(
            f"min_units {plan.min_units} is below min_test_units {plan.min_test_units}: a stage cannot end "
            f"before every guardrail has {plan.min_test_units} units per variant, so it will wait for those"
        )
    if not guards:
        warnings.append(
            "no guardrails: stages advance on time and units alone, and the candidate is promoted without evidence"
        )
    for metric, margin in guards:
        if margin.rate and margin.kind == "relative":
            warnings.append(
                f"{metric.name} is an event rate with only a relative margin: undefined while the control has no "
                f"events (the rollout then holds); add absolute_margin (e.g. 0.01)"
            )
    warnings += rl_risk_warnings(plan)
    if plan.expected_units_per_s is not None:
        rps = plan.expected_requests_per_s or plan.expected_units_per_s
        traffic = Traffic(plan.expected_units_per_s, rps, "plan")
    rows: list[MdeRow] = []
    if traffic is None:
        if guards:
            warnings.append(
                "expected traffic unknown (set expected_units_per_s in the plan, or send traffic to the route "
                "first): how long stages last and what they can detect was not checked"
            )
    else:
        known = _baselines(plan, baselines or {})
        rows = _mde_rows(plan, guards, traffic, known)
        warnings += _traffic_warnings(plan, rows, traffic)
    described = [
        {"metric": m.name, "margin": margin.kind, "relative_margin": margin.relative,
         "absolute_margin": margin.absolute, "test": _test_name(margin)}
        for m, margin in guards
    ]  # fmt: skip
    promotion = plan.promotion_stage()
    return PlanCheck(
        list(catalogue_errors), warnings, rows, promotion, plan.stage(promotion).percent, traffic, described,
        _sequential(plan, len(guards)),
    )  # fmt: skip


def _sequential(plan: RolloutPlan, k: int) -> dict[str, Any]:
    """The plan's sequential mode; for group mode each stage's planned looks with their units,
    boundaries and per-look adjusted (nominal) one-sided alphas, at the stage family's level."""
    seq = plan.sequential
    if seq.mode != "group":
        return {"mode": "always_valid"}
    assert seq.looks is not None
    a = guardrail_alpha(plan.alpha, range(k), plan.evaluated_stages())
    fractions = tuple((j + 1) / seq.looks for j in range(seq.looks))
    design = group_sequential_design(fractions, a, seq.spending_function, two_sided=False)
    ni = group_sequential_design(fractions, plan.noninferiority_alpha, seq.spending_function, two_sided=False)
    looks = [
        {"look": j + 1, "fraction": f, "units": math.ceil(f * plan.planned_units), "z_bound": design.z_bounds[j],
         "adjusted_alpha": design.nominal_alpha[j], "adjusted_alpha_noninferiority": ni.nominal_alpha[j]}
        for j, f in enumerate(fractions)
    ]  # fmt: skip
    return {
        "mode": "group", "spending": seq.spending_function, "looks": seq.looks,
        "planned_units": plan.planned_units, "alpha_per_stage": a, "planned_looks": looks,
    }  # fmt: skip


def _z_boundary(plan: RolloutPlan, alpha: float, n_total: float) -> float:
    """The rollback/non-inferiority boundary in standard errors after ``n_total`` units: the
    always-valid mixture boundary, or in group mode the planned look reached by then (the
    first look when none is: nothing is decided before it)."""
    seq = plan.sequential
    if seq.mode != "group":
        return _z_av(alpha, n_total, plan.planned_units)
    assert seq.looks is not None
    k = max(1, look_bin(n_total / plan.planned_units, seq.looks))
    fractions = tuple((j + 1) / seq.looks for j in range(k))
    c = group_sequential_design(fractions, alpha, seq.spending_function, two_sided=False).z_bounds[-1]
    return math.inf if c is None else c


def _baselines(plan: RolloutPlan, route: Mapping[str, BaselineStat]) -> dict[str, BaselineStat]:
    out = dict(route)
    for name, value in plan.baselines.items():
        b = value if isinstance(value, Baseline) else Baseline(mean=value)
        sd = b.sd if b.sd is not None else (route[name].sd if name in route else None)
        out[name] = BaselineStat(b.mean, sd, "plan")
    return out


def _stage_end(plan: RolloutPlan, stage: Stage, traffic: Traffic) -> float:
    """The earliest a stage may end: its minimum duration, or longer when its minimum units
    (candidate units; min_test_units per variant) need more time at this traffic."""
    w = stage.percent / 100.0
    need = traffic.seconds_for(max(stage.min_units, plan.min_test_units) / w)
    need_control = traffic.seconds_for(plan.min_test_units / (1.0 - w))
    return max(stage.min_duration_s, need, need_control)


def _z_av(alpha: float, n_total: float, planned: int) -> float:
    """The always-valid one-sided boundary in standard errors (depends on ρ²·N only)."""
    return one_sided_halfwidth(1.0, tuning_rho2(planned, alpha) * max(n_total, 1.0), alpha)


def _rate_variance(
    p_t: float, p_c: float, q_t: float, q_c: float, n_t: float, n_c: float, m: float, s: float
) -> float:
    """The rate test's variance at margin m for expected counts (as the controller computes it)."""
    arms = [
        RateArm(max(2, round(n)), p * q, q, p * (1.0 - p) / q)
        for p, q, n in ((p_t, q_t, n_t), (p_c, q_c, n_c))
    ]
    return RateContrast(arms[0], arms[1], s).at(m)[1]


def _mde_rows(
    plan: RolloutPlan,
    guards: list[tuple[Metric, Margin]],
    traffic: Traffic,
    known: Mapping[str, BaselineStat],
) -> list[MdeRow]:
    k = len(guards)
    families = plan.evaluated_stages() if plan.guardrail_window == "stage" else 1
    a_rb = guardrail_alpha(plan.alpha, range(k), families)
    z_b = float(sps.norm.ppf(POWER))
    rows = []
    for metric, margin in guards:
        base = known.get(metric.name)
        if base is None and margin.rate:
            base = BaselineStat(ASSUMED_RATE, None, "assumed")
        for i in range(plan.evaluated_stages()):
            stage = plan.stage(i)
            rows.append(_mde_row(plan, metric, margin, base, stage, traffic, a_rb, z_b))
    return rows


def _mde_row(
    plan: RolloutPlan, metric: Metric, margin: Margin, base: BaselineStat | None, stage: Stage,
    traffic: Traffic, a_rb: float, z_b: float,
) -> MdeRow:  # fmt: skip
    w = stage.percent / 100.0
    end = _stage_end(plan, stage, traffic)
    units = traffic.units_in(end)
    n_t, n_c = w * units, (1 - w) * units
    q_t, q_c = w * traffic.requests_per_s * end, (1 - w) * traffic.requests_per_s * end
    scale = "relative" if margin.kind == "relative" else "absolute"
    mean = None if base is None else base.mean
    eff = margin.relative if scale == "relative" else margin.effective(mean)
    row: dict[str, Any] = {
        "metric": metric.name, "stage_index": stage.index, "stage_percent": stage.percent, "seconds": end,
        "units_control": n_c, "units_candidate": n_t, "baseline": mean,
        "baseline_source": None if base is None else base.source, "harm_scale": scale, "margin": eff,
    }  # fmt: skip
    if margin.method == "mann_whitney":
        note = "rank test on per-batch quantiles (20 batches of whole units): no closed-form MDE"
        return MdeRow(**row, mde=None, detectable=None, note=note)
    if base is None or eff is None:
        why = (
            "no baseline (set baselines in the plan or send traffic first)"
            if base is None
            else "margin undefined at a zero baseline"
        )
        return MdeRow(**row, mde=None, detectable=None, note=why)

    def variance(h: float, seconds: float) -> float | None:
        """Var of the test statistic at the margin, for a candidate with harm h, after ``seconds``."""
        f = seconds / end  # requests grow with time; units a little slower (ignored: conservative)
        if margin.rate and margin.absolute is not None:
            s = 1.0 if metric.direction == "lower_is_better" else -1.0
            p_t = base.mean + s * h
            if not 0.0 <= p_t <= 1.0:
                return None
            return _rate_variance(p_t, base.mean, q_t * f, q_c * f, n_t * f, n_c * f, eff, s)
        if margin.rate:  # a relative margin on a rate: binomial per request
            sd2, nt, nc = base.mean * (1 - base.mean), q_t * f, q_c * f
        elif base.sd is None:
            return None
        else:
            sd2, nt, nc = base.sd**2, n_t * f, n_c * f
        v = sd2 / nt + sd2 / nc
        return v / (base.mean * base.mean) if scale == "relative" else v

    if scale == "relative" and base.mean == 0:
        return MdeRow(**row, mde=None, detectable=None, note="relative margin undefined at a zero baseline")
    z = _z_boundary(plan, a_rb, n_t + n_c) + z_b
    h = eff
    for _ in range(60):
        v = variance(h, end)
        if v is None:
            return MdeRow(**row, mde=None, detectable=None, note="no baseline sd (set baselines.<metric>.sd)")
        new = eff + z * math.sqrt(v)
        if abs(new - h) < 1e-12 * max(1.0, abs(h)):
            break
        h = new
    ni_s = None
    if stage.promotion:
        ni_s = _noninferiority_seconds(plan, variance, eff, end, n_t + n_c, z_b)
    return MdeRow(**row, mde=h, detectable=h <= DETECTABLE_MULTIPLE * eff if eff > 0 else None,
                  noninferiority_s=ni_s)  # fmt: skip


def _noninferiority_seconds(
    plan: RolloutPlan,
    variance: Callable[[float, float], float | None],
    margin: float,
    end: float,
    n_end: float,
    z_b: float,
) -> float | None:
    """Seconds until an equal candidate is shown non-inferior with 80% power (None: never)."""
    if margin <= 0:
        return None
    t = end
    for _ in range(40):
        v = variance(0.0, t)
        if v is None or v <= 0:
            return None
        z = _z_boundary(plan, plan.noninferiority_alpha, n_end * t / end) + z_b
        new = t * (z * math.sqrt(v) / margin) ** 2  # V ∝ 1/t
        if abs(new - t) < 1e-6 * t:
            break
        t = new
    return t


def _traffic_warnings(plan: RolloutPlan, rows: list[MdeRow], traffic: Traffic) -> list[str]:
    warnings = []
    for i in range(plan.evaluated_stages()):
        stage = plan.stage(i)
        end = _stage_end(plan, stage, traffic)
        if end > stage.min_duration_s * 1.05 and end > 1.0:
            expected = stage.percent / 100.0 * traffic.units_in(stage.min_duration_s)
            warnings.append(
                f"stage {stage.percent:g}%: ~{expected:.0f} candidate units expected in its {stage.min_duration_s:g} s; "
                f"it needs {max(stage.min_units, plan.min_test_units)} (min_units, and min_test_units per "
                f"variant), so expect ~{end:.0f} s"
            )
    by_metric: dict[str, list[MdeRow]] = {}
    for r in rows:
        if r.detectable is False:
            by_metric.setdefault(r.metric, []).append(r)
    for metric, bad in by_metric.items():
        worst = max(bad, key=lambda r: r.mde or 0.0)
        stages = ", ".join(f"{r.stage_percent:g}%" for r in bad)
        warnings.append(
            f"{metric}: at stage(s) {stages} a harm up to {_fmt(worst.mde, worst.harm_scale)} "
            f"({(worst.mde or 0) / (worst.margin or 1):.1f}× the margin {_fmt(worst.margin, worst.harm_scale)}) "
            f"may pass before the stage can end at this traffic; lengthen min_duration_s there "
            f"(stage_overrides) or expect it to be caught at a later stage"
        )
    for r in rows:
        if r.noninferiority_s is not None and r.seconds is not None and r.noninferiority_s > r.seconds * 1.05:
            warnings.append(
                f"{r.metric}: showing non-inferiority at the promotion stage {r.stage_percent:g}% takes ~"
                f"{r.noninferiority_s:.0f} s for an equal candidate (80% power) against a stage minimum of "
                f"{r.seconds:.0f} s: the rollout will hold there until then"
            )
        elif r.noninferiority_s is None and r.stage_index == plan.promotion_stage() and r.mde is not None:
            warnings.append(f"{r.metric}: non-inferiority can never be shown at a zero margin")
    return warnings


def _fmt(v: float | None, scale: str) -> str:
    if v is None:
        return "?"
    return f"{v:+.1%}" if scale == "relative" else f"{v:+.4g}"
