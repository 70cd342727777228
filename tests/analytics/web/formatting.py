"""The dashboard's display rules (analytics/web/static/js/format.js, docs/dashboard.md),
re-implemented independently so the browser test can check every number on the page
against the report API.

JavaScript's ``Number.prototype.toFixed`` rounds the exact binary value half away from
zero; ``Decimal(x)`` is that exact value, so ``ROUND_HALF_UP`` reproduces it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

DASH = "—"


def _fixed(x: float, digits: int) -> str:
    q = Decimal(1).scaleb(-digits)
    text = str(Decimal(x).quantize(q, rounding=ROUND_HALF_UP))
    return text


def _groups(text: str) -> str:
    neg = text.startswith("-")
    body = text[1:] if neg else text
    whole, _, frac = body.partition(".")
    grouped = f"{int(whole):,}"
    return ("-" if neg else "") + grouped + ("." + frac if frac else "")


def _is_zero(text: str) -> bool:
    return all(c in "-0,." for c in text)


def _signed(text: str) -> str:
    if _is_zero(text):
        return text.replace("-", "")
    return text if text.startswith("-") else "+" + text


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def count(x: Any) -> str:
    return _groups(_fixed(x, 0)) if _finite(x) else DASH


def pct(x: Any) -> str:
    if not _finite(x):
        return DASH
    text = _fixed(x * 100, 1)
    return (text[1:] if text == "-0.0" else text) + "%"


def lift(x: Any) -> str:
    return _signed(_fixed(x * 100, 1)) + "%" if _finite(x) else DASH


def p(x: Any) -> str:
    if not _finite(x):
        return DASH
    return "<0.001" if x < 0.001 else _fixed(x, 3)


def num(x: Any) -> str:
    if not _finite(x):
        return DASH
    a = abs(x)
    digits = 0 if a >= 1000 else 1 if a >= 10 else 2 if a >= 1 else 4
    text = _groups(_fixed(x, digits))
    return text[1:] if text.startswith("-") and _is_zero(text) else text


def diff(x: Any) -> str:
    return _signed(num(x)) if _finite(x) else DASH


def pts(x: Any) -> str:
    return _signed(_fixed(x * 100, 1)) + " pts" if _finite(x) else DASH


FORMATS: dict[str, Callable[[Any], str]] = {
    "count": count,
    "pct": pct,
    "lift": lift,
    "p": p,
    "num": num,
    "diff": diff,
    "pts": pts,
}


def resolve(doc: Any, pointer: str) -> Any:
    """RFC 6901 JSON pointer (``/results/3/ci_relative/lower``)."""
    node = doc
    for part in pointer.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node
