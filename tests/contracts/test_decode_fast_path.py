"""``decode``'s msgspec fast path accepts exactly what the full check accepts.

``decode`` tries a msgspec Struct first and falls back to ``_decode_checked`` (orjson +
field checks) for anything it refuses; these tests feed both the same messages — valid
ones with optional fields missing or in another order, and one mutation per rule — and
require the same event or the same rejection reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from contracts import events
from contracts.events import DecodeError, FeedbackEvent, decode, encode
from tests.contracts.test_events import make_interaction

Mutation = Callable[[dict[str, Any]], None]


def _set(key: str, value: object) -> Mutation:
    return lambda d: d.__setitem__(key, value)


def _drop(key: str) -> Mutation:
    return lambda d: d.pop(key)


def _drop_all(d: dict[str, Any], *keys: str) -> None:
    for k in keys:
        d.pop(k)


INTERACTION_MUTATIONS: list[tuple[str, Mutation]] = [
    ("as encoded", lambda d: None),
    ("optional fields missing", lambda d: _drop_all(d, "pair_id", "tags", "prompt", "ttft_ms")),
    ("ts missing (defaults to now)", _drop("ts")),
    ("keys reordered", lambda d: d.update(dict(reversed(list(d.items()))))),
    ("int for a float", _set("latency_ms", 120)),
    ("unknown field", _set("surprise", 1)),
    ("bool for an int", _set("http_status", True)),
    ("float for an int", _set("http_status", 200.5)),
    ("string for a float", _set("latency_ms", "12")),
    ("null required", _set("route", None)),
    ("missing required", _drop("unit_id")),
    ("bad literal", _set("role", "boss")),
    ("bad status", _set("status", "fine")),
    ("tags not strings", _set("tags", {"a": 1})),
    ("tags not a map", _set("tags", ["a"])),
    ("empty event_id", _set("event_id", "")),
    ("event_id missing", _drop("event_id")),
    ("schema_version missing", _drop("schema_version")),
    ("schema_version 2", _set("schema_version", 2)),
    ("schema_version float", _set("schema_version", 1.0)),
    ("type missing", _drop("type")),
    ("type unknown", _set("type", "click")),
    ("type of the other kind", _set("type", "feedback")),
]


def _both(raw: bytes) -> tuple[object, object]:
    def run(f: Callable[[bytes], object]) -> object:
        try:
            return f(raw)
        except DecodeError as exc:
            return ("rejected", exc.reason)

    return run(decode), run(events._decode_checked)


@pytest.mark.parametrize(("name", "mutate"), INTERACTION_MUTATIONS, ids=[n for n, _ in INTERACTION_MUTATIONS])
def test_interactions_fast_and_full_decoders_agree(name: str, mutate: Mutation) -> None:
    doc = orjson.loads(encode(make_interaction()))
    mutate(doc)
    fast, full = _both(orjson.dumps(doc))
    if name == "ts missing (defaults to now)":  # both default ts to the decoding time
        assert isinstance(fast, events.InteractionEvent) and isinstance(full, events.InteractionEvent)
        assert abs(fast.ts - full.ts) < 5
        fast.ts = full.ts
    assert fast == full
    accepted = name in {
        "as encoded",
        "optional fields missing",
        "ts missing (defaults to now)",
        "keys reordered",
        "int for a float",
    }
    assert isinstance(fast, events.InteractionEvent) is accepted


FEEDBACK_MUTATIONS: list[tuple[str, Mutation]] = [
    ("as encoded", lambda d: None),
    ("value missing", _drop("value")),
    ("empty kind", _set("kind", "")),
    ("kind too long", _set("kind", "k" * 257)),
    ("kind 256 long", _set("kind", "k" * 256)),
    ("value bool", _set("value", False)),
    ("unknown field", _set("extra", "x")),
]


@pytest.mark.parametrize(("name", "mutate"), FEEDBACK_MUTATIONS, ids=[n for n, _ in FEEDBACK_MUTATIONS])
def test_feedback_fast_and_full_decoders_agree(name: str, mutate: Mutation) -> None:
    doc = orjson.loads(encode(FeedbackEvent(request_id="r", unit_id="u", kind="rating", value=3.0)))
    mutate(doc)
    fast, full = _both(orjson.dumps(doc))
    assert fast == full
    assert isinstance(fast, FeedbackEvent) is (name in {"as encoded", "value missing", "kind 256 long"})


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[]", b"null", b'"x"', b"NaN", b'{"latency_ms": NaN}', b"\xff\xfe", b'{"a":1}{}']
)
def test_non_events_are_rejected_with_the_same_reason(raw: bytes) -> None:
    fast, full = _both(raw)
    assert fast == full
    assert isinstance(fast, tuple) and fast[0] == "rejected"


def test_literal_fields_come_from_the_annotations() -> None:
    # msgspec enforces the Literal annotations on the fast path; the full check uses the
    # same sets, so the two cannot drift apart.
    assert events._LITERALS["role"] == {"primary", "shadow", "attempt"}
    assert set(events._LITERALS) == {"role", "mode", "endpoint", "status", "unit_source"}
