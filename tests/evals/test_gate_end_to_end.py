"""The offline gate end to end: simulator with per-category skills, real PostgreSQL, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text, update

from contracts.tables import Variant
from tests.evals.conftest import Arm, make_experiment

GATE_YAML = """offline_gate:
  suites: [demo]
  margins: {code: 0.05, math: 0.05}
  default_margin: 0.05
  min_items: 20
"""


def liftgate(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LIFTGATE_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "liftgate", "eval", *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def jsonl(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_the_gate_blocks_a_candidate_that_forgot_code_and_records_why(
    engine: Engine, simulator_url: str, module_database_url: str, tmp_path: Path
) -> None:
    name = make_experiment(
        engine, [Arm("baseline", "base", simulator_url, True), Arm("candidate", "cand", simulator_url)]
    )
    declaration = tmp_path / "gate.yaml"
    declaration.write_text(GATE_YAML)
    before = liftgate(module_database_url, "gate", name, "--declare", str(declaration), "--json")
    assert before.returncode == 1
    (first,) = jsonl(before.stdout)
    assert any(r.startswith("no completed run of demo for baseline") for r in first["reasons"])

    ran = liftgate(module_database_url, "run", "demo", "--experiment", name, "--no-progress", "--json")
    assert ran.returncode == 0, ran.stderr
    assert [r["outputs"] for r in jsonl(ran.stdout)] == [232, 232]

    decided = liftgate(module_database_url, "gate", name, "--json", "--actor", "tester")
    assert decided.returncode == 1
    (decision,) = jsonl(decided.stdout)
    assert decision["verdict"] == "fail"
    forgetting = [r for r in decision["reasons"] if r.startswith("forgetting: code −")]
    assert len(forgetting) == 1 and len(decision["reasons"]) == 1, decision["reasons"]
    evidence = {e["category"]: e for e in decision["evidence"]}
    assert evidence["code"]["verdict"] == "forgetting" and evidence["code"]["difference"] < -0.2
    assert evidence["math"]["verdict"] == "pass" and evidence["math"]["difference"] > 0.1
    assert evidence["code"]["ci_upper"] < 0 and evidence["code"]["p_worse_holm"] < 0.05

    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT passed, verdict, reasons, actor, candidate_fingerprint, model FROM gate_decisions d"
            " JOIN experiments x ON x.id = d.experiment_id WHERE x.name = :n ORDER BY d.id DESC LIMIT 1"),
            {"n": name}).one()  # fmt: skip
        audited = conn.execute(text("SELECT actor FROM audit_log WHERE action = 'set_offline_gate'"
                                    " ORDER BY id DESC LIMIT 1")).scalar_one()  # fmt: skip
    assert (row.passed, row.verdict, row.actor, row.model) == (False, "fail", "cli:tester", "cand")
    assert row.reasons == decision["reasons"] and len(row.candidate_fingerprint) == 64
    assert audited.startswith("cli:")

    shown = liftgate(module_database_url, "show", name, "--items", "3")
    assert shown.returncode == 0, shown.stderr
    assert "forgetting: code" in shown.stdout
    assert "items the candidate failed and the baseline passed" in shown.stdout


def test_an_identical_candidate_passes_and_a_changed_candidate_needs_a_new_run(
    engine: Engine, simulator_url: str, module_database_url: str, tmp_path: Path
) -> None:
    name = make_experiment(
        engine, [Arm("baseline", "base", simulator_url, True), Arm("copy", "base", simulator_url)]
    )
    declaration = tmp_path / "gate.yaml"
    declaration.write_text(GATE_YAML)
    assert liftgate(module_database_url, "gate", name, "--declare", str(declaration)).returncode == 1
    assert liftgate(module_database_url, "run", "demo", "--experiment", name, "--no-progress").returncode == 0
    passed = liftgate(module_database_url, "gate", name, "--json")
    assert passed.returncode == 0, passed.stdout
    assert jsonl(passed.stdout)[0]["verdict"] == "pass"

    with engine.begin() as conn:
        conn.execute(update(Variant).where(Variant.name == "copy", Variant.model == "base",
                                           Variant.experiment_id == text(f"(SELECT id FROM experiments WHERE name = '{name}')"))
                     .values(model="cand"))  # fmt: skip
    changed = liftgate(module_database_url, "gate", name, "--json")
    assert changed.returncode == 1
    reasons = jsonl(changed.stdout)[0]["reasons"]
    assert reasons == [f"no completed run of demo for copy with its current fingerprint (none): "
                       f"run `liftgate eval run demo --experiment {name}`"]  # fmt: skip


def test_gate_and_run_refuse_bad_input_with_exit_2(
    engine: Engine, simulator_url: str, module_database_url: str, tmp_path: Path
) -> None:
    assert liftgate(module_database_url, "gate", "no-such-experiment").returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("offline_gate:\n  suites: []\n")
    res = liftgate(module_database_url, "gate", "whatever", "--declare", str(bad))
    assert res.returncode == 2 and "invalid offline_gate" in res.stderr
    name = make_experiment(
        engine, [Arm("baseline", "base", simulator_url, True), Arm("c", "cand", simulator_url)]
    )
    undeclared = liftgate(module_database_url, "gate", name)
    assert undeclared.returncode == 2 and "declares no offline_gate" in undeclared.stderr
    assert liftgate(module_database_url, "run", "no-such-suite", "--experiment", name).returncode == 2


def test_a_failing_gate_on_a_running_ab_test_pauses_it_and_the_cli_says_so(
    engine: Engine, simulator_url: str, module_database_url: str, tmp_path: Path
) -> None:
    name = make_experiment(
        engine, [Arm("baseline", "base", simulator_url, True), Arm("candidate", "cand", simulator_url)]
    )
    ran = liftgate(module_database_url, "run", "demo", "--experiment", name, "--no-progress", "--json")
    assert ran.returncode == 0, ran.stderr
    with engine.begin() as conn:
        conn.execute(text("UPDATE experiments SET status = 'running' WHERE name = :n"), {"n": name})
    declaration = tmp_path / "gate.yaml"
    declaration.write_text(GATE_YAML)
    decided = liftgate(module_database_url, "gate", name, "--declare", str(declaration), "--json")
    assert decided.returncode == 1
    (decision,) = jsonl(decided.stdout)  # stdout stays the decisions' JSON lines
    assert decision["reasons"][0].startswith("forgetting: code −")
    assert (
        f"experiment '{name}' paused" in decided.stderr
        and "starting it again checks the gate" in decided.stderr
    )
    with engine.connect() as conn:
        status, reason = conn.execute(text("SELECT status, status_reason FROM experiments WHERE name = :n"),
                                      {"n": name}).one()  # fmt: skip
    assert status == "paused" and reason.startswith(
        f"paused by the offline gate: variant 'candidate' failed (decision {decision['decision_id']}): forgetting"
    )
    assert decision["paused"] == reason  # the JSON line says it too
    again = liftgate(module_database_url, "gate", name, "--json")  # already paused: nothing more to say
    assert again.returncode == 1 and "paused" not in again.stderr
    assert jsonl(again.stdout)[0]["paused"] is None
