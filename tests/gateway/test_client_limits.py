"""Per-client limits: completion requests in flight and feedback calls per second (429 + Retry-After)."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from gateway.limits import ConcurrencyLimit, RateLimit
from gateway.routing import key_hash
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, experiment, post, start_gateway, static_source

MSG = [{"role": "user", "content": "hi"}]


def test_requests_beyond_a_client_s_concurrency_limit_get_429_with_retry_after(simulator: str) -> None:
    ups = [UpstreamConfig("sim", simulator), UpstreamConfig("sim-hang", simulator, timeout_s=3.0)]
    exps = [
        experiment(
            "slow",
            [VariantConfig("control", "sim-hang", "hanger", 1, True), VariantConfig("c", "sim", "cand", 0)],
        ),
        experiment(
            "fast",
            [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)],
            exp_id=2,
        ),
    ]
    keys = frozenset({key_hash("sk-alice"), key_hash("sk-bob")})
    sink = MemorySink()
    with start_gateway(
        sink, static_source(exps, ups, keys), client_keys="required", client_max_concurrency=2
    ) as g:
        results: list[int] = []

        def hang() -> None:
            r = post(g.url + "/v1/chat/completions", {"model": "slow", "messages": MSG},
                     headers={"Authorization": "Bearer sk-alice"})  # fmt: skip
            results.append(r.status_code)

        threads = [threading.Thread(target=hang) for _ in range(2)]
        for t in threads:
            t.start()
        proxy = g.app.runtime.proxy
        assert proxy is not None
        deadline = time.monotonic() + 3
        while proxy.concurrency.in_flight.get(key_hash("sk-alice"), 0) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = len(sink.events)
        r = post(
            g.url + "/v1/chat/completions",
            {"model": "fast", "messages": MSG},
            headers={"Authorization": "Bearer sk-alice"},
        )
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert (
            r.json()["error"]["code"] == "rate_limit_exceeded"
            and r.json()["error"]["type"] == "rate_limit_error"
        )
        assert not [e for e in sink.interactions()[before:] if e.route == "fast"]
        # Another client is not affected, and the SDK maps the answer to its typed error.
        bob = openai.OpenAI(base_url=g.url + "/v1", api_key="sk-bob")
        assert bob.chat.completions.create(model="fast", messages=MSG).choices  # type: ignore[arg-type]
        alice = openai.OpenAI(base_url=g.url + "/v1", api_key="sk-alice", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            alice.chat.completions.create(model="fast", messages=MSG)  # type: ignore[arg-type]
        for t in threads:
            t.join(timeout=10)
        assert results == [504, 504]  # the hanging upstream timed out; the slots are freed
        deadline = time.monotonic() + 3  # just after the answers (the event is recorded first)
        while proxy.concurrency.in_flight:
            assert time.monotonic() < deadline, proxy.concurrency.in_flight
            time.sleep(0.01)
        assert alice.chat.completions.create(model="fast", messages=MSG).choices  # type: ignore[arg-type]


def test_feedback_beyond_a_client_s_rate_gets_429_with_retry_after() -> None:
    sink = MemorySink()
    with start_gateway(sink, static_source([], []), feedback_rate=0.5, feedback_burst=3) as g:
        codes = [
            post(g.url + "/v1/feedback", {"request_id": f"r{i}", "kind": "copy"}).status_code
            for i in range(5)
        ]
        assert codes == [202, 202, 202, 429, 429]
        r = post(g.url + "/v1/feedback", {"request_id": "r", "kind": "copy"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) in (1, 2)
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert len(sink.feedback()) == 3


def test_concurrency_limit_counts_per_client_and_forgets_idle_ones() -> None:
    limit = ConcurrencyLimit(2)
    assert limit.acquire("a") and limit.acquire("a") and not limit.acquire("a")
    assert limit.acquire("b")
    limit.release("a")
    assert limit.acquire("a")
    for client in ("a", "a", "b"):
        limit.release(client)
    assert limit.in_flight == {}
    unlimited = ConcurrencyLimit(0)
    assert all(unlimited.acquire("a") for _ in range(1000)) and unlimited.in_flight == {}


def test_rate_limit_refills_at_its_rate_and_says_how_long_to_wait() -> None:
    now = [0.0]
    rate = RateLimit(2.0, 4, clock=lambda: now[0])
    assert [rate.take("a") for _ in range(4)] == [0.0] * 4
    assert rate.take("a") == pytest.approx(0.5)
    now[0] += 0.5
    assert rate.take("a") == 0.0 and rate.take("a") > 0
    assert rate.take("b") == 0.0  # per client
    now[0] += 100
    assert [rate.take("a") for _ in range(4)] == [0.0] * 4 and rate.take("a") > 0  # capped at the burst


def test_rate_limit_memory_stays_bounded_under_client_churn() -> None:
    now = [0.0]
    rate = RateLimit(1.0, 2, clock=lambda: now[0], max_clients=1000)
    for i in range(50_000):
        now[0] += 0.0001
        assert rate.take(f"client-{i}") == 0.0  # a new client always starts with a full bucket
        assert len(rate.buckets) <= 1001
    hot = RateLimit(1.0, 2, clock=lambda: now[0], max_clients=1000)
    hot.take("steady")
    hot.take("steady")
    assert hot.take("steady") > 0  # still limited: eviction only drops the oldest when it must
