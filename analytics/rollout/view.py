"""What the report shows of a rollout, from the controller's own definitions and evidence.

One source of truth: the report's verdict on a rollout is derived from the evidence the
controller acts on — the plan's guardrails with their margins, tested on the plan's window
(by default the current stage's traffic) by :func:`analytics.rollout.controller.measure` —
never from a second, differently defined set of tests. While the rollout runs that evidence
is a live look taken at the report's time (and :func:`~analytics.rollout.decisions.decide`
says what the controller's rules make of it); once it has ended (promoted, rolled back,
stopped) it is the evidence recorded with the decision that ended it.

The report's table stays cumulative (every unit since the start). Its plan-guardrail cells
are the controller's test on the report's cumulative statistics (:func:`cumulative_checks`),
and wherever the
cumulative table disagrees with the verdict's evidence, :func:`differences` says so and why
(a different window, a fixed-horizon request-level quantile, a metric the plan does not
guard).

Evidence is read as the JSON the controller records (``Look.evidence``): keys this module
does not know are carried through untouched, and an outcome it does not know counts as
"no evidence" (fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from analytics.report.catalogue import Metric
from analytics.report.schema import (
    ErrorInfo,
    Guardrail,
    GuardrailOutcome,
    RolloutDecision,
    RolloutGuardrail,
    RolloutLook,
    RolloutSection,
    SrmCheck,
    VariantResult,
    Verdict,
)
from analytics.rollout.controller import measure, resolve_guardrails
from analytics.rollout.decisions import Look, decide
from analytics.rollout.evidence import check_guardrail, guardrail_alpha
from analytics.rollout.margins import Margin
from analytics.rollout.plan import PlanError, RolloutPlan, parse_plan
from analytics.stats.sufficient import SampleStats
from control import rollout

#: Decisions kept in the report (the dashboard reads the whole timeline from the rollout API).
RECENT_DECISIONS = 5
_LIVE_STATUSES = ("running", "paused")
_PAST = {
    "start": "started", "advance": "advanced", "hold": "held", "rollback": "rolled back",
    "promote": "promoted", "pause": "paused", "resume": "resumed",
}  # fmt: skip
_KNOWN = ("harm", "noninferior", "inconclusive")
_CELL: dict[str, GuardrailOutcome] = {"harm": "fail", "noninferior": "pass"}


@dataclass(frozen=True, slots=True)
class RolloutState:
    """A rollout experiment as the controller sees it: its row and its parsed plan."""

    row: rollout.RolloutRow
    plan: RolloutPlan | None
    plan_error: str | None

    @property
    def started(self) -> bool:
        return (
            self.plan is not None
            and self.row.stage is not None
            and self.row.stage_started_at is not None
            and self.row.control is not None
            and self.row.candidate is not None
        )

    def stage_percent(self, stage: int | None) -> float | None:
        if self.plan is None or stage is None or not 0 <= stage < len(self.plan.stages):
            return None
        return self.plan.stages[stage]


def load_state(conn: Connection, experiment_id: int) -> RolloutState | None:
    row = rollout.load(conn, experiment_id)
    if row is None or row.mode != "rollout":
        return None
    try:
        return RolloutState(row, parse_plan(row.plan), None)
    except PlanError as exc:
        return RolloutState(row, None, str(exc))


def plan_guardrails(conn: Connection, state: RolloutState) -> tuple[list[tuple[Metric, Margin]], str | None]:
    """(metric, margin) of the plan's guardrails as the controller resolves them, or why not."""
    if state.plan is None:
        return [], f"invalid rollout plan: {state.plan_error}"
    try:
        guards, _ = resolve_guardrails(conn, state.plan)
    except PlanError as exc:
        return [], f"invalid rollout plan: {exc}"
    return guards, None


def _look(conn: Connection, state: RolloutState, now: datetime, grace_s: float, plan: RolloutPlan) -> Look:
    row = state.row
    assert row.stage is not None
    return measure(conn, row, plan, plan.stage(min(row.stage, len(plan.stages) - 1)), now, grace_s)


def live_look(conn: Connection, state: RolloutState, now: datetime, grace_s: float) -> RolloutLook | None:
    """The controller's evidence on the plan's window now, and what its rules decide on it."""
    if not state.started or state.plan is None:
        return None
    look = _look(conn, state, now, grace_s, state.plan)
    decision = decide(state.plan, look)
    return RolloutLook(at=now, decision=decision.decision, reason=decision.reason, evidence=decision.evidence)


def cumulative_checks(
    state: RolloutState,
    guards: Sequence[tuple[Metric, Margin]],
    stats: Mapping[str, Mapping[str, SampleStats]],
) -> dict[str, Guardrail]:
    """The controller's guardrail test (:func:`~analytics.rollout.evidence.check_guardrail`,
    at the alpha it uses with cumulative windows) on the report's cumulative statistics —
    every unit since the start — as the table's cells."""
    row, plan = state.row, state.plan
    if plan is None or row.control is None or row.candidate is None:
        return {}
    alpha = guardrail_alpha(plan.alpha, guards)
    out: dict[str, Guardrail] = {}
    for metric, margin in guards:
        per_variant = stats.get(metric.name, {})
        check = check_guardrail(
            metric, margin, per_variant.get(row.control.name), per_variant.get(row.candidate.name),
            alpha=alpha, planned_units=plan.planned_units, min_test_units=plan.min_test_units,
        )  # fmt: skip
        out[metric.name] = _cell(check.evidence())
    return out


def _cell(g: Mapping[str, Any]) -> Guardrail:
    outcome: GuardrailOutcome = _CELL.get(str(g.get("outcome")), "inconclusive")
    upper = g.get("upper")
    # The evidence bounds the harm (relative, or absolute in metric units: ``harm_scale``);
    # the table shows the worst end as a lift on the same scale.
    bound = None if upper is None else (-upper if g.get("direction") == "increase" else upper)
    err = None
    if outcome == "inconclusive" and g.get("outcome") != "inconclusive":
        err = ErrorInfo(
            code=str(g.get("outcome") or "no_data"), message=str(g.get("message") or "no evidence")
        )
    return Guardrail(
        outcome=outcome, margin=float(g.get("margin") or 0.0), bound=bound, p_value=g.get("p_value"), error=err,
        scale="absolute" if _absolute(g) else "relative", margin_text=g.get("margin_text") or None,
    )  # fmt: skip


def _decision(d: rollout.DecisionRow) -> RolloutDecision:
    return RolloutDecision(
        id=d.id, created_at=d.created_at, decision=d.decision, reason=d.reason, actor=d.actor,
        stage=d.stage, to_stage=d.to_stage, evidence=dict(d.evidence or {}),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Basis:
    """The evidence a rollout verdict rests on."""

    evidence: Mapping[str, Any] | None
    short: str  # "promoted at 50% on stage-window evidence"
    long: str


def _window(state: RolloutState) -> str:
    return state.plan.guardrail_window if state.plan is not None else "stage"


def choose_basis(
    state: RolloutState, look: RolloutLook | None, decisions: Sequence[RolloutDecision]
) -> Basis:
    """Live look while the rollout runs; afterwards the decision that ended it (or, for an
    operator's action without evidence, the controller's last recorded evidence)."""
    window = _window(state)
    if state.row.status in _LIVE_STATUSES and look is not None:
        pct = look.evidence.get("stage_percent")
        where = f"at {pct:g}%" if isinstance(pct, int | float) else "at the current stage"
        short = f"the controller's live look {where} on {window}-window evidence"
        return Basis(look.evidence, short, f"{short} ({look.at:%Y-%m-%d %H:%M:%S} UTC); its rules say: "
                     f"{look.decision} — {look.reason}")  # fmt: skip
    with_evidence = [d for d in decisions if isinstance(d.evidence.get("guardrails"), list)]
    if not with_evidence:
        if look is not None:
            short = f"a look at the last stage on {window}-window evidence"
            return Basis(look.evidence, short, f"{short} (no decision recorded its evidence)")
        return Basis(None, "no controller evidence", "no decision of the controller recorded evidence yet")
    last = decisions[-1] if decisions else None
    used = with_evidence[-1]
    short = f"{_past(used)} {_at(state, used)} on {window}-window evidence"
    text = f"{short} ({used.created_at:%Y-%m-%d %H:%M:%S} UTC, by {used.actor})"
    if last is not None and last.id != used.id and not last.evidence.get("guardrails"):
        text = f"{_past(last)} by {last.actor} ({last.reason}); the controller's last evidence: {text}"
    return Basis(used.evidence, short, text)


def _past(d: RolloutDecision) -> str:
    return _PAST.get(d.decision, d.decision)


def _at(state: RolloutState, d: RolloutDecision) -> str:
    pct = d.evidence.get("stage_percent")
    if not isinstance(pct, int | float):
        pct = state.stage_percent(d.stage)
    return f"at {pct:g}%" if pct is not None else f"at stage {d.stage}"


def build_section(
    conn: Connection,
    state: RolloutState,
    guards: Sequence[tuple[Metric, Margin]],
    problem: str | None,
    now: datetime,
    grace_s: float,
) -> tuple[RolloutSection, Basis]:
    """The report's ``rollout`` section and the basis of its verdict (``guards``/``problem``
    from :func:`plan_guardrails`)."""
    look = live_look(conn, state, now, grace_s) if problem is None else None
    rows = rollout.decisions(conn, state.row.id, limit=RECENT_DECISIONS)
    recent = [_decision(d) for d in rows]
    basis = choose_basis(state, look, _with_evidence_back(conn, state, recent))
    plan = state.plan
    section = RolloutSection(
        window=_window(state), stage=state.row.stage, stage_percent=state.stage_percent(state.row.stage),
        min_test_units=plan.min_test_units if plan else 0, planned_units=plan.planned_units if plan else 0,
        guardrails=[
            RolloutGuardrail(
                metric=m.name, margin=margin.relative, absolute_margin=margin.absolute,
                margin_text=margin.spec_text(),
            )
            for m, margin in guards
        ],
        look=look, decisions=recent, basis=basis.long,
        error=None if problem is None else ErrorInfo(code="plan_invalid", message=problem),
    )  # fmt: skip
    return section, basis


def _with_evidence_back(
    conn: Connection, state: RolloutState, recent: list[RolloutDecision]
) -> list[RolloutDecision]:
    """``recent``, reaching further back when none of them carries the controller's evidence."""
    if any(isinstance(d.evidence.get("guardrails"), list) for d in recent) or len(recent) < RECENT_DECISIONS:
        return recent
    return [_decision(d) for d in rollout.decisions(conn, state.row.id)]


# --- the verdict ----------------------------------------------------------------------------


def _pct(v: Any) -> str:
    return f"{v:+.1%}" if isinstance(v, int | float) else "n/a"


def _absolute(g: Mapping[str, Any]) -> bool:
    return g.get("harm_scale") == "absolute"


def _harm(g: Mapping[str, Any], key: str) -> str:
    """A harm figure on its own scale: relative (a percentage) or absolute (metric units)."""
    v = g.get(key)
    if not isinstance(v, int | float):
        return "n/a"
    return f"{v:+.4g}" if _absolute(g) else f"{v:+.1%}"


def _margin(g: Mapping[str, Any]) -> str:
    text = g.get("margin_text")
    if isinstance(text, str) and text:
        return text
    m = g.get("margin")
    if not isinstance(m, int | float):
        return "undefined"
    return f"+{m:.4g}" if _absolute(g) else f"{m:.0%}"


def rollout_verdict(
    candidate: str,
    basis: Basis,
    srm: SrmCheck,
    directions: Mapping[str, str],
    problem: str | None = None,
) -> Verdict:
    """The candidate's verdict from the controller's evidence (pure).

    harm: a guardrail harmed, or a success metric worse with confidence; srm: the report's
    per-stage check or the look's own flagged; insufficient_data: a guardrail without
    evidence (too few units, no control traffic, a test that could not run); ship: every
    plan guardrail shown non-inferior; no_difference_yet otherwise — including a plan with
    no guardrails, which shows nothing about safety.
    """
    kw: dict[str, Any] = {"variant": candidate, "basis": basis.long}
    if problem is not None:
        return Verdict(**kw, verdict="insufficient_data", reason=problem)
    ev = basis.evidence
    if ev is None:
        return Verdict(**kw, verdict="insufficient_data", reason="no evidence from the controller yet")
    guards = [g for g in ev.get("guardrails") or [] if isinstance(g, Mapping)]
    harmed = [g for g in guards if g.get("outcome") == "harm"]
    better, worse = _success(ev.get("success") or [], directions)
    kw |= {"better": better, "worse": worse, "failed_guardrails": sorted(str(g["metric"]) for g in harmed)}
    if harmed or worse:
        why = [
            f"guardrail {g['metric']} worse than its margin ({_margin(g)}): harm {_harm(g, 'harm')}, "
            f"always-valid lower bound {_harm(g, 'lower')} (n control {g.get('n_control')}, "
            f"candidate {g.get('n_candidate')})"
            for g in harmed
        ] + [
            f"{m} worse with confidence (a success metric: reported, never gating the controller)"
            for m in worse
        ]
        return Verdict(**kw, verdict="harm", reason="; ".join(why))
    look_srm = ev.get("srm") if isinstance(ev.get("srm"), Mapping) else {}
    if srm.flagged or (look_srm or {}).get("flagged"):
        p = srm.p_value if srm.flagged else (look_srm or {}).get("p_value")
        where = "in a stage" if srm.flagged else "in the controller's stage window"
        return Verdict(
            **kw, verdict="srm", reason=f"sample ratio mismatch {where} (p={p if p is None else f'{p:.2g}'})"
        )
    if not guards:
        return Verdict(**kw, verdict="no_difference_yet",
                       reason="the plan tests no guardrail: nothing shows the candidate is safe")  # fmt: skip
    lacking = [g for g in guards if g.get("outcome") not in _KNOWN]
    if lacking:
        missing = "; ".join(f"{g['metric']}: {g.get('message') or g.get('outcome')}" for g in lacking)
        return Verdict(**kw, verdict="insufficient_data", reason=f"no evidence for {missing}")
    pending = [g for g in guards if g.get("outcome") != "noninferior"]
    if pending:
        open_ = ", ".join(
            f"{g['metric']} (harm {_harm(g, 'harm')}, upper bound {_harm(g, 'upper')} vs margin {_margin(g)})"
            for g in pending
        )
        return Verdict(
            **kw, verdict="no_difference_yet", reason=f"guardrails not yet shown non-inferior: {open_}"
        )
    shown = ", ".join(str(g["metric"]) for g in guards)
    extra = f"; better on {', '.join(better)}" if better else ""
    return Verdict(**kw, verdict="ship", reason=f"every plan guardrail shown non-inferior ({shown}){extra}")


def _success(items: Sequence[Any], directions: Mapping[str, str]) -> tuple[list[str], list[str]]:
    better: list[str] = []
    worse: list[str] = []
    for s in items:
        if not isinstance(s, Mapping) or s.get("lower") is None or s.get("upper") is None:
            continue
        up = directions.get(str(s.get("metric")), "increase") == "increase"
        lo, hi = float(s["lower"]), float(s["upper"])
        if lo > 0:
            (better if up else worse).append(str(s["metric"]))
        elif hi < 0:
            (worse if up else better).append(str(s["metric"]))
    return sorted(better), sorted(worse)


def differences(
    verdict: Verdict, basis: Basis, rows: Sequence[VariantResult], plan_metrics: Sequence[str], window: str
) -> list[str]:
    """Where the cumulative table disagrees with the verdict's evidence, and why (pure)."""
    out: list[str] = []
    where = basis.short
    for r in rows:
        if r.is_control or r.variant != verdict.variant:
            continue
        g = r.guardrail
        if g is not None and g.outcome == "fail" and r.metric not in verdict.failed_guardrails:
            if g.test == "fixed_horizon":
                why = "fixed-horizon, request-level"
                if r.metric not in plan_metrics:
                    why += "; not a plan guardrail (quantiles have no per-unit always-valid test)"
            elif r.metric in plan_metrics:
                why = "always-valid, on every unit since the start"
                if window == "stage":
                    why += "; the controller compares the arms within a stage window, which drift over time cannot confound"
            else:
                why = "always-valid, on every unit since the start; not a plan guardrail"
            out.append(f"{where}; the cumulative report now shows {r.metric} failed — {why}")
        elif g is not None and g.outcome == "pass" and r.metric in verdict.failed_guardrails:
            out.append(
                f"{where}: {r.metric} harmed; the cumulative report shows it within its margin — "
                "the stage window is what the controller acts on"
            )
        elif (
            r.significant
            and r.better is False
            and r.metric not in verdict.worse
            and r.metric not in verdict.failed_guardrails
        ):
            out.append(
                f"{where}; the cumulative report now shows {r.metric} significantly worse — always-valid, "
                "on every unit since the start"
            )
    return out


def judge(
    conn: Connection,
    state: RolloutState,
    rows: Sequence[VariantResult],
    stats: Mapping[str, Mapping[str, SampleStats]],
    srm: SrmCheck,
    metrics: Sequence[Metric],
    guards: Sequence[tuple[Metric, Margin]],
    problem: str | None,
    now: datetime,
    grace_s: float,
) -> tuple[list[VariantResult], list[Verdict], RolloutSection]:
    """The report's rollout parts: the table with the controller's cumulative guardrail
    cells (``stats``: the report's cumulative sufficient statistics), the verdicts from the
    controller's evidence (with their differences), the section."""
    cells = cumulative_checks(state, guards, stats) if problem is None else {}
    table = [
        r.model_copy(update={"guardrail": cells[r.metric]}) if not r.is_control and r.metric in cells else r
        for r in rows
    ]
    section, basis = build_section(conn, state, guards, problem, now, grace_s)
    directions = {m.name: "increase" if m.direction == "higher_is_better" else "decrease" for m in metrics}
    plan_metrics = [m.name for m, _ in guards]
    if problem is None and state.row.candidate is None:
        problem = "a rollout needs exactly one control and one candidate variant"
    out: list[Verdict] = []
    for v in state.row.variants:
        if v.is_control:
            continue
        verdict = rollout_verdict(v.name, basis, srm, directions, problem)
        notes = differences(verdict, basis, table, plan_metrics, section.window)
        out.append(verdict.model_copy(update={"differences": notes}))
    return table, out, section


@dataclass(frozen=True, slots=True)
class ReportPart:
    """A rollout's share of its report (``analytics.report.assembly.RolloutPart``)."""

    state: RolloutState
    guards: list[tuple[Metric, Margin]]
    problem: str | None  # why the plan's guardrails cannot be judged, if they cannot

    @property
    def plan(self) -> RolloutPlan | None:
        return self.state.plan

    def judge(
        self,
        conn: Connection,
        rows: Sequence[VariantResult],
        stats: Mapping[str, Mapping[str, SampleStats]],
        srm: SrmCheck,
        metrics: Sequence[Metric],
        now: datetime,
        grace_s: float,
    ) -> tuple[list[VariantResult], list[Verdict], RolloutSection]:
        return judge(conn, self.state, rows, stats, srm, metrics, self.guards, self.problem, now, grace_s)


def report_part(conn: Connection, experiment_id: int) -> ReportPart | None:
    """The loader the report takes as ``ReportOptions.rollout`` (None: not a rollout)."""
    state = load_state(conn, experiment_id)
    if state is None:
        return None
    guards, problem = plan_guardrails(conn, state)
    return ReportPart(state, guards, problem)
