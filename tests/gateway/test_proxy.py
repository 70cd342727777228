"""The real openai SDK against the gateway in front of a real simulator process."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from contracts.ngrams import NgramKey
from gateway.routing import key_hash
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    SHOW_VARIANT,
    MemorySink,
    dead_url,
    experiment,
    get,
    post,
    start_gateway,
    static_source,
)

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about foxes."}]


@pytest.fixture(scope="module")
def gw(simulator: str) -> Iterator[tuple[str, MemorySink]]:
    sink = MemorySink()
    upstreams = [
        UpstreamConfig("sim", simulator, timeout_s=5.0),
        UpstreamConfig("sim-slow", simulator, timeout_s=0.5),
        UpstreamConfig("dead", dead_url(), connect_timeout_s=1.0),
    ]
    ab = [VariantConfig("control", "sim", "base", 50, True), VariantConfig("cand", "sim", "cand", 50)]
    exps = [
        experiment("assistant", ab, exp_id=1),
        experiment(
            "down",
            [VariantConfig("control", "dead", "base", 1, True), VariantConfig("c", "dead", "cand", 0)],
            exp_id=2,
        ),
        experiment(
            "slow",
            [VariantConfig("control", "sim-slow", "hanger", 1, True), VariantConfig("c", "sim", "cand", 0)],
            exp_id=3,
        ),
        experiment(
            "midbreak",
            [VariantConfig("control", "sim", "midbreak", 1, True), VariantConfig("c", "sim", "cand", 0)],
            exp_id=4,
        ),
        experiment(
            "slow-stream",
            [VariantConfig("control", "sim", "slowstream", 1, True), VariantConfig("c", "sim", "cand", 0)],
            exp_id=7,
        ),
        experiment("paused", ab, status="paused", exp_id=5),
        experiment("gone", ab, status="stopped", exp_id=6),
    ]
    with start_gateway(sink, static_source(exps, upstreams, feedback_kinds=frozenset({"code_ran"}))) as g:
        yield g.url, sink


def test_sync_sdk_non_streaming_chat_is_routed_and_recorded(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", default_headers=SHOW_VARIANT)
    raw = client.chat.completions.with_raw_response.create(
        model="assistant",
        messages=MSG,
        extra_headers={"X-Liftgate-Unit": "alice", "X-Liftgate-Tags": "task=code"},
    )
    resp = raw.parse()
    assert resp.choices[0].message.content
    rid = raw.headers["x-request-id"]
    variant = raw.headers["x-liftgate-variant"]
    assert raw.headers["x-liftgate-experiment"] == "exp-assistant"
    assert resp.model == "assistant"  # blinding: the route asked for, whichever model answered
    (event,) = sink.wait_for(lambda e: e.request_id == rid)
    assert (event.unit_id, event.unit_source, event.variant, event.role, event.status) == (
        "alice",
        "header",
        variant,
        "primary",
        "ok",
    )
    assert event.completion_tokens == resp.usage.completion_tokens  # type: ignore[union-attr]
    assert event.response_chars == len(resp.choices[0].message.content or "")
    assert event.tags == {"task": "code"} and event.latency_ms > 0 and not event.stream


def test_same_unit_always_gets_the_same_variant(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", default_headers=SHOW_VARIANT)
    seen = {
        client.chat.completions.with_raw_response.create(model="assistant", messages=MSG, user="bob").headers[
            "x-liftgate-variant"
        ]
        for _ in range(5)
    }
    assert len(seen) == 1


def test_sync_sdk_streaming_relays_chunks_and_strips_the_usage_chunk(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    client = openai.OpenAI(base_url=url + "/v1", api_key="k")
    with client.chat.completions.with_streaming_response.create(
        model="assistant", messages=MSG, stream=True, extra_headers={"X-Liftgate-Unit": "carol"}
    ) as raw:
        rid = raw.headers["x-request-id"]
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and all(c.choices for c in chunks)  # no usage-only chunk: the client did not ask
    (event,) = sink.wait_for(lambda e: e.request_id == rid)
    assert event.stream and event.ttft_ms is not None and event.ttft_ms <= event.latency_ms
    assert event.completion_tokens and event.response_chars == len(text)


async def test_async_sdk_streaming_with_usage_and_completions(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k")
    stream = await client.chat.completions.create(
        model="assistant",
        messages=MSG,
        stream=True,
        stream_options={"include_usage": True},
        user="dave",
        extra_body={"top_k": 5, "repetition_penalty": 1.1},  # vLLM extras pass through
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    resp = await client.chat.completions.create(model="assistant", messages=MSG)
    assert resp.choices[0].message.content
    comp = await client.completions.create(model="assistant", prompt="Once upon a time", max_tokens=8)
    assert comp.choices[0].text
    await client.close()


def test_models_lists_serving_routes_only(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    ids = {m.id for m in openai.OpenAI(base_url=url + "/v1", api_key="k").models.list()}
    assert {"assistant", "paused", "down"} <= ids and "gone" not in ids


def test_paused_route_serves_the_control_without_attribution(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    for unit in ("u1", "u2", "u3", "u4", "u5", "u6"):
        r = post(
            url + "/v1/chat/completions",
            {"model": "paused", "messages": MSG},
            headers={"X-Liftgate-Unit": unit},
        )
        assert r.status_code == 200 and r.headers["x-liftgate-variant"] == "control"
        assert "x-liftgate-experiment" not in r.headers
        (event,) = sink.wait_for(lambda e, rid=r.headers["x-request-id"]: e.request_id == rid)
        assert event.experiment_id is None and event.mode == "none"


_MSGS = b'[{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_request"),
        (b"[1, 2]", 400, "invalid_request"),
        (b'{"messages": ' + _MSGS + b"}", 400, "invalid_request"),
        (b'{"model": "nope", "messages": ' + _MSGS + b"}", 404, "model_not_found"),
        (b'{"model": "gone", "messages": ' + _MSGS + b"}", 404, "model_not_found"),
        (b'{"model": "down", "messages": ' + _MSGS + b"}", 502, "upstream_unavailable"),
        (b'{"model": "slow", "messages": ' + _MSGS + b"}", 504, "upstream_timeout"),
    ],
)
def test_bad_inputs_get_openai_shaped_errors(
    gw: tuple[str, MemorySink], body: bytes, status: int, code: str
) -> None:
    url, _ = gw
    r = post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == code and set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text


def test_sdk_raises_typed_errors(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSG)


def test_mid_stream_failure_is_one_error_frame_then_done(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    r = post(url + "/v1/chat/completions", {"model": "midbreak", "messages": MSG, "stream": True})
    rid = r.headers["x-request-id"]
    events = [line for line in r.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    errors = [e for e in events if '"error"' in e]
    assert len(errors) == 1
    (event,) = sink.wait_for(lambda e: e.request_id == rid)
    assert event.status == "error"


def test_feedback_is_attributed_from_the_request_and_validated(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    r = post(url + "/v1/chat/completions", {"model": "assistant", "messages": MSG, "user": "erin"})
    rid, variant = r.headers["x-request-id"], r.headers["x-liftgate-variant"]
    ok = post(url + "/v1/feedback", {"request_id": rid, "kind": "thumbs_up"})
    assert ok.status_code == 202
    fb = [f for f in sink.feedback() if f.request_id == rid]
    assert fb and (fb[0].unit_id, fb[0].variant, fb[0].experiment_id, fb[0].value) == (
        "erin",
        variant,
        1,
        1.0,
    )
    custom = post(url + "/v1/feedback", {"request_id": rid, "kind": "code_ran", "value": 3})
    assert custom.status_code == 202
    for bad in (
        {"kind": "thumbs_up"},
        {"request_id": rid, "kind": "Bad Kind!"},
        {"request_id": rid, "kind": "rating"},
        {"request_id": rid, "kind": "rating", "value": 99},
        {"request_id": rid, "kind": "thumbs_up", "value": "yes"},
        {"request_id": rid, "kind": "custom", "value": True},
    ):
        resp = post(url + "/v1/feedback", bad)
        assert resp.status_code == 400, bad
        assert resp.json()["error"]["message"]
    assert post(url + "/v1/feedback", content=b"{oops").status_code == 400


def test_health_endpoints(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    assert get(url + "/healthz").json() == {"status": "ok"}
    ready = get(url + "/readyz")
    assert ready.status_code == 503  # the "dead" upstream is down
    assert ready.json()["upstreams"]["sim"] is True and ready.json()["upstreams"]["dead"] is False
    text = get(url + "/metrics").text
    assert 'liftgate_gateway_requests_total{experiment="exp-assistant"' in text


def test_client_api_keys_are_checked_when_required(simulator: str) -> None:
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment(
            "assistant",
            [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)],
        )
    ]
    source = static_source(exps, ups, frozenset({key_hash("sk-good")}))
    with start_gateway(sink, source, client_keys="required") as g:
        good = openai.OpenAI(base_url=g.url + "/v1", api_key="sk-good")
        assert good.chat.completions.create(model="assistant", messages=MSG).choices
        bad = openai.OpenAI(base_url=g.url + "/v1", api_key="sk-bad", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="assistant", messages=MSG)
        r = get(g.url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_embeddings_pass_through_and_are_logged(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    client = openai.OpenAI(base_url=url + "/v1", api_key="k")
    raw = client.embeddings.with_raw_response.create(model="assistant", input=["hello", "world"], user="hank")
    emb = raw.parse()
    assert len(emb.data) == 2 and len(emb.data[0].embedding) > 0
    (event,) = sink.wait_for(lambda e: e.request_id == raw.headers["x-request-id"])
    assert event.endpoint == "embeddings" and event.status == "ok" and event.unit_id == "hank"


CONTENT_KEY = "k3y-for-the-content-digests-0123456789"


def test_hashed_content_logging_stores_keyed_digests_not_text(simulator: str) -> None:
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator)]
    variants = [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
    exps = [experiment("hashed", variants, content_logging="hashed")]
    with start_gateway(sink, static_source(exps, ups), ngram_key=CONTENT_KEY, ngram_sample_rate=0.0) as g:
        ids = []
        for _ in range(2):
            r = post(g.url + "/v1/chat/completions", {"model": "hashed", "messages": MSG})
            ids.append(r.headers["x-request-id"])
        events = [sink.wait_for(lambda e, i=i: e.request_id == i)[0] for i in ids]
    text = "Say something about foxes."
    for event in events:
        # The deployment's keyed digest: not the text, and not the SHA-256 anyone can compute
        # from a guessed prompt.
        assert event.prompt == NgramKey(CONTENT_KEY).digest(text)
        assert event.prompt != hashlib.sha256(text.encode()).hexdigest()
        assert event.response is not None and len(event.response) == 64 and event.response != event.prompt
    # Equal texts, equal digests (what lets analytics count identical prompts).
    assert events[0].prompt == events[1].prompt
    # Another deployment's key gives another digest.
    assert NgramKey("another-deployment-key-abcdefgh").digest(text) != events[0].prompt


def test_hashed_content_logging_without_a_key_stores_nothing(
    simulator: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail closed: without the deployment's key no digest is stored at all (an unkeyed one
    could be matched against guessed prompts), and the operator is told once."""
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator)]
    variants = [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
    exps = [experiment("hashed", variants, content_logging="hashed")]
    with (
        caplog.at_level("WARNING", logger="gateway.recorder"),
        start_gateway(sink, static_source(exps, ups)) as g,
    ):
        ids = [
            post(g.url + "/v1/chat/completions", {"model": "hashed", "messages": MSG}).headers["x-request-id"]
            for _ in range(3)
        ]
        events = [sink.wait_for(lambda e, i=i: e.request_id == i)[0] for i in ids]
    assert [(e.status, e.prompt, e.response) for e in events] == [("ok", None, None)] * 3
    warned = [r for r in caplog.records if "without LIFTGATE_NGRAM_KEY" in r.getMessage()]
    assert len(warned) == 1


def test_targeting_on_headers_and_metadata_through_the_gateway(simulator: str) -> None:
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator)]
    variants = [VariantConfig("control", "sim", "base", 0, True), VariantConfig("cand", "sim", "cand", 100)]
    rules = (
        {"attribute": "header:x-tier", "op": "in", "values": ["pro"]},
        {"attribute": "metadata:app", "op": "eq", "values": ["ide"]},
    )
    exps = [experiment("targeted", variants, targeting=rules, forced={"qa-user": "control"})]
    with start_gateway(sink, static_source(exps, ups)) as g:
        body = {"model": "targeted", "messages": MSG, "metadata": {"app": "ide"}}

        def variant(extra: dict[str, object], headers: dict[str, str]) -> tuple[str, bool]:
            r = post(g.url + "/v1/chat/completions", {**body, **extra}, headers=headers)
            return r.headers["x-liftgate-variant"], "x-liftgate-experiment" in r.headers

        assert variant({}, {"x-tier": "pro", "x-liftgate-unit": "u1"}) == ("cand", True)
        assert variant({}, {"x-tier": "free", "x-liftgate-unit": "u1"}) == ("control", False)
        assert variant({"metadata": {"app": "web"}}, {"x-tier": "pro", "x-liftgate-unit": "u1"}) == (
            "control",
            False,
        )
        assert variant({}, {"x-tier": "pro", "x-liftgate-unit": "qa-user"}) == ("control", False)


def test_a_client_that_hangs_up_mid_stream_stops_the_upstream_call(gw: tuple[str, MemorySink]) -> None:
    import http.client
    import json
    import time

    url, sink = gw
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    t0 = time.monotonic()
    body = {"model": "slow-stream", "messages": MSG, "stream": True}
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps(body), headers={"content-type": "application/json"}
    )
    resp = conn.getresponse()
    rid = resp.getheader("x-request-id")
    assert resp.status == 200
    assert resp.read(5) == b"data:"  # the stream has started
    assert conn.sock is not None
    conn.sock.close()
    conn.close()
    (event,) = sink.wait_for(lambda e: e.request_id == rid, timeout=8)
    assert event.finish_reason == "client_closed"
    assert event.latency_ms < 3000 and time.monotonic() - t0 < 3.5  # the full answer takes ~4 s
