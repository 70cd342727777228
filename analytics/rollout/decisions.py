"""What the controller decides from one look at a running rollout stage (pure policy).

Fail closed: no data, too few units, an undefined margin or a test that could not run is
never a pass, and promotion needs non-inferiority *shown*. Rules in order (the first that
applies wins):

1. a tested guardrail is worse than its margin with confidence → **rollback** (safety
   first: reverting to the known-good baseline is allowed even when the split looks broken);
1b. the plan's ``rl_risks``: a category guardrail over its margin (``on_category_breach``:
   **rollback**, the default) or an alarm listed in ``rollback_on`` → **rollback**, naming
   the category or the alarm;
2. sample ratio mismatch among units active in this stage → ``on_srm``: **hold** (default),
   **rollback**, or **warn** (recorded in the evidence, then the rules below);
2b. a category guardrail over its margin with ``on_category_breach: hold``, or an alarm
   listed in ``hold_on`` → **hold**, naming it;
3. a stage without control traffic (a 100% stage, reachable only when a plan was edited
   under a running rollout) → **hold**: nothing can be tested there, and serving everyone is
   the promotion, decided one stage earlier;
4. fewer than 2 units in either variant → **hold** (no data);
5. the stage's minimums (time since ``stage_started_at``, candidate units active in the
   stage) are not met → **hold**;
6. a guardrail is not tested (too few units in a variant, no data, an undefined margin, a
   test that could not run) → **hold**, naming what each one lacks;
7. the promotion stage (the last with control traffic) → **hold** while the plan declares
   category guardrails and no category has been tested, or an alarm it acts on cannot be
   evaluated (no judge, no stored text, too few units); else **promote** once every guardrail
   is non-inferior (``on_complete: hold`` holds instead), else **hold**;
8. ``require_noninferiority`` and a guardrail not yet non-inferior → **hold**;
9. otherwise → **advance** to the next stage.

``code`` is a stable machine word per rule; the store uses it to de-duplicate repeated
identical holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analytics.rollout.evidence import GuardrailCheck, RiskLook, SrmLook, SuccessCheck
from analytics.rollout.plan import RolloutPlan, Stage


@dataclass(frozen=True, slots=True)
class Decision:
    decision: str  # start | advance | hold | rollback | promote | pause | resume
    reason: str
    code: str
    stage: int | None
    to_stage: int | None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Look:
    """Everything measured at one look at the current stage."""

    stage: Stage
    elapsed_s: float
    candidate_units_in_stage: int
    n_control: int
    n_candidate: int
    guardrails: tuple[GuardrailCheck, ...]
    srm: SrmLook
    success: tuple[SuccessCheck, ...] = ()
    window: str = "stage"
    sequential: str = "always_valid"  # the plan's sequential mode
    risks: RiskLook | None = None  # the plan's rl_risks rules (None: the plan has none)

    def evidence(self, code: str) -> dict[str, Any]:
        group: dict[str, Any] = {}
        if self.sequential == "group":
            # looks taken per guardrail: a hold at a new look is recorded (control.rollout)
            group["group_looks"] = {
                g.metric: len((g.sequential or {}).get("fractions") or ()) for g in self.guardrails
            }
        return {
            **group,
            "sequential_mode": self.sequential,
            "code": code,
            "stage_index": self.stage.index,
            "stage_percent": self.stage.percent,
            "promotion_stage": self.stage.promotion,
            "window": self.window,
            "elapsed_s": round(self.elapsed_s, 3),
            "min_duration_s": self.stage.min_duration_s,
            "min_units": self.stage.min_units,
            "units": {
                "control": self.n_control,
                "candidate": self.n_candidate,
                "candidate_in_stage": self.candidate_units_in_stage,
            },
            "guardrails": [g.evidence() for g in self.guardrails],
            "srm": {
                "flagged": self.srm.flagged,
                "p_value": self.srm.p_value,
                "counts": self.srm.counts,
                "weights": self.srm.weights,
                "message": self.srm.message,
            },
            "success": [
                {"metric": s.metric, "lift": s.lift, "lower": s.lower, "upper": s.upper, "p_value": s.p_value}
                for s in self.success
            ],
            "rl_risks": self.risks.evidence() if self.risks is not None else None,
        }


def _num(v: float | None, scale: str) -> str:
    if v is None:
        return "none"
    return f"{v:+.1%}" if scale == "relative" else f"{v:+.4g}"


def _bound_name(g: GuardrailCheck) -> str:
    seq = g.sequential or {}
    if seq.get("mode") == "group":
        return f"group look {seq.get('look')}/{seq.get('looks')} ({seq.get('spending')}) lower bound"
    return "lower bound" if g.test == "mann_whitney" else "always-valid lower bound"


def _harm_reason(g: GuardrailCheck) -> str:
    seq = g.sequential or {}
    level = f"alpha {g.alpha:.3g}"
    if seq.get("mode") == "group" and seq.get("adjusted_alpha") is not None:
        level += f", adjusted to {seq['adjusted_alpha']:.3g} at this look"
    return (
        f"guardrail {g.metric} worse than its margin {g.margin_text}: harm {_num(g.harm, g.harm_scale)}, "
        f"{_bound_name(g)} {_num(g.lower, g.harm_scale)} > {_num(g.margin, g.harm_scale)} "
        f"({level}; n control {g.n_control}, candidate {g.n_candidate})"
    )


def _pending_reason(g: GuardrailCheck) -> str:
    seq = g.sequential or {}
    over = ""
    if seq.get("mode") == "group" and seq.get("carried") and seq.get("next_look_units") is None:
        over = "; every planned group look is taken, so it never will: promote or roll back by hand"
    elif seq.get("mode") == "group" and seq.get("next_look_units") is not None:
        over = f" (next group look at {seq['next_look_units']} units)"
    return (
        f"{g.metric} upper bound {_num(g.upper, g.harm_scale)} not below its margin "
        f"{_num(g.margin, g.harm_scale)} yet (alpha {g.alpha_noninferiority or g.alpha:.3g}){over}"
    )


def _summary(guardrails: tuple[GuardrailCheck, ...]) -> str:
    return ", ".join(f"{g.metric} {g.outcome}" for g in guardrails) or "no guardrails"


def decide(plan: RolloutPlan, look: Look) -> Decision:
    stage = look.stage
    idx = stage.index

    def out(decision: str, code: str, reason: str, to_stage: int | None = None) -> Decision:
        return Decision(
            decision, reason, code, idx, idx if to_stage is None else to_stage, look.evidence(code)
        )

    harmed = [g for g in look.guardrails if g.outcome == "harm"]
    if harmed:
        return out("rollback", "guardrail", _harm_reason(harmed[0]))
    risks = look.risks
    if risks is not None:
        if risks.breaches and risks.on_category_breach == "rollback":
            return out("rollback", "category_guardrail", "; ".join(risks.breaches))
        roll = [(a, d) for a, d in risks.firing if a in risks.rollback_on]
        if roll:
            return out("rollback", "rl_risk", "; ".join(f"RL-risk alarm {a}: {d}" for a, d in roll))
    warn = ""
    if look.srm.flagged:
        srm = f"sample ratio mismatch in this stage (p={look.srm.p_value:.2g}, units {look.srm.counts})"
        if plan.on_srm == "rollback":
            return out("rollback", "srm", srm + "; on_srm=rollback")
        if plan.on_srm == "hold":
            return out("hold", "srm", srm + "; holding until the split is healthy")
        warn = f" (warning: {srm})"
    if risks is not None:
        if risks.breaches:  # on_category_breach: hold
            return out(
                "hold", "category_guardrail", "; ".join(risks.breaches) + "; on_category_breach=hold" + warn
            )
        held = [(a, d) for a, d in risks.firing if a in risks.hold_on]
        if held:
            return out(
                "hold", "rl_risk", "; ".join(f"RL-risk alarm {a}: {d}" for a, d in held) + "; holding" + warn
            )
    if not stage.evaluated:
        return out(
            "hold",
            "no_control",
            f"stage {stage.percent:g}% has no control traffic, so nothing can be tested or promoted on "
            f"evidence here; promote or roll back by hand" + warn,
        )
    if min(look.n_control, look.n_candidate) < 2:
        return out("hold", "no_data", "waiting for data: a variant has fewer than 2 units" + warn)
    waiting = []
    if look.elapsed_s < stage.min_duration_s:
        waiting.append(f"{look.elapsed_s:.0f}/{stage.min_duration_s:.0f} s")
    if look.candidate_units_in_stage < stage.min_units:
        waiting.append(f"{look.candidate_units_in_stage}/{stage.min_units} candidate units")
    if waiting:
        return out(
            "hold", "minimums", f"stage {stage.percent:g}% minimums not met: {', '.join(waiting)}" + warn
        )
    untested = [g for g in look.guardrails if not g.tested]
    if untested:
        lacks = "; ".join(f"{g.metric}: {g.lacking or g.outcome}" for g in untested)
        return out("hold", "untested", f"guardrails not tested yet: {lacks}" + warn)
    pending = [g for g in look.guardrails if g.outcome != "noninferior"]
    if stage.promotion:
        if risks is not None and risks.untested:
            return out(
                "hold",
                "category_guardrail",
                "promotion needs the category guardrails tested: no category has "
                "enough units in both arms yet" + warn,
            )
        if risks is not None and risks.unevaluated:
            states = ", ".join(f"{a} ({risks.states.get(a)})" for a in risks.unevaluated)
            return out("hold", "rl_risk", f"promotion needs the RL-risk alarms evaluated: {states}" + warn)
        if pending:
            return out(
                "hold",
                "noninferiority",
                f"promotion at {stage.percent:g}% needs every guardrail shown non-inferior: "
                + "; ".join(_pending_reason(g) for g in pending)
                + warn,
            )
        shown = f"every guardrail non-inferior ({_summary(look.guardrails)})"
        if plan.on_complete == "promote":
            return out("promote", "complete", f"stage {stage.percent:g}%: {shown}; promoting" + warn)
        return out("hold", "final", f"stage {stage.percent:g}%: {shown}; on_complete=hold" + warn)
    if plan.require_noninferiority and pending:
        return out(
            "hold",
            "noninferiority",
            "require_noninferiority: " + "; ".join(_pending_reason(g) for g in pending) + warn,
        )
    nxt = plan.stage(idx + 1)
    return out(
        "advance",
        "minimums_met",
        f"stage {stage.percent:g}% passed ({_summary(look.guardrails)}); advancing to {nxt.percent:g}%"
        + warn,
        to_stage=idx + 1,
    )
