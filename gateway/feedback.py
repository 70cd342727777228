"""What a ``POST /v1/feedback`` body may say (validated before it becomes an event).

Values by kind:

* **yes/no signals** — ``thumbs_up``, ``thumbs_down``, ``regenerate``, ``copy``, ``edit``,
  ``continued``: the event *is* the signal. No value, ``1`` or ``true``; anything else
  (``0``, ``false``, ``0.5`` …) is refused — a ``thumbs_up`` with value 0 is not a thumbs-up,
  and a thumbs-down is its own kind.
* **task_success** — an outcome: ``1``/``true`` (success, also when no value is sent) or
  ``0``/``false`` (failure).
* **rating** — a value is required, between 0 and 10.
* **custom kinds** (lowercase name, ≤ 64 characters) — a finite number with
  ``|value| ≤ 1e9`` (default 1): sums of custom values are stored per unit, and one absurd
  value must not overflow every later report.

Which kinds are accepted: the built-in ones, and a custom kind only once something declares
it — a metric definition that reads it (``counters['kind']`` or ``counters['kind:n']``,
carried by the config snapshot) or the gateway's ``feedback_kinds`` setting (kinds collected
before a metric uses them). Any other kind is refused with a 400 (``unknown_feedback_kind``):
a typo (``thumbs-up``, ``thumb_up``) would otherwise be stored as a signal nobody reads.

Whether the request id is known is *not* a reason to refuse: events are asynchronous and
feedback may legitimately arrive before its interaction is stored, from another gateway
replica, or after this process restarted. The gateway answers 202 with a warning when its
bounded memory of recent request ids (``feedback_memory``) does not hold the id; ingest
attributes feedback only by joining the stored interaction, and the analytics service counts
what never joins (``analytics.report.data_quality``).

``request_id``, ``unit_id`` and tags must not contain control characters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from contracts.events import FEEDBACK_KINDS
from gateway.inputs import has_control
from gateway.routing import MAX_TAGS, parse_tags

CUSTOM_KIND = re.compile(r"^[a-z][a-z0-9_.\-]{0,63}$")
# A counter a metric expression reads: counters['kind'] or counters['kind:n'] (its count).
_COUNTER_REF = re.compile(r"""counters\[\s*(['"])([^'"]{1,256})\1\s*\]""")
YES_NO_KINDS = frozenset({"thumbs_up", "thumbs_down", "regenerate", "copy", "edit", "continued"})
OUTCOME_KINDS = frozenset({"task_success"})
RATING_RANGE = (0.0, 10.0)
MAX_CUSTOM_VALUE = 1e9
MAX_REQUEST_ID = 64
MAX_UNIT = 256
MAX_TAG_TEXT = 64

Feedback = tuple[str, str, float, str | None, dict[str, str]]  # request_id, kind, value, unit, tags

#: The body's JSON Schema (published in the gateway's OpenAPI document).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["request_id", "kind"],
    "properties": {
        "request_id": {"type": "string", "minLength": 1, "maxLength": MAX_REQUEST_ID},
        "kind": {"type": "string", "maxLength": 64},
        "value": {"type": ["number", "boolean", "null"]},
        "unit_id": {"type": ["string", "null"], "maxLength": MAX_UNIT},
        "tags": {
            "oneOf": [
                {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": MAX_TAGS},
                {"type": "string"},
            ]
        },
    },
}


def _value(kind: str, value: Any) -> float | str:
    """The value to store, or the reason it is refused."""
    if kind in YES_NO_KINDS:
        if value is None or value is True or (value.__class__ in (int, float) and value == 1):
            return 1.0
        return f"kind '{kind}' is a yes/no signal: send no value (or 1/true); anything else is refused"
    if kind in OUTCOME_KINDS:
        if value is None or value is True:
            return 1.0
        if value is False:
            return 0.0
        if value.__class__ in (int, float) and value in (0, 1):
            return float(value)
        return f"value for kind '{kind}' must be 1/true (success) or 0/false (failure)"
    if kind == "rating" and value is None:
        return "value is required for kind 'rating'"
    if value is None:
        return 1.0
    if value.__class__ not in (int, float) or not math.isfinite(value):
        return "value must be a finite number"
    if kind == "rating":
        if not RATING_RANGE[0] <= value <= RATING_RANGE[1]:
            return f"rating value must be between {RATING_RANGE[0]:g} and {RATING_RANGE[1]:g}"
    elif abs(value) > MAX_CUSTOM_VALUE:
        return f"value of a custom kind must be between {-MAX_CUSTOM_VALUE:g} and {MAX_CUSTOM_VALUE:g}"
    return float(value)


def validate_feedback(data: Any) -> Feedback | str:
    """(request_id, kind, value, unit_id, tags) or the reason the body is invalid."""
    if not isinstance(data, dict):
        return "body must be a JSON object"
    rid = data.get("request_id")
    if not isinstance(rid, str) or not rid or len(rid) > MAX_REQUEST_ID or has_control(rid):
        return f"request_id must be a non-empty string of at most {MAX_REQUEST_ID} characters, without control characters"
    kind = data.get("kind")
    if not isinstance(kind, str) or not (kind in FEEDBACK_KINDS or CUSTOM_KIND.match(kind)):
        return (
            "kind must be one of "
            + ", ".join(sorted(FEEDBACK_KINDS))
            + " or a custom name (lowercase letters, digits, _ . -; at most 64 characters)"
        )
    value = _value(kind, data.get("value"))
    if isinstance(value, str):
        return value
    unit = data.get("unit_id")
    if unit is not None and (not isinstance(unit, str) or len(unit) > MAX_UNIT or has_control(unit)):
        return f"unit_id must be a string of at most {MAX_UNIT} characters, without control characters"
    tags = data.get("tags", {})
    if isinstance(tags, str):
        if has_control(tags):
            return "tags must not contain control characters"
        tags = parse_tags(tags)
    if tags is None:
        tags = {}
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        return "tags must be an object mapping strings to strings"
    if len(tags) > MAX_TAGS:
        return f"at most {MAX_TAGS} tags"
    if any(has_control(k) or has_control(v) for k, v in tags.items()):
        return "tags must not contain control characters"
    return rid, kind, value, unit, {k[:MAX_TAG_TEXT]: v[:MAX_TAG_TEXT] for k, v in tags.items()}


def declared_kinds(definitions: Iterable[Any]) -> frozenset[str]:
    """The custom feedback kinds metric definitions read (their ``counters['kind']``)."""
    kinds: set[str] = set()
    for spec in definitions:
        if not isinstance(spec, dict):
            continue
        for field in ("numerator", "denominator"):
            expr = spec.get(field)
            if isinstance(expr, str):
                for _, name in _COUNTER_REF.findall(expr):
                    name = name.removesuffix(":n")
                    if CUSTOM_KIND.match(name) and name not in FEEDBACK_KINDS:
                        kinds.add(name)
    return frozenset(kinds)


def parse_kinds(text: str) -> frozenset[str]:
    """A comma-separated list of custom kinds (the ``feedback_kinds`` setting), checked."""
    kinds = frozenset(k.strip() for k in text.split(",") if k.strip())
    bad = sorted(k for k in kinds if not CUSTOM_KIND.match(k))
    if bad:
        raise ValueError(f"feedback_kinds: not a valid kind name: {', '.join(bad)}")
    return kinds


def undefined_kind(kind: str, declared: frozenset[str], configured: frozenset[str]) -> str | None:
    """Why ``kind`` is refused (no metric or setting declares it), or None."""
    if kind in FEEDBACK_KINDS or kind in declared or kind in configured:
        return None
    known = sorted(declared | configured)
    return (
        f"kind {kind!r} is not defined: use a built-in kind ({', '.join(sorted(FEEDBACK_KINDS))})"
        + (f" or a declared custom kind ({', '.join(known[:20])})" if known else "")
        + "; a custom kind is declared by a metric definition that reads it (counters['kind'])"
        " or by the gateway's LIFTGATE_FEEDBACK_KINDS setting"
    )
