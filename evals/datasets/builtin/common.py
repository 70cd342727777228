"""What a built-in suite is made of: items with a known-good output and known-wrong ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evals.items import EvalItem


@dataclass(frozen=True, slots=True)
class BuiltinItem:
    """An item whose ``reference`` passes its scorer and whose ``wrong`` outputs each fail
    (tests/evals/test_builtin_suites.py proves both for every item)."""

    item: EvalItem
    wrong: tuple[str, ...]


def make_item(
    item_id: str,
    category: str,
    prompt: str,
    scorer: dict[str, Any],
    reference: str,
    wrong: tuple[str, ...],
    metadata: dict[str, Any] | None = None,
) -> BuiltinItem:
    item = EvalItem.model_validate({
        "id": item_id, "category": category, "messages": [{"role": "user", "content": prompt}],
        "scorer": scorer, "reference": reference, "metadata": metadata or {},
    })  # fmt: skip
    return BuiltinItem(item, wrong)
