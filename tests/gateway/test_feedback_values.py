"""``/v1/feedback`` value rules through a real server (and the pure validator behind them).

Reproduces issue 13: ``{"kind": "thumbs_up", "value": 0}`` counted as a thumbs-up, and a
custom kind with value ``1.7e308`` was accepted and then overflowed every later report.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.feedback import declared_kinds, parse_kinds, validate_feedback
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    MemorySink,
    experiment,
    free_port,
    get,
    post,
    start_gateway,
    static_source,
)

MSG = [{"role": "user", "content": "hello"}]
YES_NO = ["thumbs_up", "thumbs_down", "regenerate", "copy", "edit", "continued"]


@pytest.fixture(scope="module")
def gw() -> Iterator[tuple[str, MemorySink]]:
    sink = MemorySink()
    with start_gateway(sink, static_source([], []), feedback_kinds="code_ran,custom") as g:
        yield g.url, sink


def _send(url: str, body: Any) -> tuple[int, Any]:
    r = post(url + "/v1/feedback", body)
    return r.status_code, r.json()


@pytest.mark.parametrize("kind", YES_NO)
@pytest.mark.parametrize("value", [0, 0.0, False, 2, -1, 0.5, "1", [1]])
def test_a_yes_no_signal_with_any_value_but_one_is_refused(
    gw: tuple[str, MemorySink], kind: str, value: Any
) -> None:
    url, sink = gw
    before = len(sink.feedback())
    status, body = _send(url, {"request_id": "req-yes-no", "kind": kind, "value": value})
    assert status == 400 and "yes/no signal" in body["error"]["message"]
    assert len(sink.feedback()) == before


@pytest.mark.parametrize("kind", YES_NO)
@pytest.mark.parametrize("value", [None, 1, 1.0, True, "absent"])
def test_a_yes_no_signal_without_a_value_or_with_one_counts_once(
    gw: tuple[str, MemorySink], kind: str, value: Any
) -> None:
    url, sink = gw
    body: dict[str, Any] = {"request_id": f"req-{kind}", "kind": kind}
    if value != "absent":
        body["value"] = value
    status, answer = _send(url, body)
    assert status == 202
    (event,) = [f for f in sink.feedback() if f.event_id == answer["event_id"]]
    assert event.value == 1.0 and event.kind == kind


@pytest.mark.parametrize(("value", "stored"), [(True, 1.0), (1, 1.0), (False, 0.0), (0, 0.0), (None, 1.0)])
def test_task_success_is_an_outcome_of_one_or_zero(
    gw: tuple[str, MemorySink], value: Any, stored: float
) -> None:
    url, sink = gw
    status, answer = _send(url, {"request_id": "req-task", "kind": "task_success", "value": value})
    assert status == 202
    (event,) = [f for f in sink.feedback() if f.event_id == answer["event_id"]]
    assert event.value == stored


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"kind": "task_success", "value": 0.5}, "success"),
        ({"kind": "rating"}, "required"),
        ({"kind": "rating", "value": None}, "required"),
        ({"kind": "rating", "value": 10.5}, "between 0 and 10"),
        ({"kind": "rating", "value": True}, "finite number"),
        ({"kind": "code_ran", "value": 1.7e308}, "between -1e+09 and 1e+09"),
        ({"kind": "code_ran", "value": -1e9 - 1}, "between -1e+09 and 1e+09"),
        ({"kind": "code_ran", "value": True}, "finite number"),
        ({"kind": "code_ran", "value": "3"}, "finite number"),
    ],
)
def test_values_outside_their_kind_s_rules_are_refused_with_the_reason(
    gw: tuple[str, MemorySink], body: dict[str, Any], reason: str
) -> None:
    url, sink = gw
    before = len(sink.feedback())
    status, answer = _send(url, {"request_id": "req-values", **body})
    assert status == 400 and reason in answer["error"]["message"], answer
    assert len(sink.feedback()) == before


def test_non_finite_numbers_cannot_even_be_sent() -> None:
    """JSON has no NaN/Infinity; the validator refuses them too if they arrive another way."""
    for value in (float("nan"), float("inf"), -float("inf")):
        assert isinstance(validate_feedback({"request_id": "r", "kind": "custom", "value": value}), str)
        assert isinstance(validate_feedback({"request_id": "r", "kind": "rating", "value": value}), str)


@pytest.mark.parametrize(
    ("kind", "value"), [("rating", 0), ("rating", 7.5), ("code_ran", 1e9), ("code_ran", -3)]
)
def test_values_within_the_rules_are_accepted(gw: tuple[str, MemorySink], kind: str, value: float) -> None:
    url, _ = gw
    assert _send(url, {"request_id": "req-ok", "kind": kind, "value": value})[0] == 202


@pytest.mark.parametrize(
    "body",
    [
        {"request_id": "req-\x00", "kind": "copy"},
        {"request_id": "req-a", "kind": "copy", "unit_id": "u\x00"},
        {"request_id": "req-a", "kind": "copy", "unit_id": "u\n1"},
        {"request_id": "req-a", "kind": "copy", "tags": {"k": "v\x00"}},
        {"request_id": "req-a", "kind": "copy", "tags": {"k\x1b": "v"}},
        {"request_id": "req-a", "kind": "copy", "tags": "k=v\x00"},
    ],
)
def test_control_characters_in_feedback_fields_are_refused(
    gw: tuple[str, MemorySink], body: dict[str, Any]
) -> None:
    url, sink = gw
    before = len(sink.feedback())
    status, answer = _send(url, body)
    assert status == 400 and "control characters" in answer["error"]["message"]
    assert len(sink.feedback()) == before


def test_deeply_nested_feedback_is_refused_not_a_500(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    deep = b'{"request_id": "r", "kind": "copy", "tags": ' + b"[" * 500 + b"]" * 500 + b"}"
    r = post(url + "/v1/feedback", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]


def test_an_undefined_custom_kind_is_refused_with_the_openai_error_shape(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    before = len(sink.feedback())
    status, body = _send(url, {"request_id": "req-typo", "kind": "thumbs-up"})
    assert status == 400
    assert body["error"]["code"] == "unknown_feedback_kind" and body["error"]["param"] == "kind"
    assert "'thumbs-up' is not defined" in body["error"]["message"]
    assert "code_ran" in body["error"]["message"]  # the declared kinds are named
    assert len(sink.feedback()) == before


def test_the_declared_kinds_are_what_metric_definitions_read() -> None:
    specs = [
        {"name": "a", "kind": "mean", "numerator": "counters['code_ran'] + counters[\"edits_made:n\"]"},
        {"name": "b", "kind": "ratio", "numerator": "thumbs_up", "denominator": "counters['thumbs_up:n']"},
        {"name": "c", "kind": "quantile", "histogram": "latency"},
        "not a definition",
    ]
    assert declared_kinds(specs) == frozenset({"code_ran", "edits_made"})  # built-ins need no declaring
    with pytest.raises(ValueError, match="Bad Name"):
        parse_kinds("ok_kind, Bad Name")
    assert parse_kinds(" a , b,,") == frozenset({"a", "b"})


def test_feedback_on_an_unknown_id_warns_and_one_on_a_served_id_does_not(
    simulator: str,
) -> None:
    sink = MemorySink()
    exps = [
        experiment(
            "fb", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "broken", 1)]
        )
    ]
    ups = [UpstreamConfig("sim", simulator)]
    with start_gateway(sink, static_source(exps, ups)) as g:
        served = []
        for user in ("u1", "u2", "u3", "u4", "u5", "u6"):
            r = post(g.url + "/v1/chat/completions", {"model": "fb", "messages": MSG, "user": user})
            served.append((r.headers["x-request-id"], r.status_code))
        assert {status >= 500 for _, status in served} == {True, False}  # failed calls too
        for rid, _ in served:
            status, body = _send(g.url, {"request_id": rid, "kind": "thumbs_down"})
            assert status == 202 and body["warnings"] == [], body
        status, body = _send(g.url, {"request_id": "req-elsewhere", "kind": "thumbs_down"})
        assert status == 202 and [w["code"] for w in body["warnings"]] == ["unknown_request_id"]
        assert "liftgate_gateway_feedback_unknown_request_total 1.0" in get(g.url + "/metrics").text
    with start_gateway(MemorySink(), static_source(exps, ups), feedback_memory=0) as g:
        # No memory, nothing to compare with: no warning rather than one on every call.
        assert _send(g.url, {"request_id": "req-elsewhere", "kind": "copy"})[1]["warnings"] == []


def test_a_custom_kind_before_the_config_loaded_is_a_retryable_503_not_a_refusal() -> None:
    from gateway.config_source import DatabaseConfigSource

    sink = MemorySink()
    nowhere = DatabaseConfigSource(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none")
    with start_gateway(sink, nowhere, feedback_kinds="code_ran") as g:
        status, body = _send(g.url, {"request_id": "req-early", "kind": "code_ran"})
        assert status == 503 and body["error"]["code"] == "config_not_loaded"
        assert _send(g.url, {"request_id": "req-early", "kind": "thumbs_up"})[0] == 202
