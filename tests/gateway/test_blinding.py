"""Blinding through the real gateway with the real openai client: by default a client sees the
route it asked for as ``model`` (JSON and streamed) and no arm header unless it asks; each
experiment can choose otherwise."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.blinding import model_echo
from gateway.relay import CallResult, SseFilter
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, experiment, start_gateway, static_source

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about foxes."}]
SHOW = {"X-Liftgate-Show-Variant": "true"}


@pytest.fixture(scope="module")
def url(simulator: str) -> Iterator[str]:
    ups = [UpstreamConfig("sim", simulator, timeout_s=5.0)]
    arms = [
        VariantConfig("control", "sim", "base", 50, True),
        VariantConfig("cand", "sim", "cand", 50),
    ]
    exps = [
        experiment("blind", arms, exp_id=1),
        experiment("open", arms, exp_id=2, echo_model=False, variant_header="always"),
        experiment("sealed", arms, exp_id=3, variant_header="never"),
    ]
    with start_gateway(MemorySink(), static_source(exps, ups)) as g:
        yield g.url


def _client(url: str, headers: dict[str, str] | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="k", default_headers=headers or {})


def test_by_default_the_model_is_the_route_and_the_arm_is_not_named(url: str) -> None:
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6"):
        raw = _client(url).chat.completions.with_raw_response.create(model="blind", messages=MSG, user=unit)
        assert raw.parse().model == "blind"
        assert "x-liftgate-variant" not in raw.headers and "x-liftgate-experiment" not in raw.headers
        assert raw.headers["x-request-id"]  # feedback still needs it
        chunks = list(
            _client(url).chat.completions.create(model="blind", messages=MSG, user=unit, stream=True)
        )
        assert chunks and {c.model for c in chunks} == {"blind"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_client_that_asks_is_told_its_arm_but_the_model_stays_the_route(url: str) -> None:
    seen = set()
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"):
        raw = _client(url, SHOW).chat.completions.with_raw_response.create(
            model="blind", messages=MSG, user=unit
        )
        assert raw.parse().model == "blind"
        assert raw.headers["x-liftgate-experiment"] == "exp-blind"
        seen.add(raw.headers["x-liftgate-variant"])
    assert seen == {"control", "cand"}


def test_an_experiment_can_show_the_real_model_and_always_name_the_arm(url: str) -> None:
    models = {}
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6", "u7", "u8"):
        raw = _client(url).chat.completions.with_raw_response.create(model="open", messages=MSG, user=unit)
        models[raw.headers["x-liftgate-variant"]] = raw.parse().model
    assert models == {"control": "base", "cand": "cand"}


def test_an_experiment_can_refuse_to_name_the_arm_even_when_asked(url: str) -> None:
    raw = _client(url, SHOW).chat.completions.with_raw_response.create(
        model="sealed", messages=MSG, user="u1"
    )
    assert raw.parse().model == "sealed" and "x-liftgate-variant" not in raw.headers


# --- the rewrite itself (gateway.blinding, and the relay that applies it per SSE event) ---

# The definition: the first "model" key outside any string (not after a backslash) with a
# string value, in each JSON document and in each SSE event.
_REFERENCE = re.compile(rb'(?<!\\)"model"\s*:\s*"(?:[^"\\]|\\.)*"')
_TEXT = 'He said "model": "x" and \\"model\\" twice; a\\\\"b'


def _reference(doc: bytes, route: str, count: int = 1) -> bytes:
    value = b'"model":' + orjson.dumps(route)
    return _REFERENCE.sub(lambda _: value, doc, count=count)


def _documents(model: str) -> list[bytes]:
    """JSON answers (or SSE event payloads) an upstream could send for ``model``."""
    obj = {
        "id": "c1",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": _TEXT}}],
        "meta": {"model": "nested"},
        'a"model': "key ending in model",
    }
    return [
        orjson.dumps(obj),
        json.dumps(obj).encode(),  # spaces after the colons, non-ASCII escaped
        json.dumps(obj, indent=2, ensure_ascii=False).encode(),
        orjson.dumps({'a"model': model, "model": model}),  # a key ending in "model" comes first
        b'{"model":null,"x":{"model":' + orjson.dumps(model) + b"}}",
        b'{"choices":[]}',
        b"",
    ]


MODELS = ["cand", "fake", 'we"ird\\name', "modèle-ü", ""]
ROUTES = ["fake", "blind", 'r"o\\ute', "ruta-ñ"]


@pytest.mark.parametrize("upstream_model", MODELS)
@pytest.mark.parametrize("route", ROUTES)
def test_the_first_model_field_of_an_answer_is_rewritten_exactly_where_the_definition_says(
    upstream_model: str, route: str
) -> None:
    echo = model_echo(route)
    for answered in (upstream_model, "another-model"):  # the usual echo, and an upstream that renames
        for doc in _documents(answered):
            assert echo.first(doc, upstream_model) == _reference(doc, route), doc


def _event_reference(payload: bytes, route: str) -> bytes:
    """An event whose model already is the route is relayed as it came, whatever its spelling."""
    try:
        already = orjson.loads(payload).get("model") == route
    except orjson.JSONDecodeError:
        already = False
    return payload if already else _reference(payload, route)


def _relay(raw: bytes, route: str, piece: int) -> bytes:
    flt = SseFilter(CallResult(), chat=True, keep_usage=True, keep_text=False, t0=0.0, echo=model_echo(route))
    return b"".join(flt.feed(raw[i : i + piece]) for i in range(0, len(raw), piece)) + flt.flush()


@pytest.mark.parametrize("upstream_model", MODELS)
@pytest.mark.parametrize("route", ROUTES)
def test_the_relay_rewrites_the_first_model_field_of_every_streamed_event(
    upstream_model: str, route: str
) -> None:
    chunk = {"id": "c1", "model": upstream_model, "choices": [{"delta": {"content": _TEXT}}]}
    payloads = [
        *(orjson.dumps({**chunk, "choices": [{"delta": {"content": f'"model":"{i}"'}}]}) for i in range(5)),
        orjson.dumps({**chunk, "model": "another-model"}),
        json.dumps(chunk).encode(),
        orjson.dumps({'a"model': upstream_model, **chunk}),
        orjson.dumps({"model": route, "choices": [], "usage": {"prompt_tokens": 1}}),
        orjson.dumps({"error": {"message": "no model here"}}),
        b'{"model":null,"x":{"model":' + orjson.dumps(upstream_model) + b"}}",
        b'{"model":' + orjson.dumps(upstream_model) + b", not json",
    ]
    for sep in (b"\n\n", b"\r\n\r\n"):
        raw = b"".join(b"data: " + p + sep for p in payloads) + b"data: [DONE]" + sep
        want = (
            b"".join(b"data: " + _event_reference(p, route) + sep for p in payloads) + b"data: [DONE]" + sep
        )
        for piece in (1, 37, len(raw)):
            assert _relay(raw, route, piece) == want


def test_bytes_relayed_without_an_event_boundary_have_every_model_field_rewritten() -> None:
    raw = b"data: " + b'{"model":"cand","x":"' + b"a" * (1 << 20) + b'"},{"model":"cand"}'
    out = _relay(raw, "chat", len(raw))
    assert out == _reference(raw, "chat", count=0) and out.count(b'"model":"chat"') == 2


def test_the_streamed_text_is_relayed_untouched_and_every_event_names_the_route() -> None:
    block = b"".join(
        b"data: "
        + orjson.dumps({"model": "cand-7b", "choices": [{"delta": {"content": f'"model":"{i}"'}}]})
        + b"\n\n"
        for i in range(20)
    )
    out = _relay(block, "chat", 64)
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [e["model"] for e in events] == ["chat"] * 20
    assert [e["choices"][0]["delta"]["content"] for e in events] == [f'"model":"{i}"' for i in range(20)]
