"""``decode``'s msgspec fast path accepts exactly what the full check accepts.

``decode`` tries a msgspec Struct first and falls back to ``_decode_checked`` (orjson +
field checks) for anything it refuses; these tests feed both the same messages — valid
ones with optional fields missing or in another order, and one mutation per rule — and
require the same event or the same rejection reason.
"""

from __future__ import annotations

import json
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
    # What the database cannot store is refused here, not by the batch that carries it.
    ("NUL in a text field", _set("unit_id", "u\x00")),
    ("NUL in a tag", _set("tags", {"task": "co\x00de"})),
    ("NUL in the prompt", _set("prompt", "\x00")),
    ("text longer than its column", _set("request_id", "r" * 65)),
    ("text as long as its column", _set("request_id", "r" * 64)),
    ("latency beyond the bound", _set("latency_ms", 1.7e308)),
    ("negative latency", _set("latency_ms", -1.0)),
    ("int beyond int4", _set("prompt_tokens", 2**31)),
    ("int beyond 64 bits", _set("completion_tokens", 2**70)),
    ("http status out of range", _set("http_status", 1000)),
    ("ts beyond year 9999", _set("ts", 1e20)),
    ("tag key too long", _set("tags", {"k" * 128: "v"})),
    ("tag value too long", _set("tags", {"k": "v" * 129})),
    ("too many tags", _set("tags", {f"k{i}": "v" for i in range(65)})),
    ("event_id not a UUID", _set("event_id", "e-1")),
]


def _both(raw: bytes) -> tuple[object, object]:
    def run(f: Callable[[bytes], object]) -> object:
        try:
            return f(raw)
        except DecodeError as exc:
            return ("rejected", exc.reason)

    return run(decode), run(events._decode_checked)


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
@pytest.mark.parametrize(("name", "mutate"), INTERACTION_MUTATIONS, ids=[n for n, _ in INTERACTION_MUTATIONS])
def test_interactions_fast_and_full_decoders_agree(name: str, mutate: Mutation, compact: bool) -> None:
    # compact: written as encode() writes (a message ending '"type":"interaction"}' takes the
    # single-struct decoder); spaced: as other writers may (the union decoder).
    doc = orjson.loads(encode(make_interaction()))
    mutate(doc)
    separators = (",", ":") if compact else (", ", ": ")
    raw = json.dumps(doc, separators=separators).encode()  # orjson refuses ints beyond 64 bits
    assert raw.endswith(events._INTERACTION_TAIL) is (
        compact and list(doc)[-1:] == ["type"] and doc["type"] == "interaction"
    )
    fast, full = _both(raw)
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
        "text as long as its column",
    }
    assert isinstance(fast, events.InteractionEvent) is accepted


def test_encoded_interactions_take_the_single_struct_decoder() -> None:
    assert encode(make_interaction()).endswith(events._INTERACTION_TAIL)


@pytest.mark.parametrize(
    "raw",
    [
        # The tail of a nested object, not of the message: the final brace closes "tags".
        b'{"type":"feedback","request_id":"r","unit_id":"u","kind":"rating","event_id":"e",'
        b'"schema_version":1,"tags":{"type":"interaction"}}',
        # Two "type" keys, the first of another kind.
        b'{"type":"feedback","request_id":"r","unit_id":"u","kind":"rating","event_id":"e",'
        b'"schema_version":1,"type":"interaction"}',
        # Only the tail.
        b'{"type":"interaction"}',
        b'"type":"interaction"}',
        b'{"x":"\\"type":"interaction"}',
    ],
)
def test_messages_ending_like_an_interaction_are_judged_as_the_full_check_judges(raw: bytes) -> None:
    fast, full = _both(raw)
    assert fast == full


FEEDBACK_MUTATIONS: list[tuple[str, Mutation]] = [
    ("as encoded", lambda d: None),
    ("value missing", _drop("value")),
    ("empty kind", _set("kind", "")),
    ("kind too long", _set("kind", "k" * 257)),
    ("kind 256 long", _set("kind", "k" * 256)),
    ("value bool", _set("value", False)),
    ("unknown field", _set("extra", "x")),
    ("value at the bound", _set("value", -1e9)),
    ("value beyond the bound", _set("value", 1.7e308)),
    ("NUL in the kind", _set("kind", "my\x00kind")),
    ("NUL in the request id", _set("request_id", "\x00")),
]


@pytest.mark.parametrize(("name", "mutate"), FEEDBACK_MUTATIONS, ids=[n for n, _ in FEEDBACK_MUTATIONS])
def test_feedback_fast_and_full_decoders_agree(name: str, mutate: Mutation) -> None:
    doc = orjson.loads(encode(FeedbackEvent(request_id="r", unit_id="u", kind="rating", value=3.0)))
    mutate(doc)
    fast, full = _both(orjson.dumps(doc))
    assert fast == full
    accepted = {"as encoded", "value missing", "kind 256 long", "value at the bound"}
    assert isinstance(fast, FeedbackEvent) is (name in accepted)


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
