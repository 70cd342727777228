"""The built-in suites, written for this project (no downloads): ``math``, ``code``,
``instruction_following``, ``json``, and ``demo`` = all four."""

from __future__ import annotations

import functools
from collections.abc import Callable

from evals.datasets.builtin import code, instructions, json_extraction, math
from evals.datasets.builtin.common import BuiltinItem

_SUITES: dict[str, Callable[[], list[BuiltinItem]]] = {
    "math": math.items,
    "code": code.items,
    "instruction_following": instructions.items,
    "json": json_extraction.items,
}
SUITE_NAMES: tuple[str, ...] = (*_SUITES, "demo")


@functools.cache
def builtin_suite(name: str) -> tuple[BuiltinItem, ...]:
    """A built-in suite's items (built once per process; seeded, so always the same)."""
    if name == "demo":
        return tuple(i for suite in _SUITES for i in builtin_suite(suite))
    if name not in _SUITES:
        raise KeyError(f"no built-in suite {name!r} (have: {', '.join(SUITE_NAMES)})")
    return tuple(_SUITES[name]())


__all__ = ["SUITE_NAMES", "BuiltinItem", "builtin_suite"]
