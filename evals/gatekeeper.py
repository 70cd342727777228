"""Apply an experiment's offline gate: find the runs, pair them, decide, record the decision.

For each candidate variant and each declared suite, the newest *completed* run whose
fingerprint is the variant's current one (upstream, base URL, model, the declaration's
parameters) is paired with the control's, item by item. Missing runs, runs of another
fingerprint, failed calls and unpaired items are problems that fail the gate before any
statistics (fail closed). Every decision is stored in ``gate_decisions`` with its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from evals import store
from evals.gate import CategoryResults, Decision, OfflineGate, category_results, decide
from evals.runner import fingerprint
from evals.store import ExperimentInfo, Target


@dataclass(frozen=True, slots=True)
class GateOutcome:
    decision_id: int
    candidate: Target
    baseline: Target
    decision: Decision
    suites: tuple[dict[str, Any], ...]
    #: Why the decision paused the experiment's running A/B test (it showed this failing
    #: candidate to users), when it did: ``control.gates``' reason, as ``status_reason`` says.
    paused: str | None = None


def gate_for(conn: Any, exp: ExperimentInfo, given: OfflineGate | None) -> OfflineGate:
    if given is not None:
        return given
    stored = store.declaration(conn, exp.id)
    if stored is None:
        raise store.StoreError(
            f"experiment {exp.name!r} declares no offline_gate (set one with --declare FILE)"
        )
    return OfflineGate.model_validate(stored)


def _pair(conn: Any, exp: ExperimentInfo, gate: OfflineGate, baseline: Target, candidate: Target
          ) -> tuple[list[CategoryResults], list[str], list[dict[str, Any]]]:  # fmt: skip
    fp_b, fp_c = fingerprint(baseline, gate.params), fingerprint(candidate, gate.params)
    pooled_b: dict[str, tuple[str, float]] = {}
    pooled_c: dict[str, tuple[str, float]] = {}
    problems: list[str] = []
    suites: list[dict[str, Any]] = []
    for suite in gate.suites:
        runs = {}
        for role, target, fp in (("baseline", baseline, fp_b), ("candidate", candidate, fp_c)):
            run = store.latest_run(conn, exp.id, str(target.variant), suite, fp, gate.samples)
            if run is None or run.status != "completed":
                state = "none" if run is None else run.status
                problems.append(f"no completed run of {suite} for {target.variant} with its current fingerprint "
                                f"({state}): run `liftgate eval run {suite} --experiment {exp.name}`")  # fmt: skip
                continue
            runs[role] = run
        suites.append({"suite": suite, **{f"{r}_run": run.id for r, run in runs.items()}})
        if len(runs) != 2:
            continue
        outcomes = {}
        for role, run in runs.items():
            items, errors = store.run_outcomes(conn, run.id)
            if errors:
                problems.append(f"{errors} calls failed in {suite} for {run.variant}: rerun to retry them")
            outcomes[role] = items
        pooled_b.update({f"{suite}/{k}": v for k, v in outcomes["baseline"].items()})
        pooled_c.update({f"{suite}/{k}": v for k, v in outcomes["candidate"].items()})
    results, unpaired = category_results(pooled_b, pooled_c)
    return results, problems + unpaired, suites


def evaluate(engine: Engine, experiment_ref: str, given: OfflineGate | None = None, actor: str = "cli"
             ) -> tuple[OfflineGate, list[GateOutcome]]:  # fmt: skip
    """Decide for every candidate variant of the experiment and store each decision."""
    outcomes = []
    with engine.begin() as conn:
        exp = store.experiment(conn, experiment_ref)
        gate = gate_for(conn, exp, given)
        baseline = exp.control
        if not exp.candidates:
            raise store.StoreError(f"experiment {exp.name!r} has no candidate variant")
        for candidate in exp.candidates:
            results, problems, suites = _pair(conn, exp, gate, baseline, candidate)
            decision = decide(gate, results, problems)
            saved = store.save_decision(conn, {
                "experiment_id": exp.id, "variant": candidate.variant, "baseline_variant": baseline.variant,
                "candidate_fingerprint": fingerprint(candidate, gate.params),
                "baseline_fingerprint": fingerprint(baseline, gate.params), "upstream": candidate.upstream,
                "model": candidate.model, "params": gate.params.as_dict(), "passed": decision.passed,
                "verdict": decision.verdict, "reasons": list(decision.reasons), "suites": suites,
                "evidence": [c.to_json() for c in decision.categories],
                "declaration": gate.model_dump(mode="json"), "actor": actor,
            })  # fmt: skip
            outcomes.append(GateOutcome(saved.id, candidate, baseline, decision, tuple(suites), saved.paused))
    return gate, outcomes
