"""What the controller decides from one look at a running rollout stage (pure policy).

Order of the rules (the first that applies wins):

1. a guardrail is worse than its margin with confidence → **rollback** (safety first:
   reverting to the known-good baseline is allowed even when the split looks broken);
2. sample ratio mismatch among units active in this stage → ``on_srm``: **hold** (default),
   **rollback**, or **warn** (recorded in the evidence, then the rules below);
3. fewer than 2 units in either variant → **hold** (no data);
4. the stage's minimums (time since ``stage_started_at``, candidate units active in the
   stage) are not met → **hold**;
5. ``require_noninferiority`` and a guardrail is not yet non-inferior → **hold**;
6. final stage → ``on_complete``: **promote** (candidate becomes the baseline) or **hold**;
7. otherwise → **advance** to the next stage.

``code`` is a stable machine word per rule; the store uses it to de-duplicate repeated
identical holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analytics.rollout.evidence import GuardrailCheck, SrmLook, SuccessCheck
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

    def evidence(self, code: str) -> dict[str, Any]:
        return {
            "code": code,
            "stage_percent": self.stage.percent,
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
        }


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1%}"


def decide(plan: RolloutPlan, look: Look) -> Decision:
    stage = look.stage
    idx = stage.index

    def out(decision: str, code: str, reason: str, to_stage: int | None = None) -> Decision:
        return Decision(
            decision, reason, code, idx, idx if to_stage is None else to_stage, look.evidence(code)
        )

    harmed = [g for g in look.guardrails if g.outcome == "harm"]
    if harmed:
        g = harmed[0]
        return out(
            "rollback",
            "guardrail",
            f"guardrail {g.metric} worse than its {g.margin:.0%} margin: harm {_fmt(g.harm)}, "
            f"always-valid lower bound {_fmt(g.lower)} (alpha {g.alpha:.3g}; "
            f"n control {g.n_control}, candidate {g.n_candidate})",
        )
    warn = ""
    if look.srm.flagged:
        srm = f"sample ratio mismatch in this stage (p={look.srm.p_value:.2g}, units {look.srm.counts})"
        if plan.on_srm == "rollback":
            return out("rollback", "srm", srm + "; on_srm=rollback")
        if plan.on_srm == "hold":
            return out("hold", "srm", srm + "; holding until the split is healthy")
        warn = f" (warning: {srm})"
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
    if plan.require_noninferiority:
        pending = [g.metric for g in look.guardrails if g.outcome != "noninferior"]
        if pending:
            return out(
                "hold", "noninferiority", f"guardrails not yet non-inferior: {', '.join(pending)}" + warn
            )
    checked = ", ".join(f"{g.metric} {g.outcome}" for g in look.guardrails) or "no guardrails"
    if stage.last:
        if plan.on_complete == "promote":
            return out(
                "promote", "complete", f"final stage {stage.percent:g}% passed ({checked}); promoting" + warn
            )
        return out(
            "hold", "final", f"final stage {stage.percent:g}% passed ({checked}); on_complete=hold" + warn
        )
    nxt = plan.stage(idx + 1)
    return out(
        "advance",
        "minimums_met",
        f"stage {stage.percent:g}% passed ({checked}); advancing to {nxt.percent:g}%" + warn,
        to_stage=idx + 1,
    )
