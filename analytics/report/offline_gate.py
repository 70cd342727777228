"""The offline gate as the API and the dashboard show it: read only, over the evals' tables.

One document per experiment (``GET /api/experiments/{id_or_name}/offline-gate``):

* ``declaration`` — the experiment's ``offline_gate`` as stored (or null);
* ``candidates`` — per candidate variant its newest gate decision (passed, verdict, reasons,
  per-category evidence as the gate recorded it: n, both pass rates, Δ with its paired CI,
  Holm p, margin, verdict; ``current`` says whether it still matches the candidate's and
  baseline's configuration and the declaration), ``check``, the rollout hook's answer now
  (:func:`contracts.offline_gate.check`, the one the controller and the admin API run), and
  ``serving``: whether it answers users now regardless of that answer (a running A/B test
  checked the gate at its start, and a failing decision pauses it; see ``contracts.offline_gate.serving``);
* ``matrix`` — the newest run of each (variant, dataset), per category: items, outputs,
  passes, failed calls, pass rate with its Wilson 95% interval, and for candidates the
  verdict of the newest decision when that decision was taken on this very run;
* ``failing_items`` — per candidate and dataset, items the candidate failed and the baseline
  passed (same item, same sample) in those newest runs, with both outputs and both scorer
  reasons; paged (``limit``/``offset``), outputs cut at :data:`MAX_OUTPUT_CHARS`.

The evals package writes these tables (``evals.store``); this module only reads them with
SQL, so the analytics service does not import ``evals`` (the packages share ``contracts``).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, text

from analytics.stats.paired import agreement
from contracts import offline_gate

#: Failing items per page: at most this many (a page of two 20k-character outputs each
#: stays a few MB).
MAX_ITEMS: Final = 100
DEFAULT_ITEMS: Final = 20
#: Characters of each output in a failing item; the full length is given alongside.
MAX_OUTPUT_CHARS: Final = 20_000


def _finite(value: Any) -> Any:
    """JSON-safe: NaN and infinities (a degenerate comparison) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _variants(conn: Connection, experiment_id: int) -> list[tuple[str, bool]]:
    rows = conn.execute(
        text("SELECT name, is_control FROM variants WHERE experiment_id = :e ORDER BY id"),
        {"e": experiment_id},
    )
    return [(str(r[0]), bool(r[1])) for r in rows]


def _required(mode: str, plan: Any) -> bool:
    """What the rollout controller requires: a rollout plan may say ``offline_gate: required``;
    anything else gates only when a declaration exists. An unreadable plan requires nothing
    more (the controller refuses to run it anyway)."""
    return mode == "rollout" and offline_gate.required_by(plan)


def _decision(conn: Connection, experiment_id: int, variant: str) -> dict[str, Any] | None:
    row = conn.execute(
        text(
            "SELECT id, passed, verdict, reasons, evidence, suites, declaration, params, upstream, model,"
            " candidate_fingerprint, baseline_fingerprint, baseline_variant, actor, created_at"
            " FROM gate_decisions WHERE experiment_id = :e AND variant = :v ORDER BY id DESC LIMIT 1"
        ),
        {"e": experiment_id, "v": variant},
    ).first()
    if row is None:
        return None
    m = row._mapping
    return {
        "id": int(m["id"]),
        "passed": bool(m["passed"]),
        "verdict": m["verdict"],
        "reasons": list(m["reasons"] or []),
        "categories": _finite(list(m["evidence"] or [])),
        "suites": list(m["suites"] or []),
        "declaration": m["declaration"],
        "params": m["params"],
        "upstream": m["upstream"],
        "model": m["model"],
        "candidate_fingerprint": m["candidate_fingerprint"],
        "baseline_fingerprint": m["baseline_fingerprint"],
        "baseline": m["baseline_variant"],
        "actor": m["actor"],
        "created_at": _iso(m["created_at"]),
    }


def _is_current(conn: Connection, experiment_id: int, decision: dict[str, Any], declared: Any) -> bool:
    """Whether the decision still vouches for the candidate as configured now: same
    declaration, same fingerprints (the rule of :func:`contracts.offline_gate.check`)."""
    if declared is None or decision["declaration"] != declared:
        return False
    params = dict(decision["params"] or {})
    fps = []
    for variant in (decision["baseline"], decision["variant"]):
        row = conn.execute(
            text(
                "SELECT u.name, u.base_url, v.model FROM variants v JOIN upstreams u ON u.id = v.upstream_id"
                " WHERE v.experiment_id = :e AND v.name = :v"
            ),
            {"e": experiment_id, "v": variant},
        ).first()
        if row is None:
            return False
        fps.append(offline_gate.candidate_fingerprint(str(row[0]), str(row[1]), str(row[2]), params))
    return fps == [decision["baseline_fingerprint"], decision["candidate_fingerprint"]]


_RUNS = text(
    "SELECT DISTINCT ON (r.variant, d.name) r.id, r.variant, d.name, r.status, r.samples, r.model,"
    " r.upstream, r.fingerprint, r.started_at, r.finished_at, r.dataset_fingerprint = d.fingerprint"
    " FROM eval_runs r JOIN eval_datasets d ON d.id = r.dataset_id"
    " WHERE r.experiment_id = :e AND r.variant IS NOT NULL ORDER BY r.variant, d.name, r.id DESC"
)
_CELLS = text(
    "SELECT run_id, category, count(DISTINCT item_id), count(*), count(*) FILTER (WHERE passed),"
    " count(*) FILTER (WHERE error IS NOT NULL) FROM eval_results WHERE run_id = ANY(:runs)"
    " GROUP BY run_id, category"
)


def _runs(conn: Connection, experiment_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(_RUNS, {"e": experiment_id}).all()
    return [
        {"id": int(r[0]), "variant": r[1], "dataset": r[2], "status": r[3], "samples": int(r[4]),
         "model": r[5], "upstream": r[6], "fingerprint": r[7], "started_at": _iso(r[8]),
         "finished_at": _iso(r[9]), "dataset_current": bool(r[10])}
        for r in rows
    ]  # fmt: skip


def _cell(items: int, outputs: int, passed: int, errors: int, run: dict[str, Any]) -> dict[str, Any]:
    ci = agreement(passed, outputs)
    return {"run_id": run["id"], "status": run["status"], "samples": run["samples"], "items": items,
            "outputs": outputs, "passed": passed, "errors": errors, "pass_rate": ci.rate,
            "ci_lower": ci.lower, "ci_upper": ci.upper}  # fmt: skip


def _matrix(
    conn: Connection, runs: list[dict[str, Any]], variants: list[str], decisions: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    by_id = {r["id"]: r for r in runs}
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    if runs:
        for run_id, category, items, outputs, passed, errors in conn.execute(_CELLS, {"runs": list(by_id)}):
            run = by_id[int(run_id)]
            cells.setdefault((run["dataset"], str(category)), {})[run["variant"]] = _cell(
                int(items), int(outputs), int(passed), int(errors), run
            )
    for (dataset, category), row in cells.items():
        for variant, cell in row.items():
            cell["verdict"] = _verdict_of(decisions.get(variant), dataset, category, cell["run_id"])
    return {
        "variants": variants,
        "rows": [{"dataset": ds, "category": cat, "cells": cells[(ds, cat)]} for ds, cat in sorted(cells)],
    }


def _verdict_of(decision: dict[str, Any] | None, dataset: str, category: str, run_id: int) -> str | None:
    """The decision's verdict for ``category`` when the decision was taken on this run, else
    None (a newer or older run than the decision's is not what the verdict judged)."""
    if decision is None:
        return None
    used = {s.get("candidate_run") for s in decision["suites"] if s.get("suite") == dataset}
    if run_id not in used:
        return None
    found = [c.get("verdict") for c in decision["categories"] if c.get("category") == category]
    return str(found[0]) if found else None


_FAILING = """
    FROM eval_results c JOIN eval_results b
      ON b.run_id = :b AND b.item_id = c.item_id AND b.sample = c.sample
    WHERE c.run_id = :c AND b.passed AND NOT c.passed
"""


def _cut(value: str | None) -> tuple[str | None, int]:
    if value is None:
        return None, 0
    return value[:MAX_OUTPUT_CHARS], len(value)


def _failing(
    conn: Connection, pairs: list[tuple[dict[str, Any], dict[str, Any]]], limit: int, offset: int
) -> dict[str, Any]:
    """Items a candidate failed and the baseline passed, over every (baseline run, candidate
    run) pair, in a stable order (candidate, dataset, category, item, sample)."""
    counts = [
        int(conn.execute(text("SELECT count(*) " + _FAILING), {"b": b["id"], "c": c["id"]}).scalar_one())
        for b, c in pairs
    ]
    items: list[dict[str, Any]] = []
    skip = offset
    for (base, cand), n in zip(pairs, counts, strict=True):
        if len(items) >= limit:
            break
        if skip >= n:
            skip -= n
            continue
        rows = conn.execute(
            text(
                "SELECT c.item_id, c.sample, c.category, b.output, b.reason, b.score, c.output, c.reason,"
                " c.score, c.error"
                + _FAILING
                + " ORDER BY c.category, c.item_id, c.sample LIMIT :n OFFSET :o"
            ),
            {"b": base["id"], "c": cand["id"], "n": limit - len(items), "o": skip},
        )
        skip = 0
        for r in rows:
            b_out, b_len = _cut(r[3])
            c_out, c_len = _cut(r[6])
            items.append({
                "variant": cand["variant"], "baseline": base["variant"], "dataset": cand["dataset"],
                "item_id": r[0], "sample": int(r[1]), "category": r[2],
                "baseline_output": b_out, "baseline_output_chars": b_len, "baseline_reason": r[4],
                "baseline_score": _finite(float(r[5])),
                "candidate_output": c_out, "candidate_output_chars": c_len, "candidate_reason": r[7],
                "candidate_score": _finite(float(r[8])), "candidate_error": r[9],
                "baseline_run": base["id"], "candidate_run": cand["id"],
            })  # fmt: skip
    return {"total": sum(counts), "offset": offset, "limit": limit, "items": items}


def view(
    conn: Connection, experiment_id: int, *, limit: int = DEFAULT_ITEMS, offset: int = 0
) -> dict[str, Any]:
    """The offline gate document of one experiment (see the module docstring)."""
    if not 0 <= limit <= MAX_ITEMS or offset < 0:
        raise ValueError(f"items must be within [0, {MAX_ITEMS}] and offset >= 0")
    exp = conn.execute(
        text("SELECT id, name, mode, status, coverage, rollout_plan FROM experiments WHERE id = :e"),
        {"e": experiment_id},
    ).one()
    gate_row = conn.execute(
        text("SELECT declaration, updated_by, updated_at FROM offline_gates WHERE experiment_id = :e"),
        {"e": experiment_id},
    ).first()
    declared = gate_row[0] if gate_row is not None else None
    variants = _variants(conn, experiment_id)
    controls = [name for name, is_control in variants if is_control]
    control = controls[0] if len(controls) == 1 else None
    required = _required(str(exp.mode), exp.rollout_plan)

    candidates = []
    decisions: dict[str, dict[str, Any]] = {}
    serving = offline_gate.serving(conn, experiment_id)
    for name, is_control in variants:
        if is_control:
            continue
        decision = _decision(conn, experiment_id, name)
        if decision is not None:
            decision["variant"] = name
            decision["current"] = _is_current(conn, experiment_id, decision, declared)
            decisions[name] = decision
        if control is None:
            # Fail closed: without exactly one control there is no baseline to have passed against.
            check = {"required": True, "passed": False, "decision_id": None,
                     "reason": f"the experiment has {len(controls)} control variants (needs exactly 1)"}  # fmt: skip
        else:
            check = offline_gate.check(conn, experiment_id, name, control, required=required).public()
        candidates.append({"variant": name, "decision": decision, "check": check, "serving": name in serving})

    runs = _runs(conn, experiment_id)
    base_runs = {r["dataset"]: r for r in runs if r["variant"] == control}
    pairs = [
        (base_runs[r["dataset"]], r)
        for r in sorted(runs, key=lambda r: (r["variant"], r["dataset"]))
        if r["variant"] != control and r["dataset"] in base_runs
    ]
    return {
        "experiment": {"id": int(exp.id), "name": exp.name, "mode": exp.mode, "status": exp.status},
        "control": control,
        "declaration": declared,
        "declared_by": gate_row[1] if gate_row is not None else None,
        "declared_at": _iso(gate_row[2]) if gate_row is not None else None,
        "required": declared is not None or required,
        "candidates": candidates,
        "runs": runs,
        "matrix": _matrix(conn, runs, [name for name, _ in variants], decisions),
        "failing_items": _failing(conn, pairs, limit, offset),
    }
