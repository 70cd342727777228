"""A request the analytics service refuses from its headers alone (no admin token, a wrong
one, a control character in the path) reaches the client as an answer, never as a reset:
with a small declared body the connection stays open and the body is discarded as it
arrives (the gateway's twin: tests/gateway/test_refusal_connections.py, which says why)."""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Iterator

import pytest

from tests.gateway.test_refusal_connections import _answer
from tests.known_secrets import secret
from tests.services import analytics_service

ADMIN = secret("refusal-admin")
BODY = b'{"name": "m_refused", "kind": "mean", "numerator": "requests"}'


@pytest.fixture(scope="module")
def port(module_database_url: str) -> Iterator[int]:
    with analytics_service(
        module_database_url, ADMIN, snapshot_interval_s="0", rollout_controller="false"
    ) as url:
        yield int(urllib.parse.urlsplit(url).port or 0)


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/api/metrics", "", 401),
        ("/api/metrics", "Authorization: Bearer wrong-token-0123456789\r\n", 403),
        ("/api/experiments/a%00b/snapshot", "", 400),
    ],
)
def test_a_request_refused_before_its_body_arrives_keeps_its_connection(
    port: int, path: str, headers: str, status: int
) -> None:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head.encode())  # the headers alone, as http.client writes them first
        answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 %d" % status), answer
        assert b"connection: close" not in answer.lower(), answer
        s.sendall(BODY)  # arrives after the answer: discarded, no reset
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(s).startswith(b"HTTP/1.1 200")
