"""``liftgate eval score`` as a user runs it: a real subprocess, files in, JSON lines out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.evals.formats import HUMANEVAL, write_jsonl


def liftgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "liftgate", *args], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_humaneval_samples_are_scored_one_object_per_output_then_a_summary(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    outputs = write_jsonl(tmp_path / "samples.jsonl", [
        {"task_id": "Toy/0", "completion": HUMANEVAL[0]["canonical_solution"]},
        {"task_id": "Toy/1", "completion": "    import sys\n    sys.exit(0)\n"},
    ])  # fmt: skip
    res = liftgate("eval", "score", str(data), "--outputs", str(outputs), "--format", "humaneval", "--json")
    assert res.returncode == 0, res.stderr
    rows = lines(res.stdout)
    assert [(r["id"], r["passed"]) for r in rows[:2]] == [("Toy/0", True), ("Toy/1", False)]
    assert set(rows[0]) >= {"id", "passed", "score", "reason"}
    assert rows[-1]["summary"]["items"] == 2 and rows[-1]["summary"]["passed"] == 1


def test_ids_default_to_line_numbers_and_a_table_is_printed_without_json(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "#### 2"},
                                                {"question": "2+2?", "answer": "#### 4"}])  # fmt: skip
    outputs = write_jsonl(
        tmp_path / "o.jsonl", [{"output": "The answer is 2."}, {"output": "The answer is 4 or 5"}]
    )
    res = liftgate("eval", "score", str(data), "--outputs", str(outputs), "--json")
    rows = lines(res.stdout)
    assert [(r["id"], r["passed"]) for r in rows[:2]] == [("0", True), ("1", False)]
    table = liftgate("eval", "score", str(data), "--outputs", str(outputs))
    assert table.returncode == 0 and "1/2 items passed" in table.stdout


def test_bad_input_exits_2_with_a_reason(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    outputs = write_jsonl(tmp_path / "o.jsonl", [{"id": "7", "output": "2"}])
    res = liftgate("eval", "score", str(data), "--outputs", str(outputs), "--json")
    assert res.returncode == 2
    assert "not in the dataset" in res.stderr
    missing = liftgate("eval", "score", str(tmp_path / "nope.jsonl"), "--outputs", str(outputs))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
