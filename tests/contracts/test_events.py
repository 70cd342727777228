from __future__ import annotations

import uuid

import orjson
import pytest

from contracts.events import (
    FEEDBACK_TOPIC,
    FEEDBACK_VALUE_MAX,
    INTERACTIONS_TOPIC,
    SCHEMA_VERSION,
    DecodeError,
    FeedbackEvent,
    InteractionEvent,
    decode,
    encode,
    topic_for,
)


def make_interaction(**overrides: object) -> InteractionEvent:
    fields: dict[str, object] = dict(
        request_id="req-1",
        route="assistant",
        unit_id="user-42",
        unit_source="header",
        role="primary",
        mode="ab",
        endpoint="chat",
        model="qwen-7b",
        upstream="vllm-a",
        status="ok",
        http_status=200,
        latency_ms=123.5,
        experiment_id=7,
        experiment="exp",
        variant="candidate",
        ttft_ms=12.0,
        prompt_tokens=10,
        completion_tokens=20,
        response_chars=80,
        finish_reason="stop",
        stream=True,
        tags={"task": "code"},
        prompt="hi",
        response="hello",
    )
    fields.update(overrides)
    return InteractionEvent(**fields)  # type: ignore[arg-type]


def test_interaction_round_trips_through_json() -> None:
    event = make_interaction()
    assert decode(encode(event)) == event


def test_feedback_round_trips_and_goes_to_its_topic() -> None:
    event = FeedbackEvent(request_id="req-1", unit_id="u", kind="rating", value=4.0, tags={"a": "b"})
    assert decode(encode(event)) == event
    assert topic_for(event) == FEEDBACK_TOPIC
    assert topic_for(make_interaction()) == INTERACTIONS_TOPIC


def test_event_ids_are_unique_time_ordered_uuid7() -> None:
    ids = [make_interaction().event_id for _ in range(1000)]
    assert len(set(ids)) == 1000
    parsed = [uuid.UUID(i) for i in ids]
    assert all(u.version == 7 for u in parsed)
    assert ids == sorted(ids)


def test_kafka_key_is_the_unit_id() -> None:
    assert make_interaction(unit_id="alice").key == b"alice"
    assert FeedbackEvent(request_id="r", unit_id="bob", kind="copy").key == b"bob"


def test_encoded_event_carries_schema_version_and_type() -> None:
    data = orjson.loads(encode(make_interaction()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["type"] == "interaction"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.update(schema_version=99), "unsupported schema_version 99"),
        (lambda d: d.pop("schema_version"), "unsupported schema_version None"),
        (lambda d: d.update(type="click"), "unknown event type 'click'"),
        (lambda d: d.pop("request_id"), "missing required field 'request_id'"),
        (lambda d: d.update(latency_ms="fast"), "field 'latency_ms' must be float"),
        (lambda d: d.update(http_status=True), "field 'http_status' must be int"),
        (lambda d: d.update(role="tertiary"), "field 'role' has invalid value 'tertiary'"),
        (lambda d: d.update(tags={"a": 1}), "field 'tags' must map strings to strings"),
        (lambda d: d.update(extra=1), "unknown field(s) ['extra']"),
        (lambda d: d.update(route=None), "field 'route' must not be null"),
    ],
)
def test_decode_rejects_bad_interactions_with_a_reason(mutate: object, reason: str) -> None:
    data = orjson.loads(encode(make_interaction()))
    mutate(data)  # type: ignore[operator]
    with pytest.raises(DecodeError) as err:
        decode(orjson.dumps(data))
    assert reason in err.value.reason


@pytest.mark.parametrize(
    ("raw", "reason"),
    [(b"{not json", "malformed JSON"), (b"[1,2]", "must be a JSON object"), (b"", "malformed JSON")],
)
def test_decode_rejects_non_events(raw: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        decode(raw)
    assert reason in err.value.reason


def test_feedback_kind_must_be_a_name() -> None:
    data = orjson.loads(encode(FeedbackEvent(request_id="r", unit_id="u", kind="x")))
    data["kind"] = ""
    with pytest.raises(DecodeError, match="kind"):
        decode(orjson.dumps(data))


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("unit_id", "user\x00", "field 'unit_id' contains a NUL character"),
        ("tags", {"task": "\x00"}, "field 'tags' contains a NUL character"),
        ("request_id", "r" * 65, "field 'request_id' is longer than 64 characters"),
        ("latency_ms", 1e300, "field 'latency_ms' must be between 0 and 1e+09, got 1e+300"),
        ("prompt_tokens", 2**31, "field 'prompt_tokens' must be between 0 and 2.14748e+09"),
        ("http_status", -1, "field 'http_status' must be between 0 and 999"),
        ("ts", 1e20, "field 'ts' must be between 0 and"),
        ("event_id", "not-a-uuid", "field 'event_id' must be a UUID"),
    ],
)
def test_decode_refuses_what_the_database_cannot_store_with_a_reason(
    field: str, value: object, reason: str
) -> None:
    data = orjson.loads(encode(make_interaction()))
    data[field] = value
    with pytest.raises(DecodeError) as err:
        decode(orjson.dumps(data))
    assert reason in err.value.reason


def test_feedback_values_are_finite_and_bounded() -> None:
    ok = FeedbackEvent(request_id="r", unit_id="u", kind="my_signal", value=FEEDBACK_VALUE_MAX)
    assert decode(encode(ok)) == ok
    for value in (1.7e308, -1.7e308, FEEDBACK_VALUE_MAX * 1.000001):
        data = orjson.loads(encode(ok))
        data["value"] = value
        with pytest.raises(DecodeError, match="field 'value' must be between -1e\\+09 and 1e\\+09"):
            decode(orjson.dumps(data))
    with pytest.raises(DecodeError, match="infinity"):
        decode(encode(ok).replace(b"1000000000.0", b"1e999"))
