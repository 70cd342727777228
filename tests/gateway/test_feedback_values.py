"""``/v1/feedback`` value rules through a real server (and the pure validator behind them).

Reproduces issue 13: ``{"kind": "thumbs_up", "value": 0}`` counted as a thumbs-up, and a
custom kind with value ``1.7e308`` was accepted and then overflowed every later report.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.feedback import validate_feedback
from tests.gateway.conftest import MemorySink, post, start_gateway, static_source

YES_NO = ["thumbs_up", "thumbs_down", "regenerate", "copy", "edit", "continued"]


@pytest.fixture(scope="module")
def gw() -> Iterator[tuple[str, MemorySink]]:
    sink = MemorySink()
    with start_gateway(sink, static_source([], [])) as g:
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
