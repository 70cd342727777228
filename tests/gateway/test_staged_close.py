"""Staged close: a client still sending when its request is refused reads the whole answer,
and its connection ends with a FIN, never a reset; the linger is bounded in time and bytes.

Reproduces issue 13's last edge: a chunked upload streaming past ``/v1/feedback``'s 64 KiB
limit once received the 413's headers but not its body. The server answered and closed the
socket while the client's body was still arriving; closing a socket with unread input makes
the kernel answer with a reset instead of a FIN, and a reset can destroy an answer the client
has not read yet (RFC 9112 §9.6). With ``linger_s=0`` (close at once) every client below that
keeps sending after the answer gets "connection reset by peer" on its next write.
"""

from __future__ import annotations

import gc
import json
import select
import socket
import time
import weakref
from collections.abc import Iterator

import pytest

from contracts.config_rules import key_hash
from gateway.settings import KiB, MiB
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    GatewayThread,
    MemorySink,
    experiment,
    http,
    refused,
    start_gateway,
    static_source,
)
from tests.serving.raw_client import PIECE, chunk, parse_400_mid_body, settled, stream, whole

# The byte bound is the product's default: at the steady uploads' 8 MB/s it leaves the server
# ~0.5 s to answer before the bytes buffered behind the refusal exhaust it (with 1 MiB, a
# loaded machine's ~130 ms answer turned the expected FIN into a reset).
LINGER_S, LINGER_BYTES = 1.0, 4 * MiB
MAX_BODY = 256 * KiB
SLACK_S = 1.5  # scheduling on a busy 2-core box
KEY = "lg-staged-close-key-0123456789"
KEYED = f"Authorization: Bearer {KEY}\r\n"


def openai_error(answer: bytes, status: int, code: str) -> None:
    got, body = whole(answer)
    assert got == status, answer
    error = json.loads(body)["error"]
    assert error["code"] == code and set(error) == {"message", "type", "param", "code"}, error


def _gateway(simulator: str, loop: str, **kw: float | int | str) -> GatewayThread:
    ups = [UpstreamConfig("sim", simulator)]
    exps = [
        experiment(
            "sc", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
        )
    ]
    return start_gateway(
        MemorySink(),
        static_source(exps, ups, frozenset({key_hash(KEY)})),
        loop,
        client_keys="required",
        max_body_bytes=MAX_BODY,
        max_header_bytes=16 * KiB,
        feedback_rate=0.0,  # this module is about closing, not the per-client rate
        linger_s=LINGER_S,
        linger_bytes=LINGER_BYTES,
        **kw,
    )


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def gw(request: pytest.FixtureRequest, simulator: str) -> Iterator[GatewayThread]:
    """The loop the entry points serve with (uvloop), and asyncio's: their transports differ."""
    with _gateway(simulator, request.param) as g:
        yield g


def _settled(g: GatewayThread) -> None:
    """Every connection gone and every request task finished, within the linger bound."""
    settled(g.server.server_state, LINGER_S + SLACK_S)


FEEDBACK_CHUNKED = (
    f"POST /v1/feedback HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Type: application/json\r\n"
    "Transfer-Encoding: chunked\r\n\r\n"
)


def test_a_chunked_feedback_upload_streaming_past_the_limit_reads_the_whole_413_every_time(
    gw: GatewayThread,
) -> None:
    """30 uploads at a steady 8 MB/s that go on for 256 KiB after the answer: each reads the
    complete 413 in the OpenAI error shape, and none is reset while it is still sending."""
    counted = refused(gw.url, "body_too_large")
    outcomes = [
        stream(gw.port, FEEDBACK_CHUNKED, chunk(PIECE), 0.002, 256 * KiB, deadline_s=5) for _ in range(30)
    ]
    for o in outcomes:
        assert o.ended == "fin", (o.ended, o.sent_after, o.answer[:200])
        assert o.sent_after >= 256 * KiB
        openai_error(o.answer, 413, "body_too_large")
        assert b"(the limit is %d bytes)" % (64 * KiB) in o.answer
    assert refused(gw.url, "body_too_large") == counted + 30
    _settled(gw)


@pytest.mark.parametrize(
    ("head", "frame", "status", "code"),
    [
        pytest.param(  # refused from the headers: the declared length is over the limit
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: {50 * MiB}\r\n\r\n",
            PIECE,
            413,
            "body_too_large",
            id="declared-413",
        ),
        pytest.param(  # refused as the chunked body crosses the limit
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Transfer-Encoding: chunked\r\n\r\n",
            chunk(PIECE),
            413,
            "body_too_large",
            id="chunked-413",
        ),
        pytest.param(  # refused from the headers (no key), the upload never read
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            chunk(PIECE),
            401,
            "invalid_api_key",
            id="chunked-401",
        ),
        pytest.param(
            f"POST /v1/feedback HTTP/1.1\r\nHost: x\r\nContent-Length: {10 * MiB}\r\n\r\n",
            PIECE,
            401,
            "invalid_api_key",
            id="declared-feedback-401",
        ),
    ],
)
def test_every_refusal_before_the_body_is_read_reaches_a_client_that_keeps_sending(
    gw: GatewayThread, head: str, frame: bytes, status: int, code: str
) -> None:
    for _ in range(10):
        o = stream(gw.port, head, frame, 0.002, 256 * KiB, deadline_s=5)
        assert o.ended == "fin", (o.ended, o.sent_after, o.answer[:200])
        openai_error(o.answer, status, code)
    _settled(gw)


def test_headers_streaming_past_their_limit_read_the_whole_431(gw: GatewayThread) -> None:
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    line = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    for _ in range(10):
        o = stream(gw.port, head, line * 4, 0.002, 64 * KiB, deadline_s=5)
        assert o.ended == "fin", (o.ended, o.sent_after, o.answer[:200])
        assert o.answer == (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
    _settled(gw)


def test_a_body_that_stops_parsing_reads_its_400_and_its_request_task_ends_at_once(
    gw: GatewayThread,
) -> None:
    """A chunked body whose chunk-size line is garbage, mid-upload: uvicorn's 400 arrives whole,
    and the request task reading the body is told at once that no more will come (it does not
    wait out the linger)."""
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Transfer-Encoding: chunked\r\n\r\n"
    parse_400_mid_body(gw.port, head.encode(), gw.server.server_state, LINGER_S)
    _settled(gw)


def test_a_client_that_never_stops_sending_is_cut_off_after_the_linger_time(gw: GatewayThread) -> None:
    """256 KiB/s for ever (well under the linger byte bound): reset ~LINGER_S after the answer."""
    o = stream(gw.port, FEEDBACK_CHUNKED, chunk(PIECE), 1 / 16, 100 * MiB, deadline_s=LINGER_S + 3 * SLACK_S)
    assert o.ended == "reset", o.ended
    openai_error(o.answer, 413, "body_too_large")
    assert LINGER_S - 0.2 <= o.ended_after_s <= LINGER_S + SLACK_S, o.ended_after_s
    assert o.sent_after < LINGER_BYTES
    _settled(gw)


def test_a_client_that_floods_is_cut_off_after_the_linger_bytes(gw: GatewayThread) -> None:
    """As fast as loopback takes it: reset once the server has dropped LINGER_BYTES, long
    before the linger time is up. (What the kernel buffered before the answer counts too: the
    reset may come at once.)"""
    o = stream(gw.port, FEEDBACK_CHUNKED, chunk(PIECE * 4), 0, 1024 * MiB, deadline_s=LINGER_S + 3 * SLACK_S)
    assert o.ended == "reset", o.ended
    openai_error(o.answer, 413, "body_too_large")
    assert o.sent >= 64 * KiB + LINGER_BYTES
    assert o.ended_after_s < LINGER_S * 0.8, o.ended_after_s
    _settled(gw)


def test_kept_alive_requests_are_served_and_an_idle_connection_closes_without_lingering(
    gw: GatewayThread,
) -> None:
    """Requests between refusals are untouched; a connection closed between requests (here:
    its client sent ``connection: close``) goes at once, not after LINGER_S."""
    body = b'{"model": "sc", "messages": [{"role": "user", "content": "hi"}]}'
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        for _ in range(3):
            s.sendall(request)
            status, _ = _one_answer(s)
            assert status == 200
        s.sendall(request.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
        status, _ = _one_answer(s)
        assert status == 200
        t0 = time.monotonic()
        assert s.recv(1) == b""
        assert time.monotonic() - t0 < LINGER_S / 2
    state = gw.server.server_state
    deadline = time.monotonic() + LINGER_S / 2
    while state.connections:
        assert time.monotonic() < deadline, "the closed connection lingered"
        time.sleep(0.01)


def _one_answer(s: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        part = s.recv(65536)
        assert part, data
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").lower().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.startswith("content-length:"))
    while len(body) < length:
        part = s.recv(65536)
        assert part, data
        body += part
    return int(lines[0].split()[1]), body


def test_shutdown_closes_idle_connections_at_once_and_waits_for_a_lingering_one_no_longer_than_its_bound(
    simulator: str,
) -> None:
    g = _gateway(simulator, "uvloop")
    with g:
        idle = socket.create_connection(("127.0.0.1", g.port), timeout=5)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _one_answer(idle)[0] == 200
        s = socket.create_connection(("127.0.0.1", g.port), timeout=5)
        s.sendall(FEEDBACK_CHUNKED.encode())
        answer, t_stop, idle_closed_after = b"", 0.0, -1.0
        deadline = time.monotonic() + LINGER_S + 3 * SLACK_S
        try:
            while time.monotonic() < deadline:  # 256 KiB/s until the server resets the connection
                s.sendall(chunk(PIECE))
                watched = ([] if t_stop else [s]) + ([idle] if idle_closed_after < 0 else [])
                readable = select.select(watched, [], [], 1 / 16)[0] if watched else []
                if not watched:
                    time.sleep(1 / 16)
                if s in readable and not t_stop:
                    answer += s.recv(65536)
                    t_stop = time.monotonic()
                    g.server.should_exit = True  # a graceful shutdown while the client lingers
                if idle in readable:
                    assert idle.recv(1) == b""
                    idle_closed_after = time.monotonic() - t_stop
            pytest.fail("the lingering connection was never closed")
        except (ConnectionResetError, BrokenPipeError):
            reset_after = time.monotonic() - t_stop
        assert t_stop, "no answer"
        openai_error(answer, 413, "body_too_large")
        assert LINGER_S - 0.2 <= reset_after <= LINGER_S + SLACK_S, reset_after
        # An idle keep-alive connection is closed by the shutdown at once, not after a linger.
        assert 0 <= idle_closed_after < LINGER_S - 0.2, idle_closed_after
        g.thread.join(timeout=LINGER_S + 2 * SLACK_S)
        assert not g.thread.is_alive(), "shutdown waited longer than the linger bound"
        s.close()
        idle.close()


def test_a_small_body_refused_from_its_headers_still_keeps_its_connection(gw: GatewayThread) -> None:
    """The staged close is for closing connections only: a refusal whose small declared body
    is discarded as it arrives keeps the connection (tests/gateway/test_refusal_connections.py)."""
    body = b'{"request_id": "r", "kind": "copy"}'
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(f"POST /v1/feedback HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        assert _one_answer(s)[0] == 401
        s.sendall(body + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _one_answer(s)[0] == 200
    r = http("GET", gw.url + "/healthz")
    assert r.status_code == 200


def test_a_closed_connection_is_freed_without_waiting_for_the_cycle_collector(simulator: str) -> None:
    """The transport's close is the protocol's: protocol and transport wrapper must not keep
    each other alive once the connection is gone, or every connection waits for the cyclic
    garbage collector (+6 µs of CPU per connection in bench/gateway/hardening_bench.py).
    asyncio's loop: uvloop keeps a cancelled keep-alive timer, and so the protocol, a while."""
    with _gateway(simulator, "asyncio") as g:
        state = g.server.server_state
        gc.disable()
        try:
            with socket.create_connection(("127.0.0.1", g.port), timeout=5) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert _one_answer(s)[0] == 200
                protocol = weakref.ref(next(iter(state.connections)))
            deadline = time.monotonic() + 5
            while protocol() is not None:
                assert time.monotonic() < deadline, gc.get_referrers(protocol())
                time.sleep(0.01)
        finally:
            gc.enable()
