"""The hot path's input boundary against a real server: control characters, depth, shape.

Reproduces issue 13: a NUL in a ``user`` field was accepted (200) and its event poisoned
ingest; JSON nested 300 deep answered 500 with a traceback; a chat request without
``messages`` was relayed, answered 200 and recorded as a successful interaction.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.inputs import MAX_DEPTH, completion_problem, too_deep
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, experiment, post, refused, start_gateway, static_source

MSG = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"


@pytest.fixture(scope="module")
def gw(simulator: str) -> Iterator[tuple[str, MemorySink]]:
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment(
            "assistant",
            [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 1)],
        )
    ]
    with start_gateway(sink, static_source(exps, ups)) as g:
        yield g.url, sink


def _nested(depth: int) -> bytes:
    """A body whose ``messages`` entry has an extra field making it ``depth`` levels deep
    (built as text: orjson itself refuses to encode beyond 254 levels)."""
    n = depth - 3  # body object, messages list, message object
    extra = b"[" * n + b'"x"' + b"]" * n
    return b'{"model": "assistant", "messages": [{"role": "user", "content": "hi", "extra": ' + extra + b"}]}"


def _refused(url: str, path: str, body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = post(
        url + path,
        content=body if isinstance(body, bytes) else orjson.dumps(body),
        headers={"content-type": "application/json", **(headers or {})},
    )
    assert r.status_code == 400, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    return err


@pytest.mark.parametrize("user", ["a\x00b", "\x00", "tab\there", "bell\x07", "del\x7f", "esc\x1b[31m"])
def test_control_characters_in_the_user_field_are_refused_and_never_become_an_event(
    gw: tuple[str, MemorySink], user: str
) -> None:
    url, sink = gw
    before, counted = len(sink.events), refused(url, "invalid_request")
    err = _refused(url, CHAT, {"model": "assistant", "messages": MSG, "user": user})
    assert err["param"] == "user"
    assert len(sink.events) == before
    assert refused(url, "invalid_request") == counted + 1


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("X-Liftgate-Unit", "alice\tbob"),
        ("X-Liftgate-Tags", "task=code\t,x=y"),
        ("X-Liftgate-Conversation", "c\t1"),
    ],
)
def test_control_characters_in_liftgate_headers_are_refused_in_the_openai_shape(
    gw: tuple[str, MemorySink], header: str, value: str
) -> None:
    url, sink = gw
    before = len(sink.events)
    err = _refused(url, CHAT, {"model": "assistant", "messages": MSG}, headers={header: value})
    assert err["param"] == header
    assert len(sink.events) == before


def test_a_nul_byte_in_a_header_never_reaches_an_event(gw: tuple[str, MemorySink]) -> None:
    """The HTTP parser itself refuses NUL (and other control bytes but tab) in header values."""
    url, sink = gw
    before = len(sink.events)
    port = int(url.rsplit(":", 1)[1])
    body = orjson.dumps({"model": "assistant", "messages": MSG})
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Liftgate-Unit: a\x00b\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert s.recv(65536).startswith(b"HTTP/1.1 400")
    assert len(sink.events) == before


def test_a_unit_with_ordinary_unicode_is_served(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    r = post(url + CHAT, {"model": "assistant", "messages": MSG, "user": "zoë 🦊"})
    assert r.status_code == 200
    (event,) = sink.wait_for(lambda e: e.request_id == r.headers["x-request-id"])
    assert event.unit_id == "zoë 🦊"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 1000])
def test_json_nested_deeper_than_the_limit_is_a_400_not_a_500(gw: tuple[str, MemorySink], depth: int) -> None:
    url, sink = gw
    before = len(sink.events)
    err = _refused(url, CHAT, _nested(depth))
    assert "nested too deeply" in err["message"]
    assert len(sink.events) == before


def test_json_at_the_depth_limit_is_relayed(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    r = post(url + CHAT, content=_nested(MAX_DEPTH), headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert sink.wait_for(lambda e: e.request_id == r.headers["x-request-id"])  # recorded after the answer


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"model": "assistant"}, "messages"),
        (CHAT, {"model": "assistant", "messages": []}, "messages"),
        (CHAT, {"model": "assistant", "messages": "hi"}, "messages"),
        (CHAT, {"model": "assistant", "messages": [{"content": "hi"}]}, "messages[0].role"),
        (CHAT, {"model": "assistant", "messages": [*MSG, "hi"]}, "messages[1].role"),
        (CHAT, {"model": "assistant", "messages": MSG, "stream": "yes"}, "stream"),
        (CHAT, {"model": "assistant", "messages": MSG, "stream": 1}, "stream"),
        (
            CHAT,
            {"model": "assistant", "messages": MSG, "stream": True, "stream_options": []},
            "stream_options",
        ),
        (CHAT, {"model": 5, "messages": MSG}, "model"),
        (CHAT, {"model": "", "messages": MSG}, "model"),
        (CHAT, {"messages": MSG}, "model"),
        (CHAT, {"model": "assistant", "messages": MSG, "user": 7}, "user"),
        (COMPLETIONS, {"model": "assistant"}, "prompt"),
        (COMPLETIONS, {"model": "assistant", "prompt": None}, "prompt"),
        (EMBEDDINGS, {"model": "assistant"}, "input"),
    ],
)
def test_requests_without_the_minimal_openai_shape_are_refused_with_the_param_named(
    gw: tuple[str, MemorySink], path: str, body: dict[str, Any], param: str
) -> None:
    url, sink = gw
    before = len(sink.events)
    assert _refused(url, path, body)["param"] == param
    assert len(sink.events) == before  # never recorded as an interaction


def test_well_formed_requests_of_every_endpoint_still_pass(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    for path, body in (
        (CHAT, {"model": "assistant", "messages": MSG, "stream": False}),
        (COMPLETIONS, {"model": "assistant", "prompt": ["a", "b"]}),
        (EMBEDDINGS, {"model": "assistant", "input": "hello"}),
    ):
        r = post(url + path, body)
        assert r.status_code == 200
        assert sink.wait_for(lambda e, rid=r.headers["x-request-id"]: e.request_id == rid)


def test_depth_is_measured_exactly_also_past_the_bracket_count_shortcut() -> None:
    wide = {"a": [[1]] * 100}  # 201 brackets, depth 3
    body = orjson.dumps(wide)
    assert not too_deep(body, wide, limit=3) and too_deep(body, wide, limit=2)
    brackets_in_strings = {"s": "[" * 500}
    assert not too_deep(orjson.dumps(brackets_in_strings), brackets_in_strings, limit=1)


def test_the_shape_check_accepts_what_openai_accepts() -> None:
    multimodal = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": None,
        "stream_options": None,
    }
    assert completion_problem(multimodal, "chat") is None
    assert completion_problem({"model": "m", "prompt": [1, 2, 3]}, "completions") is None
    assert completion_problem({"model": "m", "input": [[1, 2]]}, "embeddings") is None
