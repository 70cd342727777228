"""Server read deadlines: slow or silent clients are disconnected within the documented timeouts.

Reproduces issue 13: 50 never-ending chunked bodies, 50 slowloris header streams and 50
short-Content-Length bodies were all held for 45 s, none closed by the server.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    ADMIN_TOKEN,
    GatewayThread,
    MemorySink,
    experiment,
    post,
    start_gateway,
    static_source,
)

HEADER_S, BODY_S, KEEP_ALIVE_S = 1.0, 1.0, 1
SLACK_S = 1.5  # scheduling on a busy 2-core box


@dataclass
class Client:
    kind: str
    sock: socket.socket
    opened: float
    trickle: bytes = b""  # sent again and again until the server closes
    closed_at: float | None = None
    answer: bytes = field(default=b"")


@pytest.fixture(scope="module")
def gw(simulator: str) -> Iterator[GatewayThread]:
    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment(
            "t", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
        )
    ]
    with start_gateway(
        MemorySink(),
        static_source(exps, ups),
        header_timeout_s=HEADER_S,
        body_timeout_s=BODY_S,
        keep_alive_timeout_s=KEEP_ALIVE_S,
        client_max_concurrency=0,  # this test is about deadlines, not the per-client limit
    ) as g:
        yield g


def _open(port: int, kind: str, first: bytes, trickle: bytes = b"") -> Client:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setblocking(False)
    if first:
        s.sendall(first)
    return Client(kind, s, time.monotonic(), trickle)


def _watch(clients: list[Client], limit_s: float) -> None:
    """Trickle bytes every 0.2 s on each client until the server closes it (or ``limit_s``)."""
    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.sock, selectors.EVENT_READ, c)
    end = time.monotonic() + limit_s
    next_trickle = time.monotonic() + 0.2
    open_count = len(clients)
    while open_count and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            c: Client = key.data
            try:
                data = c.sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if data:
                c.answer += data
                continue
            c.closed_at = time.monotonic()
            sel.unregister(c.sock)
            open_count -= 1
        if time.monotonic() >= next_trickle:
            next_trickle += 0.2
            for c in clients:
                if c.closed_at is None and c.trickle:
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError, BlockingIOError):
                        c.sock.send(c.trickle)
    sel.close()
    for c in clients:
        c.sock.close()


def test_slowloris_never_ending_and_short_bodies_are_all_closed_within_the_deadlines(
    gw: GatewayThread,
) -> None:
    port = gw.port
    clients: list[Client] = []
    paths = ["/v1/chat/completions", "/v1/feedback", "/admin/upstreams"]
    auth = f"Authorization: Bearer {ADMIN_TOKEN}\r\n"
    for i in range(50):
        clients.append(
            _open(port, "slowloris", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", b"X-a: b\r\n")
        )
        path = paths[i % 3]
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
        clients.append(
            _open(port, "chunked", (head + "Transfer-Encoding: chunked\r\n\r\n").encode(), b"1\r\n \r\n")
        )
        clients.append(_open(port, "short", (head + "Content-Length: 1000\r\n\r\n").encode() + b'{"model": '))
    for _ in range(10):
        clients.append(_open(port, "silent", b""))
    _watch(clients, limit_s=HEADER_S + BODY_S + 2 * SLACK_S)
    held = [c.kind for c in clients if c.closed_at is None]
    assert not held, f"{len(held)} connections still open: {sorted(set(held))}"
    for c in clients:
        assert c.closed_at is not None
        waited = c.closed_at - c.opened
        deadline = HEADER_S if c.kind in ("slowloris", "silent") else BODY_S
        # Closed by the deadline: not before it, and not much after.
        assert deadline - 0.3 <= waited <= deadline + SLACK_S, (c.kind, waited)
    assert all(c.answer.startswith(b"HTTP/1.1 408") for c in clients if c.kind == "slowloris")
    assert all(c.answer == b"" for c in clients if c.kind in ("silent", "chunked", "short"))


def test_an_idle_keep_alive_connection_is_closed(gw: GatewayThread) -> None:
    c = _open(gw.port, "idle", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    _watch([c], limit_s=KEEP_ALIVE_S + 2 * SLACK_S)
    assert c.answer.startswith(b"HTTP/1.1 200") and c.closed_at is not None
    assert KEEP_ALIVE_S - 0.3 <= c.closed_at - c.opened <= KEEP_ALIVE_S + SLACK_S


def _answer(s: socket.socket) -> bytes:
    """One whole answer to a GET /healthz (a JSON body with a content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, "closed before an answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "closed mid-answer"
        body += chunk
    return head


def test_the_keep_alive_deadline_counts_from_the_last_answer(gw: GatewayThread) -> None:
    """A connection idle for part of the keep-alive time and then used again is closed a whole
    keep-alive time after its last answer, not after its first."""
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=KEEP_ALIVE_S + 2 * SLACK_S) as s:
        s.sendall(get)
        assert _answer(s).startswith(b"HTTP/1.1 200")
        time.sleep(0.6 * KEEP_ALIVE_S)  # idle, but within the keep-alive time
        s.sendall(get)
        assert _answer(s).startswith(b"HTTP/1.1 200")
        last = time.monotonic()
        assert s.recv(65536) == b""  # closed by the server
        idle = time.monotonic() - last
    assert KEEP_ALIVE_S - 0.3 <= idle <= KEEP_ALIVE_S + SLACK_S


def test_a_request_arriving_when_the_keep_alive_time_runs_out_is_answered(gw: GatewayThread) -> None:
    """The keep-alive timer is the connection's (serving.protocol): when it comes due while a
    request is still arriving, the request is answered, and the connection is closed a whole
    keep-alive time after that answer."""
    body = b'{"model": "t", "messages": [{"role": "user", "content": "hi"}]}'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", gw.port), timeout=KEEP_ALIVE_S + 2 * SLACK_S) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(s).startswith(b"HTTP/1.1 200")
        first = time.monotonic()
        time.sleep(0.7 * KEEP_ALIVE_S)
        s.sendall(head + body[:10])  # the keep-alive time of the first answer ends mid-body
        time.sleep(max(0.0, first + 1.2 * KEEP_ALIVE_S - time.monotonic()))
        s.sendall(body[10:])
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            assert chunk, "closed before the answer"
            answer += chunk
        last = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        while chunk := s.recv(65536):  # the rest of the answer, then the server's close
            pass
        idle = time.monotonic() - last
    assert KEEP_ALIVE_S - 0.3 <= idle <= KEEP_ALIVE_S + SLACK_S


def test_oversized_headers_are_refused_with_431(gw: GatewayThread) -> None:
    big = b"X-Big: " + b"a" * 8000 + b"\r\n"
    c = _open(gw.port, "big", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + big * 10)
    _watch([c], limit_s=3)
    assert c.answer.startswith(b"HTTP/1.1 431") and c.closed_at is not None


def test_slow_but_steady_clients_within_the_deadlines_are_served(gw: GatewayThread) -> None:
    """A request split over several packets, each well inside the deadlines, is answered."""
    body = b'{"model": "t", "messages": [{"role": "user", "content": "hi"}]}'
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        for part in (b"POST /v1/chat/completions HTTP/1.1\r\n", b"Host: x\r\nContent-Length: %d\r\n\r\n" % len(body),
                     body[:20], body[20:]):  # fmt: skip
            s.sendall(part)
            time.sleep(0.3)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")
    # And an ordinary client on a kept-alive connection is unaffected.
    assert (
        post(
            gw.url + "/v1/chat/completions", {"model": "t", "messages": [{"role": "user", "content": "x"}]}
        ).status_code
        == 200
    )
