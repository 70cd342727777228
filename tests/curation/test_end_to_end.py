"""End to end with real parts: production calls with users' thumbs-down become a dataset
(the ``liftgate datasets`` CLI as subprocesses, real PostgreSQL), it is split, replayed by
``liftgate eval run production:NAME`` against a real simulator (baseline and a verbose
candidate) and judged pairwise by a real, length-biased judge server — the length-controlled
win rate differs from the raw one — and a training export that would leak a holdout item is
refused with the ids, leaving no file."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.curation.data import Call, store_calls
from tests.curation.judge_server import running_judge
from tests.curation.test_builder import _prompt
from tests.evals.conftest import Arm, make_experiment

ROOT = Path(__file__).resolve().parents[2]
CALLS = 300
SIM = (
    SimulatorModel(name="base", latency_ms=2, latency_sd=0, ttft_ms=1, ttft_sd=0, tokens=120, tokens_sd=30, seed=1),
    SimulatorModel(name="verbose", latency_ms=2, latency_sd=0, ttft_ms=1, ttft_sd=0, tokens=180, tokens_sd=40, seed=2),
)  # fmt: skip


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with SimulatorProcess(SIM) as sim:
        yield sim.url + "/v1"


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LIFTGATE_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "liftgate", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_thumbs_down_answers_become_a_replayed_dataset_and_a_leaking_export_is_refused(
    engine: Engine, module_database_url: str, simulator_url: str, tmp_path: Path
) -> None:
    exp = make_experiment(engine, [Arm("baseline", "base", simulator_url, control=True),
                                   Arm("candidate", "verbose", simulator_url)])  # fmt: skip
    with engine.begin() as conn:
        conn.execute(text("UPDATE experiments SET content_logging = 'full' WHERE name = :n"), {"n": exp})
    rng = random.Random(5)
    calls = [Call(_prompt(5000 + i), response=f"logged answer {i}", category=rng.choice(["code", "writing"]),
                  feedback=("thumbs_down",) if i % 3 else ("thumbs_up",), unit=f"user{i % 40}", minutes=i)
             for i in range(CALLS)]  # fmt: skip
    store_calls(engine, exp, calls)
    url = module_database_url

    made = _cli(url, "datasets", "create", "disliked", "--from-experiment", exp, "--where", "feedback=thumbs_down",
                "--json", "--actor", "e2e")  # fmt: skip
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    assert info["items"] == 200 and info["stats"]["categories"].keys() == {"code", "writing"}
    split = _cli(url, "datasets", "split", "disliked", "--holdout", "0.2", "--seed", "3", "--json")
    assert split.returncode == 0, split.stderr
    assert json.loads(split.stdout)["holdout"] == 40

    with running_judge() as judge:
        ran = _cli(url, "eval", "run", "production:disliked", "--experiment", exp, "--judge-url", judge,
                   "--json", "--no-progress", "--concurrency", "16")  # fmt: skip
    assert ran.returncode == 0, ran.stderr + ran.stdout
    replay = next(json.loads(line)["replay"] for line in ran.stdout.splitlines() if '"replay"' in line)
    overall = replay["overall"]
    assert replay["failed"] == 0 and overall["n"] == 160
    assert overall["rate"] > 0.6 and overall["p_value"] < 0.05  # the judge likes the longer answers
    assert overall["lc_rate"] is not None and overall["lc_rate"] < overall["rate"] - 0.1
    assert overall["lc_low"] < 0.5 < overall["lc_high"] or overall["lc_p_value"] > 0.01
    assert {c["category"] for c in replay["categories"]} == {"code", "writing"}
    assert all(c["p_holm"] >= c["p_value"] for c in replay["categories"])
    # Stored with the version, readable afterwards.
    stored = _cli(url, "datasets", "replays", "disliked", "--json")
    assert stored.returncode == 0, stored.stderr
    (kept,) = [json.loads(line) for line in stored.stdout.splitlines()]
    assert (kept["version"], kept["experiment"], kept["candidate"], kept["baseline"]) == (
        2,
        exp,
        "candidate",
        "baseline",
    )
    assert kept["overall"] == overall and kept["categories"] == replay["categories"] and kept["failed"] == 0
    assert kept["judge"].startswith("judge @ http://127.0.0.1:") and kept["actor"].startswith("cli:")
    with engine.connect() as conn:
        runs = {str(r[0]) for r in conn.execute(text("SELECT variant FROM eval_runs WHERE id IN (:b, :c)"),
                                                {"b": kept["baseline_run_id"], "c": kept["candidate_run_id"]})}  # fmt: skip
    assert runs == {"baseline", "candidate"}
    table = _cli(url, "datasets", "replays", "disliked")
    assert table.returncode == 0 and "candidate vs baseline" in table.stdout and "Holm" in table.stdout, (
        table.stdout
    )

    again = _cli(url, "datasets", "create", "everything", "--from-experiment", exp, "--json")
    assert again.returncode == 0, again.stderr
    out = tmp_path / "train.jsonl"
    refused = _cli(
        url, "datasets", "export", "everything", "--format", "chat", "--out", str(out), "--actor", "e2e"
    )
    assert refused.returncode == 2
    assert "overlap a sealed holdout" in refused.stderr and "disliked@2:" in refused.stderr
    assert not out.exists() and not (tmp_path / "train.jsonl.partial").exists()
    ok = _cli(url, "datasets", "export", "disliked", "--format", "eval", "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    assert len(out.read_text().splitlines()) == 160
    listed = _cli(url, "datasets", "list", "--json")
    assert {json.loads(line)["name"] for line in listed.stdout.splitlines()} == {"disliked", "everything"}
    gone = _cli(url, "datasets", "delete", "everything", "--yes")
    assert gone.returncode == 0 and "deleted everything" in gone.stdout
    gone = _cli(url, "datasets", "delete", "disliked", "--yes")
    assert gone.returncode == 0 and "1 replays" in gone.stdout, gone.stdout
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM dataset_replays")).scalar_one() == 0
