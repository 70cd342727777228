"""Staged close in the analytics service: a client still sending when its request is refused
(413 for a body over the limit, 401 for a change without a credential, 431, a request that
does not parse) reads the whole JSON answer, and its connection ends with a FIN, never a
reset; the linger is bounded in time and bytes, and a deadline (408) still closes at once.

The gateway's twin is tests/gateway/test_staged_close.py (which says why a reset can destroy
an answer); both use the raw-socket client of tests/serving/raw_client.py and the one
protocol of serving.protocol, each in its own service's wiring. With ``linger_s=0`` (close at once) the
clients below that keep sending after the answer get "connection reset by peer".
"""

from __future__ import annotations

import gc
import json
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.service.server import protocol
from serving.protocol import ReadLimits
from tests.known_secrets import secret
from tests.services import analytics_service
from tests.serving.raw_client import PIECE, chunk, parse_400_mid_body, settled, stream, whole
from tests.serving.uvicorn_thread import UvicornThread

KiB, MiB = 1024, 1024 * 1024
# The byte bound is the product's default: at the steady uploads' 8 MB/s it leaves the server
# ~0.5 s to answer before the bytes buffered behind the refusal exhaust it (with 1 MiB, a
# loaded machine's ~130 ms answer turned the expected FIN into a reset).
LINGER_S, LINGER_BYTES = 1.0, 4 * MiB
MAX_BODY = 256 * KiB
BODY_TIMEOUT_S = 1.5
SLACK_S = 1.5  # scheduling on a busy 2-core box
ADMIN = secret("staged-close-admin")
ADMIN_HEAD = f"POST /api/metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n"
ANONYMOUS_HEAD = "POST /api/metrics HTTP/1.1\r\nHost: x\r\n"
CHUNKED = "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def declared(n: int) -> str:
    return f"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n"


@pytest.fixture(scope="module")
def service_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("staged-close") / "analytics.log"


@pytest.fixture(scope="module")
def port(module_database_url: str, service_log: Path) -> Iterator[int]:
    with analytics_service(
        module_database_url,
        ADMIN,
        log=service_log,
        snapshot_interval_s="0",
        rollout_controller="false",
        max_body_bytes=str(MAX_BODY),
        body_timeout_s=str(BODY_TIMEOUT_S),
        linger_s=str(LINGER_S),
        linger_bytes=str(LINGER_BYTES),
    ) as url:
        yield int(urllib.parse.urlsplit(url).port or 0)


def detail(answer: bytes, status: int) -> str:
    got, body = whole(answer)
    assert got == status, answer[:300]
    reason = json.loads(body)["detail"]
    assert isinstance(reason, str) and reason, body
    return reason


@pytest.mark.parametrize(
    ("head", "frame", "after", "status"),
    [
        pytest.param(ADMIN_HEAD + declared(50 * MiB), PIECE, 256 * KiB, 413, id="declared-413"),
        pytest.param(ADMIN_HEAD + CHUNKED, chunk(PIECE), 256 * KiB, 413, id="chunked-413"),
        # Under the size limit but too large to be read and dropped (guard.DRAIN_BYTES): the
        # missing credential is refused from the headers, with connection: close.
        pytest.param(ANONYMOUS_HEAD + declared(MAX_BODY), PIECE, MAX_BODY // 2, 401, id="declared-401"),
        pytest.param(ANONYMOUS_HEAD + CHUNKED, chunk(PIECE), 256 * KiB, 401, id="chunked-401"),
    ],
)
def test_a_refused_client_that_keeps_sending_reads_the_whole_json_answer_and_a_fin(
    port: int, head: str, frame: bytes, after: int, status: int
) -> None:
    """10 uploads at a steady 8 MB/s that go on sending after the answer, each time."""
    for _ in range(10):
        o = stream(port, head, frame, 0.002, after, deadline_s=5)
        assert o.ended == "fin", (o.ended, o.sent, o.sent_after, o.ended_after_s, o.answer[:200])
        assert o.sent_after >= after
        detail(o.answer, status)


def test_a_refused_upload_is_not_logged_as_an_application_error(port: int, service_log: Path) -> None:
    """The app stops on the disconnect the guard reported after its 413: an expected end, so
    no "Exception in ASGI application" traceback per refused upload in the service's log."""
    for _ in range(3):
        o = stream(port, ADMIN_HEAD + CHUNKED, chunk(PIECE), 0.002, 64 * KiB, deadline_s=5)
        detail(o.answer, 413)
    logged = service_log.read_text(errors="replace")
    assert "Exception in ASGI application" not in logged and "ClientDisconnect" not in logged, logged[-2000:]


def test_headers_streaming_past_their_limit_read_the_whole_431(port: int) -> None:
    line = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    for _ in range(5):
        o = stream(port, ANONYMOUS_HEAD, line * 4, 0.002, 64 * KiB, deadline_s=5)
        assert o.ended == "fin", (o.ended, o.sent_after, o.answer[:200])
        assert detail(o.answer, 431) == "request head too large"


def test_a_client_that_never_stops_sending_is_cut_off_after_the_linger_time(port: int) -> None:
    """256 KiB/s for ever (well under the linger byte bound): reset ~LINGER_S after the answer."""
    o = stream(port, ADMIN_HEAD + CHUNKED, chunk(PIECE), 1 / 16, 100 * MiB, deadline_s=LINGER_S + 3 * SLACK_S)
    assert o.ended == "reset", o.ended
    detail(o.answer, 413)
    assert LINGER_S - 0.2 <= o.ended_after_s <= LINGER_S + SLACK_S, o.ended_after_s
    assert o.sent_after < LINGER_BYTES


def test_a_client_that_floods_is_cut_off_after_the_linger_bytes(port: int) -> None:
    """As fast as loopback takes it: reset once LINGER_BYTES were dropped, long before the
    linger time is up."""
    o = stream(port, ADMIN_HEAD + CHUNKED, chunk(PIECE * 4), 0, 1024 * MiB, deadline_s=LINGER_S + 3 * SLACK_S)
    assert o.ended == "reset", o.ended
    detail(o.answer, 413)
    assert o.sent >= MAX_BODY + LINGER_BYTES
    assert o.ended_after_s < LINGER_S * 0.8, o.ended_after_s


def test_a_body_deadline_answers_408_and_closes_at_once_without_lingering(port: int) -> None:
    """A body trickling in slower than the body deadline allows: the 408 comes, then the
    connection is closed at once (a deadline must not extend the hold it bounds), so the
    client, still trickling, is reset long before a linger would have ended."""
    o = stream(
        port,
        ADMIN_HEAD + declared(MAX_BODY),
        b"x" * 64,
        0.05,
        100 * MiB,
        deadline_s=BODY_TIMEOUT_S + 3 * SLACK_S,
    )
    assert o.answer.startswith(b"HTTP/1.1 408"), o.answer[:200]
    assert o.ended == "reset", o.ended
    assert o.ended_after_s < LINGER_S / 2, o.ended_after_s


# --- the protocol alone, served in-process (its connections and tasks can be counted) --------


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``POST /read`` reads its body to the end (or to a disconnect) and answers 200; any other
    POST is answered 413 with ``connection: close`` without a byte of its body read, as the
    request guard answers a body declared over the limit; a GET is answered 200."""
    if scope["type"] != "http":
        return
    status = 200
    if scope["method"] == "POST" and scope["path"] == "/read":
        while (await receive()).get("more_body"):
            pass
    elif scope["method"] == "POST":
        status = 413
    body = b'{"detail": "refused"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _answer(s: socket.socket) -> bytes:
    """One whole answer of the app below (its body ends the same way every time)."""
    answer = b""
    while not answer.endswith(b'"refused"}'):
        part = s.recv(65536)
        assert part, answer
        answer += part
    return answer


class ServerThread(UvicornThread):
    def __init__(self, loop: str) -> None:
        limits = ReadLimits(linger_s=LINGER_S, linger_bytes=LINGER_BYTES)
        super().__init__(_app, loop=loop, http=protocol(limits), lifespan="off", log_level="warning")

    def settled(self) -> None:
        """Every connection gone and every request task finished, within the linger bound."""
        settled(self.server.server_state, LINGER_S + SLACK_S)


@pytest.fixture(params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """The loop the service runs with (uvloop), and asyncio's: their transports differ."""
    with ServerThread(request.param) as s:
        yield s


def test_lingering_connections_leave_no_connection_or_task_behind(server: ServerThread) -> None:
    # A client that stops, one that trickles for ever, one that floods.
    for every_s, after, ended in (
        (0.002, 128 * KiB, "fin"),
        (1 / 16, 100 * MiB, "reset"),
        (0, 1024 * MiB, "reset"),
    ):
        o = stream(
            server.port, ANONYMOUS_HEAD + declared(50 * MiB), PIECE, every_s, after, LINGER_S + 2 * SLACK_S
        )
        assert o.answer.startswith(b"HTTP/1.1 413") and o.ended == ended, (o.ended, o.answer[:200])
    server.settled()


def test_shutdown_waits_for_a_lingering_connection_no_longer_than_its_bound(server: ServerThread) -> None:
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _answer(idle).startswith(b"HTTP/1.1 200")
    result: list[Any] = []
    client = threading.Thread(
        target=lambda: result.append(
            stream(
                server.port,
                ANONYMOUS_HEAD + declared(50 * MiB),
                PIECE,
                1 / 16,
                100 * MiB,
                LINGER_S + 3 * SLACK_S,
            )
        )
    )
    client.start()
    deadline = time.monotonic() + 5
    while len(server.server.server_state.connections) < 2:
        assert time.monotonic() < deadline, "the lingering client never connected"
        time.sleep(0.01)
    while not any(c.transport.is_closing() for c in list(server.server.server_state.connections)):
        assert time.monotonic() < deadline, "the refused connection never started closing"
        time.sleep(0.01)
    t0 = time.monotonic()
    server.server.should_exit = True
    idle.settimeout(5)
    assert idle.recv(1) == b"", "the idle connection was not closed by the shutdown"
    assert time.monotonic() - t0 < LINGER_S / 2, "the idle connection lingered"
    server.thread.join(timeout=LINGER_S + 2 * SLACK_S)
    assert not server.thread.is_alive(), "shutdown waited longer than the linger bound"
    client.join(timeout=10)
    idle.close()
    (o,) = result
    assert o.answer.startswith(b"HTTP/1.1 413") and o.ended == "reset", (o.ended, o.answer[:200])


def test_a_body_that_stops_parsing_reads_its_400_and_its_request_task_ends_at_once(
    server: ServerThread,
) -> None:
    """A chunked body whose chunk-size line is garbage, mid-upload: uvicorn's 400 arrives whole,
    and the request task reading the body is told at once that no more will come (it does not
    wait out the linger)."""
    head = b"POST /read HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    parse_400_mid_body(server.port, head, server.server.server_state, LINGER_S)
    server.settled()


def test_a_closed_connection_is_freed_without_waiting_for_the_cycle_collector() -> None:
    """The transport uvicorn's protocol sees closes through the wrapper: the two must not keep
    each other alive once the connection is gone, or every connection waits for the cyclic
    garbage collector. asyncio's loop: uvloop keeps a cancelled keep-alive timer, and so the
    protocol, a while."""
    with ServerThread("asyncio") as server:
        state = server.server.server_state
        gc.disable()
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert _answer(s).startswith(b"HTTP/1.1 200")
                inner = next(iter(state.connections))
                refs = [weakref.ref(inner), weakref.ref(inner.transport.close.__self__)]
                del inner
            deadline = time.monotonic() + 5
            while any(r() is not None for r in refs):
                assert time.monotonic() < deadline, [gc.get_referrers(r()) for r in refs if r() is not None]
                time.sleep(0.01)
        finally:
            gc.enable()
