"""A request refused from its headers alone (no key, no admin token, a bad liftgate header)
must reach the client as an answer, never as a connection reset.

Found by the fuzz suite (tests/fuzz): clients such as Python's http.client (under requests
and urllib3) write the headers and the body of a request separately. The gateway answered
such a request from its headers and closed the connection; when the body arrived just
before the close, the kernel reset the connection — and a reset destroys the answer that
has not been read yet, so the client saw "connection reset by peer" instead of a 401. A
refused request with a small declared body now keeps its connection (the server discards
the body as it arrives); a large or chunked one is still refused with `connection: close`,
its connection closed in stages (tests/gateway/test_body_limits.py,
tests/gateway/test_staged_close.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, experiment, start_gateway, static_source

BODY = b'{"model": "r", "messages": [{"role": "user", "content": "hello"}]}'


@pytest.fixture(scope="module")
def port(simulator: str) -> Iterator[int]:
    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment("r", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand")])
    ]
    with start_gateway(MemorySink(), static_source(exps, ups), client_keys="required") as g:
        yield g.port


def _answer(s: socket.socket) -> bytes:
    """One whole response (headers and a Content-Length body) from ``s``."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = s.recv(65536)
        assert part, f"connection closed before an answer: {data!r}"
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        part = s.recv(65536)
        assert part, f"connection closed mid-answer: {data!r}"
        body += part
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/chat/completions", "", 401),  # no client key (the proxy)
        ("/v1/chat/completions", "Authorization: Bearer lg-made-up-key-0123456789\r\n", 401),
        ("/v1/feedback", "", 401),  # no client key (the guard)
        ("/admin/upstreams", "", 401),  # no admin token
        ("/admin/upstreams", "Authorization: Bearer not-the-admin-token-0123\r\n", 403),
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
        s.sendall(BODY)  # the body arrives after the answer: discarded, no reset
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(s).startswith(b"HTTP/1.1 200")


def test_a_chunked_request_refused_before_its_body_is_still_closed(port: int) -> None:
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head.encode())
        answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 401") and b"connection: close" in answer.lower(), answer
        assert s.recv(1) == b""  # an upload of unknown size is never read
