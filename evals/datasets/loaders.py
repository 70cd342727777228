"""Load datasets: liftgate JSONL, GSM8K, HumanEval, IFEval, OpenAI chat JSONL, built-in suites.

Every loader turns a line into an :class:`EvalItem`. An item's id is its ``id`` or
``task_id`` field when present, else its 0-based line number (blank lines count). Any bad
line is an error naming the line: a dataset is loaded whole or not at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from evals.datasets.builtin import SUITE_NAMES, builtin_suite
from evals.items import EvalItem

Format = Literal["liftgate", "gsm8k", "humaneval", "ifeval", "openai"]
FORMATS: tuple[str, ...] = ("liftgate", "gsm8k", "humaneval", "ifeval", "openai")
MAX_ITEMS = 200_000
GSM8K_INSTRUCTION = "Finish with a last line of the form 'The answer is N'."
HUMANEVAL_INSTRUCTION = (
    "Complete this Python function. Reply with the whole function in one ```python block.\n\n"
)
CHAT_RUBRIC = "Is the response correct, helpful and consistent with the reference answer?"


class DatasetError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    source: str
    items: tuple[EvalItem, ...]

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for item in self.items:
            digest.update(item.fingerprint().encode())
        return digest.hexdigest()

    def by_id(self) -> dict[str, EvalItem]:
        return {i.id: i for i in self.items}


def item_id(row: dict[str, Any], line: int) -> str:
    for key in ("id", "task_id"):
        value = row.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            return str(value)
    return str(line)


def _gsm8k(row: dict[str, Any], line: int) -> dict[str, Any]:
    question, answer = row["question"], row["answer"]
    if not isinstance(answer, str) or "####" not in answer:
        raise ValueError("'answer' has no '#### N' final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    return {"id": item_id(row, line), "category": "math", "prompt": f"{question}\n{GSM8K_INSTRUCTION}",
            "scorer": {"type": "answer", "answer": final}, "reference": answer}  # fmt: skip


def _humaneval(row: dict[str, Any], line: int) -> dict[str, Any]:
    prompt, test, entry = row["prompt"], row["test"], row["entry_point"]
    return {
        "id": item_id(row, line), "category": "code",
        "prompt": f"{HUMANEVAL_INSTRUCTION}```python\n{prompt}```",
        "scorer": {"type": "python_tests", "entry_point": entry, "prefix": prompt, "setup": prompt,
                   "tests": [f"{test}\n\ncheck(candidate)\n"]},
        "reference": row.get("canonical_solution"),
    }  # fmt: skip


def _ifeval(row: dict[str, Any], line: int) -> dict[str, Any]:
    ids, kwargs = row["instruction_id_list"], row.get("kwargs") or [{}] * len(row["instruction_id_list"])
    if not isinstance(ids, list) or not isinstance(kwargs, list) or len(ids) != len(kwargs):
        raise ValueError("'instruction_id_list' and 'kwargs' must be lists of the same length")
    constraints = [{"kind": i, **{k: v for k, v in (kw or {}).items() if v is not None}}
                   for i, kw in zip(ids, kwargs, strict=True)]  # fmt: skip
    return {"id": item_id(row, line), "category": "instruction_following", "prompt": row["prompt"],
            "scorer": {"type": "constraints", "constraints": constraints}}  # fmt: skip


def _openai(row: dict[str, Any], line: int) -> dict[str, Any]:
    messages = list(row.get("input") or row.get("messages") or [])
    ideal = row.get("ideal")
    if (
        ideal is None
        and messages
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "assistant"
    ):
        ideal = messages.pop()["content"]
    if isinstance(ideal, list):
        ideal = ideal[0] if ideal else None
    scorer = {"type": "judge", "rubric": CHAT_RUBRIC, **({"reference": ideal} if ideal is not None else {})}
    return {"id": item_id(row, line), "category": str(row.get("category") or "chat"),
            "messages": messages, "scorer": scorer, "reference": ideal}  # fmt: skip


def _liftgate(row: dict[str, Any], line: int) -> dict[str, Any]:
    return {**row, "id": item_id(row, line)}


_CONVERTERS: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {
    "liftgate": _liftgate, "gsm8k": _gsm8k, "humaneval": _humaneval, "ifeval": _ifeval, "openai": _openai,
}  # fmt: skip


def detect_format(row: dict[str, Any]) -> str:
    if "scorer" in row:
        return "liftgate"
    if "instruction_id_list" in row:
        return "ifeval"
    if {"prompt", "test", "entry_point"} <= row.keys():
        return "humaneval"
    if {"question", "answer"} <= row.keys():
        return "gsm8k"
    if "messages" in row or "input" in row:
        return "openai"
    raise DatasetError(f"cannot tell the format from the keys {sorted(row)[:8]}; give --format")


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(0-based line number, object) for each non-blank line."""
    try:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh):
                if not raw.strip():
                    continue
                try:
                    row = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{number + 1}: not JSON: {exc}") from None
                if not isinstance(row, dict):
                    raise DatasetError(f"{path}:{number + 1}: each line must be a JSON object")
                yield number, row
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from None


def load_file(path: Path, fmt: str | None = None, name: str | None = None) -> Dataset:
    items: list[EvalItem] = []
    seen: set[str] = set()
    for number, row in read_jsonl(path):
        kind = fmt or detect_format(row)
        if kind not in _CONVERTERS:
            raise DatasetError(f"unknown format {kind!r} (have: {', '.join(FORMATS)})")
        try:
            item = EvalItem.model_validate(_CONVERTERS[kind](row, number))
        except (KeyError, TypeError, ValueError) as exc:
            detail = exc.errors()[0] if isinstance(exc, ValidationError) else exc
            raise DatasetError(f"{path}:{number + 1}: not a valid {kind} item: {detail}") from None
        if item.id in seen:
            raise DatasetError(f"{path}:{number + 1}: duplicate item id {item.id!r}")
        seen.add(item.id)
        items.append(item)
        if len(items) > MAX_ITEMS:
            raise DatasetError(f"{path}: more than {MAX_ITEMS:,} items")
    if not items:
        raise DatasetError(f"{path}: no items")
    return Dataset(name or path.stem, str(path), tuple(items))


def load_dataset(spec: str, fmt: str | None = None) -> Dataset:
    """A built-in suite by name, or a JSONL file by path."""
    if spec in SUITE_NAMES and not Path(spec).exists():
        return Dataset(spec, "builtin", tuple(b.item for b in builtin_suite(spec)))
    return load_file(Path(spec), fmt)


def dump_jsonl(items: tuple[EvalItem, ...] | list[EvalItem], path: Path) -> None:
    with path.open("wb") as fh:
        for item in items:
            fh.write(orjson.dumps(item.to_json()) + b"\n")
