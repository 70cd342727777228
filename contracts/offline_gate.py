"""The offline gate's contract with whoever gives a candidate traffic.

* :func:`candidate_fingerprint` — what a gate decision vouches for: one candidate (upstream
  name, base URL, model, the gate's sampling parameters). The offline gate (``evals``) records
  it with each decision; the rollout controller and the admin API recompute it from the
  variant's *current* configuration, so they can never disagree about the formula.
* :func:`check` — may this candidate get traffic now? An experiment that declares an
  ``offline_gate`` (table ``offline_gates``, set with ``liftgate eval gate --declare``), or whose
  rollout plan says ``offline_gate: required``, may expose its candidate only when the newest
  gate decision matching the current declaration *and* the candidate's and baseline's current
  fingerprints has passed. No declaration where one is required, no decision, a decision for
  another model or URL or under another declaration, a failing decision: no traffic, and the
  reason says what to run. Read only; the gate writes decisions.
* :func:`serving` — which candidates answer users now whatever their gate says: those of a
  running A/B test (weight and coverage above 0). The test checked the gate when it started;
  a gate declared or decided later takes their users away only by pausing the test, which a
  failing decision does (``control.gates``). The report shows it; the writer pauses by it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from sqlalchemy import Connection, text

from contracts.rollout_plan import RolloutPlanSchema


def candidate_fingerprint(upstream: str, base_url: str, model: str, params: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical (sorted-key, compact) JSON of
    ``{"upstream", "base_url" (no trailing /), "model", "params" (nulls dropped)}``."""
    doc = {
        "upstream": upstream,
        "base_url": base_url.rstrip("/"),
        "model": model,
        "params": {k: v for k, v in params.items() if v is not None},
    }
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()


#: How many of a variant's newest decisions are searched for one matching its current setup.
_SEARCHED = 50


@dataclass(frozen=True, slots=True)
class GateCheck:
    required: bool
    passed: bool
    reason: str
    decision_id: int | None = None

    def public(self) -> dict[str, Any]:
        return {"required": self.required, "passed": self.passed, "reason": self.reason,
                "decision_id": self.decision_id}  # fmt: skip


def _target(conn: Connection, experiment_id: int, variant: str) -> tuple[str, str, str] | None:
    row = conn.execute(
        text(
            "SELECT u.name, u.base_url, v.model FROM variants v JOIN upstreams u ON u.id = v.upstream_id"
            " WHERE v.experiment_id = :e AND v.name = :v"
        ),
        {"e": experiment_id, "v": variant},
    ).first()
    return None if row is None else (str(row[0]), str(row[1]), str(row[2]))


def check(conn: Connection, experiment_id: int, candidate: str, control: str, *, required: bool) -> GateCheck:
    """Whether ``candidate`` may receive traffic (see the module docstring)."""
    declared = conn.execute(
        text("SELECT declaration FROM offline_gates WHERE experiment_id = :e"), {"e": experiment_id}
    ).scalar()
    if declared is None:
        if required:
            return GateCheck(True, False, "the rollout plan requires an offline gate but the experiment "
                             "declares none: declare one with `liftgate eval gate EXPERIMENT --declare FILE`")  # fmt: skip
        return GateCheck(False, True, "no offline gate declared")
    cand, base = _target(conn, experiment_id, candidate), _target(conn, experiment_id, control)
    if cand is None or base is None:
        return GateCheck(True, False, "offline gate: the rollout's variants are not configured")
    rows = conn.execute(
        text(
            "SELECT id, passed, verdict, reasons, params, candidate_fingerprint, baseline_fingerprint,"
            " declaration FROM gate_decisions WHERE experiment_id = :e AND variant = :v"
            " ORDER BY id DESC LIMIT :n"
        ),
        {"e": experiment_id, "v": candidate, "n": _SEARCHED},
    )
    for did, passed, verdict, reasons, params, fp_c, fp_b, declaration in rows:
        params = dict(params or {})
        if declaration != declared:
            continue
        if fp_c != candidate_fingerprint(*cand, params) or fp_b != candidate_fingerprint(*base, params):
            continue
        if passed:
            return GateCheck(True, True, f"offline gate passed (decision {did})", int(did))
        why = "; ".join(str(r) for r in (reasons or [])[:3]) or str(verdict)
        return GateCheck(True, False, f"offline gate failed (decision {did}): {why}", int(did))
    return GateCheck(True, False, (
        f"offline gate: no decision for {candidate!r} as configured now (upstream {cand[0]!r}, model "
        f"{cand[2]!r}) against {control!r} under the current declaration: run the declared suites "
        "(`liftgate eval run SUITE --experiment EXPERIMENT`) then `liftgate eval gate EXPERIMENT`"))  # fmt: skip


def serving(conn: Connection, experiment_id: int) -> set[str]:
    """The candidates of ``experiment_id`` that answer users now whatever their gate says (see
    the module docstring). A rollout's candidates are left to its controller, which holds or
    rolls back on the gate; shadow candidates answer no user."""
    rows = conn.execute(
        text(
            "SELECT v.name FROM experiments x JOIN variants v ON v.experiment_id = x.id"
            " WHERE x.id = :e AND x.status = 'running' AND x.mode = 'ab'"
            " AND x.coverage > 0 AND v.weight > 0 AND NOT v.is_control"
        ),
        {"e": experiment_id},
    )
    return {str(r[0]) for r in rows}


def required_by(plan: Any) -> bool:
    """Whether a rollout plan says ``offline_gate: required``. An unreadable plan requires
    nothing more (the controller refuses to run it anyway)."""
    if plan is None:
        return False
    try:
        return RolloutPlanSchema.model_validate(plan).offline_gate == "required"
    except ValidationError:
        return False
