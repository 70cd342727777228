"""Loaders for the public formats and the liftgate JSONL format; scoring without a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.datasets import DatasetError, load_dataset, load_file
from evals.datasets.builtin import builtin_suite
from evals.datasets.loaders import dump_jsonl
from evals.items import AnswerSpec, PythonTestsSpec
from evals.scoring import read_outputs, score_outputs, summarize
from tests.evals.formats import GSM8K, HUMANEVAL, IFEVAL, OPENAI, write_jsonl


def test_gsm8k_lines_become_math_items_keyed_by_line_number(tmp_path: Path) -> None:
    ds = load_file(write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K))
    assert [i.id for i in ds.items] == ["0", "1", "2"]
    assert {i.category for i in ds.items} == {"math"}
    assert isinstance(ds.items[1].scorer, AnswerSpec) and ds.items[1].scorer.answer == "900"


def test_humaneval_items_use_task_ids_and_score_the_completion_appended_to_the_prompt(tmp_path: Path) -> None:
    ds = load_file(write_jsonl(tmp_path / "he.jsonl", HUMANEVAL))
    assert [i.id for i in ds.items] == ["Toy/0", "Toy/1"]
    spec = ds.items[0].scorer
    assert isinstance(spec, PythonTestsSpec) and spec.prefix == HUMANEVAL[0]["prompt"]
    outputs = [(row["task_id"], row["canonical_solution"]) for row in HUMANEVAL]
    outputs += [("Toy/0", "    return False\n"), ("Toy/1", "    return 0.0\n")]
    scored = score_outputs(ds, outputs)
    assert [s.score.passed for s in scored] == [True, True, False, False]


def test_a_completion_cannot_redefine_the_trusted_helper_the_test_uses(tmp_path: Path) -> None:
    ds = load_file(write_jsonl(tmp_path / "he.jsonl", HUMANEVAL))
    cheat = "    return 0.0\n\n\ndef poly(xs, x):\n    return 0\n"
    assert not score_outputs(ds, [("Toy/1", cheat)])[0].score.passed


def test_ifeval_items_map_instruction_ids_and_drop_null_kwargs(tmp_path: Path) -> None:
    ds = load_file(write_jsonl(tmp_path / "ifeval.jsonl", IFEVAL))
    assert [i.id for i in ds.items] == ["0", "1"]  # IFEval's "key" is not an id field
    scored = score_outputs(
        ds, [("0", "quiet pond\nfrog leaps in\nsplash"), ("1", "* apple\n* pear\n* fig\nDone.")]
    )
    assert all(s.score.passed for s in scored)
    scored = score_outputs(ds, [("0", "Quiet pond, frog"), ("1", "* apple\n* pear\nDone.")])
    assert not any(s.score.passed for s in scored)


def test_openai_chat_lines_take_the_last_assistant_message_or_ideal_as_reference(tmp_path: Path) -> None:
    ds = load_file(write_jsonl(tmp_path / "chat.jsonl", OPENAI))
    assert ds.items[0].reference == "Paris." and ds.items[1].reference == "4"
    assert [m["role"] for m in ds.items[0].chat()] == ["system", "user"]
    # Judged items fail closed without a judge endpoint.
    assert not score_outputs(ds, [("0", "Paris.")])[0].score.passed


def test_the_liftgate_format_round_trips(tmp_path: Path) -> None:
    items = [b.item for b in builtin_suite("json")[:5]]
    dump_jsonl(items, tmp_path / "json.jsonl")
    again = load_file(tmp_path / "json.jsonl")
    assert [i.fingerprint() for i in again.items] == [i.fingerprint() for i in items]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q", "answer": "no final"}\n', "#### N"),
        ("not json\n", "not JSON"),
        ("[1, 2]\n", "JSON object"),
        ('{"id": "a", "category": "math", "prompt": "p", "scorer": {"type": "answer", "answer": "1"}, "x": 1}\n',
         "not a valid"),
        ('{"id": "a", "category": "math", "prompt": "p", "scorer": {"type": "answer", "answer": "1"}}\n' * 2,
         "duplicate item id"),
        ('{"id": "a", "category": "Math!", "prompt": "p", "scorer": {"type": "answer", "answer": "1"}}\n',
         "not a valid"),
        ("\n\n", "no items"),
        ('{"foo": 1}\n', "cannot tell the format"),
    ],
)  # fmt: skip
def test_bad_datasets_are_refused_with_the_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_file(path)


def test_outputs_for_unknown_ids_are_an_error_and_missing_outputs_fail(tmp_path: Path) -> None:
    ds = load_dataset("math")
    with pytest.raises(DatasetError, match="not in the dataset"):
        score_outputs(ds, [("math-999", "The answer is 1")])
    scored = score_outputs(ds, [("math-001", ds.items[0].reference or "")])
    summary = summarize(scored)
    assert summary["items"] == 60 and summary["passed"] == 1 and summary["missing"] == 59


def test_several_samples_of_an_item_give_unbiased_pass_at_k(tmp_path: Path) -> None:
    ds = load_dataset("math")
    item = ds.items[0]
    outputs = [(i.id, "no") for i in ds.items for _ in range(5)]
    outputs[0] = (item.id, item.reference or "")  # item 0: 1 of 5 samples right
    summary = summarize(score_outputs(ds, outputs))
    assert summary["pass_at_k"]["pass@1"] == pytest.approx((1 / 5) / 60)
    assert summary["pass_at_k"]["pass@5"] == pytest.approx(1 / 60)


def test_output_files_accept_humaneval_and_ifeval_field_names(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "o.jsonl", [{"task_id": "Toy/0", "completion": "x"}, {"response": "y"}])
    assert read_outputs(path) == [("Toy/0", "x"), ("1", "y")]
    with pytest.raises(DatasetError, match="string 'output'"):
        read_outputs(write_jsonl(tmp_path / "bad.jsonl", [{"id": 1, "output": 3}]))
