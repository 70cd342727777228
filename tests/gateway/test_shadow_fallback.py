"""Shadow isolation (hanging, failing, unreachable candidates) and fallback to the control."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, dead_url, experiment, post, start_gateway, static_source

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Compare two models."}]


@pytest.fixture(scope="module")
def gw(simulator: str) -> Iterator[tuple[str, MemorySink, object]]:
    sink = MemorySink()
    upstreams = [
        UpstreamConfig("sim", simulator, timeout_s=5.0),
        UpstreamConfig("sim-hang", simulator, timeout_s=30.0),
        UpstreamConfig("dead", dead_url(), connect_timeout_s=1.0),
    ]
    control = VariantConfig("control", "sim", "base", 1, True)
    exps = [
        experiment("plain", [control, VariantConfig("c", "sim", "cand", 0)], exp_id=1),
        experiment(
            "shadowed",
            [
                control,
                VariantConfig("hanging", "sim-hang", "hanger"),
                VariantConfig("failing", "sim", "broken"),
                VariantConfig("down", "dead", "cand"),
            ],
            mode="shadow",
            exp_id=2,
        ),
        experiment(
            "fb",
            [VariantConfig("control", "sim", "base", 0, True), VariantConfig("bad", "sim", "broken", 100)],
            fallback_to_control=True,
            exp_id=3,
        ),
        experiment(
            "fb-down",
            [VariantConfig("control", "sim", "base", 0, True), VariantConfig("gone", "dead", "cand", 100)],
            fallback_to_control=True,
            exp_id=4,
        ),
        experiment(
            "nofb",
            [VariantConfig("control", "sim", "base", 0, True), VariantConfig("bad", "sim", "broken", 100)],
            exp_id=5,
        ),
    ]
    with start_gateway(sink, static_source(exps, upstreams), shadow_concurrency=4, shadow_queue_size=4) as g:
        yield g.url, sink, g


def _p50(url: str, route: str, n: int = 30) -> tuple[float, list[str]]:
    times, bodies = [], []
    for i in range(n):
        t = time.perf_counter()
        r = post(url + "/v1/chat/completions", {"model": route, "messages": MSG, "user": f"u{i}"})
        times.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
        bodies.append(r.json()["choices"][0]["message"]["content"])
    return statistics.median(times), bodies


def test_hanging_failing_and_down_shadows_change_neither_response_nor_latency(
    gw: tuple[str, MemorySink, object],
) -> None:
    url, sink, _ = gw
    base_p50, base_bodies = _p50(url, "plain")
    shadow_p50, shadow_bodies = _p50(url, "shadowed")
    assert shadow_bodies == base_bodies  # same control model, same deterministic content
    assert shadow_p50 < base_p50 * 1.5 + 0.005, (base_p50, shadow_p50)
    # failing and unreachable shadows are recorded as errors, paired with their primary
    failed = sink.wait_for(lambda e: e.role == "shadow" and e.variant == "failing")
    assert failed and failed[0].status == "error" and failed[0].pair_id
    primary = [e for e in sink.interactions() if e.request_id == failed[0].pair_id]
    assert primary and primary[0].role == "primary" and primary[0].variant == "control"
    assert sink.wait_for(lambda e: e.role == "shadow" and e.variant == "down" and e.error_type == "connect")


def test_shadow_overflow_is_dropped_and_counted(gw: tuple[str, MemorySink, object]) -> None:
    url, _, g = gw
    _p50(url, "shadowed", n=20)  # the hanging shadow holds all 4 workers; the queue of 4 fills up
    metrics = g.app.runtime.metrics  # type: ignore[attr-defined]
    dropped = metrics.shadow.labels("shadowed", "exp-shadowed", "hanging", "dropped")._value.get()
    assert dropped > 0


def test_failing_candidate_falls_back_to_the_control(gw: tuple[str, MemorySink, object]) -> None:
    url, sink, _ = gw
    for route, candidate, kind in (("fb", "bad", "http_5xx"), ("fb-down", "gone", "connect")):
        r = post(url + "/v1/chat/completions", {"model": route, "messages": MSG, "user": "frank"})
        assert r.status_code == 200 and r.json()["model"] == route  # blinding: the route, not the model
        assert r.headers["x-liftgate-variant"] == candidate  # the unit's assigned arm
        rid = r.headers["x-request-id"]
        (served,) = sink.wait_for(lambda e, rid=rid: e.request_id == rid and e.fallback)
        (failed,) = [e for e in sink.interactions() if e.request_id == rid and e.status == "error"]
        assert (served.variant, served.fallback_from, served.model, served.status) == (
            candidate,
            candidate,
            "base",
            "ok",
        )
        assert (failed.variant, failed.error_type, failed.fallback, failed.role) == (
            candidate,
            kind,
            False,
            "attempt",  # one user request = one primary event
        )
        assert served.role == "primary"


def test_streaming_fallback_and_no_fallback_when_disabled(gw: tuple[str, MemorySink, object]) -> None:
    url, _, _ = gw
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    chunks = list(client.chat.completions.create(model="fb", messages=MSG, stream=True, user="gina"))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="nofb", messages=MSG, user="gina")
