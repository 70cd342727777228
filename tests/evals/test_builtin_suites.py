"""Every built-in item's reference output passes its scorer and every known-wrong output fails
(code items in real sandboxes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from evals.datasets.builtin import SUITE_NAMES, builtin_suite
from evals.datasets.builtin.common import BuiltinItem
from evals.scorers import score

SUITES = [s for s in SUITE_NAMES if s != "demo"]


@pytest.mark.parametrize("suite", SUITES)
def test_each_suite_has_at_least_50_items_with_unique_ids_and_one_category(suite: str) -> None:
    items = builtin_suite(suite)
    assert len(items) >= 50
    assert len({b.item.id for b in items}) == len(items)
    assert len({b.item.category for b in items}) == 1
    assert all(b.item.reference and b.wrong for b in items)


def _verdicts(b: BuiltinItem) -> tuple[str, bool, list[bool], str]:
    ref = score(b.item, b.item.reference or "")
    return b.item.id, ref.passed, [score(b.item, w).passed for w in b.wrong], ref.reason


@pytest.mark.parametrize("suite", SUITES)
def test_every_reference_passes_and_every_wrong_output_fails(suite: str) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_verdicts, builtin_suite(suite)))
    failing_refs = [(i, why) for i, ok, _, why in results if not ok]
    passing_wrongs = [(i, n) for i, _, wrong, _ in results for n, ok in enumerate(wrong) if ok]
    assert failing_refs == []
    assert passing_wrongs == []


def test_suites_are_the_same_every_time() -> None:
    from evals.datasets.builtin import math

    first = [b.item.fingerprint() for b in math.items()]
    assert first == [b.item.fingerprint() for b in math.items()]
    assert [b.item.fingerprint() for b in builtin_suite("demo")][: len(first)] == first
