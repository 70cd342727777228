"""JSON outputs checked against a JSON Schema (Draft 2020-12, with format checks) and,
optionally, an expected value.

The output must be exactly one JSON value — bare, or the only ```json fenced block: two
candidate objects are two answers, and fail. Duplicate keys (the parser would keep the
last one silently), NaN/Infinity and values nested deeper than 64 levels fail. ``expected``
is compared with types: ``1`` ≠ ``1.0`` ≠ ``true`` and ``"42"`` ≠ ``42``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError

from evals.items import JsonSchemaSpec
from evals.scorers.base import Score, too_long

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)
MAX_DEPTH = 64


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def parse_json_output(output: str) -> tuple[Any, str | None]:
    """The one JSON value of an output, or (None, why not)."""
    text = output.strip()
    fences = _FENCE.findall(text)
    if len(fences) > 1:
        return None, f"{len(fences)} fenced blocks: give one JSON value"
    if fences:
        outside = _FENCE.sub("", text).strip()
        if outside and re.search(r"[\[{]", outside):
            return None, "JSON-like text outside the fenced block"
        text = fences[0].strip()
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except _Duplicate as exc:
        return None, str(exc)
    except (ValueError, RecursionError) as exc:
        return None, f"not one JSON value: {str(exc)[:120]}"
    if _depth(value) > MAX_DEPTH:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    return value, None


def strict_equal(a: Any, b: Any) -> bool:
    """Equality where the JSON types must agree too (Python says True == 1 == 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and not math.isnan(a)
    return bool(a == b)


def score_json(spec: JsonSchemaSpec, output: str) -> Score:
    if (long := too_long(output)) is not None:
        return long
    value, why = parse_json_output(output)
    if why is not None:
        return Score.fail(why)
    try:
        validator = Draft202012Validator(spec.schema_, format_checker=FormatChecker())
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except SchemaError as exc:
        return Score.fail(f"the item's schema is invalid: {exc.message[:200]}")
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(root)"
        return Score.fail(f"schema: {where}: {errors[0].message[:200]}")
    if spec.expected is not None and not strict_equal(value, spec.expected):
        return Score.fail("valid against the schema but not the expected value")
    return Score.ok("valid" + (" and equal to the expected value" if spec.expected is not None else ""))
