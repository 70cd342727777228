"""Client API keys are an explicit setting and fail closed (real PostgreSQL, real server, real SDK).

Reproduces the attack of issue 13: once the last key was revoked, ``/v1/*`` accepted no key,
revoked keys and made-up keys, because enforcement was inferred from "some key exists".
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.config_source import DatabaseConfigSource
from gateway.routing import key_hash
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    ADMIN_TOKEN,
    GatewayThread,
    MemorySink,
    experiment,
    get,
    http,
    post,
    refused,
    start_gateway,
    static_source,
)

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MSG = [{"role": "user", "content": "hello"}]


def _admin(url: str, method: str, path: str, body: Any = None) -> Any:
    return http(method, url + "/admin" + path, body, headers=AUTH)


def _chat(url: str, route: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return post(url + "/v1/chat/completions", {"model": route, "messages": MSG}, headers=headers).status_code


def _until(predicate: Any, limit: float = 3.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def keyed(module_database_url: str, simulator: str) -> Iterator[tuple[str, MemorySink, str]]:
    """A gateway with keys required, on a database of this module's own (its keys are all ours)."""
    sink = MemorySink()
    with start_gateway(
        sink,
        DatabaseConfigSource(module_database_url),
        database_url=module_database_url,
        refresh_interval_s=0.2,
        client_keys="required",
    ) as g:
        assert _admin(g.url, "POST", "/upstreams", {"name": "sim", "base_url": simulator}).status_code == 201
        exp = {
            "name": "keyed",
            "route": "keyed",
            "mode": "ab",
            "variants": [
                {"name": "control", "upstream": "sim", "model": "base", "weight": 1, "is_control": True},
                {"name": "cand", "upstream": "sim", "model": "cand", "weight": 0},
            ],
        }
        assert _admin(g.url, "POST", "/experiments", exp).status_code == 201
        assert _admin(g.url, "POST", "/experiments/keyed/start").status_code == 200
        yield g.url, sink, "keyed"


def test_with_keys_required_and_no_key_at_all_every_call_is_refused(
    keyed: tuple[str, MemorySink, str],
) -> None:
    url, sink, route = keyed
    _until(lambda: route in get(url + "/readyz").json()["routes"])  # the route is loaded
    before, counted = len(sink.events), refused(url, "unauthorized")
    for key in (None, "sk-made-up-key-123456"):
        r = post(url + "/v1/chat/completions", {"model": route, "messages": MSG},
                 headers={"Authorization": f"Bearer {key}"} if key else {})  # fmt: skip
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert get(url + "/v1/models").status_code == 401
    assert post(url + "/v1/feedback", {"request_id": "req-x", "kind": "thumbs_up"}).status_code == 401
    assert len(sink.events) == before  # nothing refused became an event
    assert refused(url, "unauthorized") == counted + 4


def test_revoking_the_last_key_closes_the_door_for_every_key(keyed: tuple[str, MemorySink, str]) -> None:
    url, _, route = keyed
    created = _admin(url, "POST", "/api-keys", {"name": "only-key"})
    assert created.status_code == 201
    key = created.json()["key"]
    _until(lambda: _chat(url, route, key) == 200)
    assert _chat(url, route, None) == 401
    assert _chat(url, route, "sk-made-up-key-123456") == 401
    sdk = openai.OpenAI(base_url=url + "/v1", api_key=key)
    assert sdk.chat.completions.create(model=route, messages=MSG).choices  # type: ignore[arg-type]
    assert _admin(url, "DELETE", "/api-keys/only-key").json()["revoked"] is True
    _until(lambda: _chat(url, route, key) == 401)
    # The last key is gone: no key, the revoked key and a made-up one are all refused, for good.
    for _ in range(5):
        assert {_chat(url, route, k) for k in (None, key, "sk-made-up-key-123456")} == {401}
        time.sleep(0.2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0).models.list()


def test_the_key_is_checked_before_the_body_is_read(keyed: tuple[str, MemorySink, str]) -> None:
    """A 31 MiB upload without a valid key: 401 after the headers alone, connection closed."""
    url, _, route = keyed
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-made-up-key-123456\r\nContent-Length: {31 * 1024 * 1024}\r\n\r\n"
        )
        s.sendall(head.encode() + b'{"model": "' + route.encode() + b'"')  # and never the rest
        t0 = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 401") and time.monotonic() - t0 < 2.0
        assert b"connection: close" in answer.lower() and b'"invalid_api_key"' in answer
        assert s.recv(1) == b""  # the server closed: the 31 MiB are never read


def test_keys_off_is_an_explicit_choice_that_ignores_keys(simulator: str) -> None:
    sink = MemorySink()
    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment(
            "open", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
        )
    ]
    with start_gateway(
        sink, static_source(exps, ups, frozenset({key_hash("sk-good")})), client_keys="off"
    ) as g:
        assert _chat(g.url, "open", None) == 200
        assert _chat(g.url, "open", "sk-anything") == 200


def test_keys_are_required_by_default(simulator: str) -> None:
    """An operator who sets nothing gets the closed door (``liftgate up`` opts out explicitly)."""
    from gateway.app import create_app
    from gateway.settings import GatewaySettings
    from gateway.telemetry import GatewayMetrics

    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment(
            "closed", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
        )
    ]
    settings = GatewaySettings(
        admin_token=ADMIN_TOKEN, database_url="postgresql+psycopg://unused@127.0.0.1:1/x"
    )
    assert settings.client_keys == "required"
    app = create_app(settings, MemorySink(), config_source=static_source(exps, ups), metrics=GatewayMetrics())
    with GatewayThread(app) as g:
        assert _chat(g.url, "closed", None) == 401
        assert _chat(g.url, "closed", "sk-anything") == 401
