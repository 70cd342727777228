"""serving.protocol.respond: a whole response in one write, as the two ASGI messages would
send it — same status line, headers and body, the same keep-alive and close decisions, the
same refusal of bad header values — and a plain ``False`` (nothing sent) whenever the answer
must go through ASGI instead. Driven through the protocol with an in-memory transport, so
every write is seen as it happens."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from serving.protocol import (
    RESPOND,
    ReadLimits,
    Refusals,
    arrived_body,
    disconnection,
    protocol_class,
    respond,
)
from tests.serving.test_protocol import Transport

BODY = b'{"ok":true}'
HEADERS = [(b"content-type", b"application/json"), (b"x-request-id", b"req-1")]
App = Callable[[Any, Any, Any], Awaitable[None]]


class Recording(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.open_at_end = False  # still open when the client was done

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        super().write(data)


def connected(app: App, limits: ReadLimits | None = None) -> tuple[Any, Recording]:
    """A serving protocol for ``app`` on a recording transport (call inside a running loop)."""
    config = Config(app, log_level="critical", access_log=False, lifespan="off")
    config.load()
    cls = protocol_class(limits or ReadLimits(), Refusals())
    proto = cls(config=config, server_state=ServerState(), app_state={})
    transport = Recording()
    proto.connection_made(transport)
    return proto, transport


def drive(app: App, reads: list[bytes]) -> Recording:
    async def main() -> Recording:
        proto, transport = connected(app, ReadLimits(linger_s=0.05))
        for data in reads:
            if not transport.closed:
                proto.data_received(data)
            await asyncio.sleep(0.02)
        transport.open_at_end = not (transport.closed or transport.eof)
        proto.connection_lost(None)
        return transport

    return asyncio.run(main())


def request(extra: bytes = b"", method: bytes = b"POST") -> bytes:
    return method + b" /x HTTP/1.1\r\nHost: x\r\n" + extra + b"Content-Length: 2\r\n\r\n{}"


async def by_respond(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    assert respond(scope, 200, list(HEADERS), BODY)


async def by_asgi(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    headers = [*HEADERS, (b"content-length", b"%d" % len(BODY))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})


def parsed(answer: bytes) -> tuple[bytes, set[bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, set(lines), body


def test_a_whole_response_leaves_in_one_write_with_the_bytes_the_two_asgi_messages_send() -> None:
    fast = drive(by_respond, [request()])
    slow = drive(by_asgi, [request()])
    assert len(fast.writes) == 1
    assert parsed(fast.sent) == parsed(slow.sent)
    assert parsed(fast.sent)[0] == b"HTTP/1.1 200 OK"
    assert fast.open_at_end and slow.open_at_end  # keep-alive, as with ASGI


def test_requests_on_one_connection_are_each_answered_and_the_connection_stays_open() -> None:
    t = drive(by_respond, [request(), request(), request()])
    assert t.sent.count(b"HTTP/1.1 200 OK") == 3
    assert len(t.writes) == 3
    assert t.open_at_end


def test_pipelined_requests_are_answered_in_order() -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        rid = dict(scope["headers"])[b"x-id"]
        seen.append(rid)
        if not respond(scope, 200, [(b"x-id", rid)], rid):
            headers = [(b"x-id", rid), (b"content-length", b"1")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": rid})

    t = drive(app, [request(b"X-Id: a\r\n") + request(b"X-Id: b\r\n") + request(b"X-Id: c\r\n")])
    assert seen == [b"a", b"b", b"c"]
    assert [parsed(part)[2][-1:] for part in t.sent.split(b"HTTP/1.1 ")[1:]] == [b"a", b"b", b"c"]


def test_a_client_that_asks_to_close_gets_connection_close_and_the_connection_closes() -> None:
    fast = drive(by_respond, [request(b"Connection: close\r\n"), request()])
    slow = drive(by_asgi, [request(b"Connection: close\r\n"), request()])
    assert b"connection: close" in parsed(fast.sent)[1]
    assert parsed(fast.sent) == parsed(slow.sent)
    assert not fast.open_at_end
    assert fast.sent.count(b"HTTP/1.1") == 1  # nothing answered after the close


def test_an_answer_that_closes_its_connection_closes_it() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        assert respond(scope, 413, [(b"connection", b"close")], b"{}")

    t = drive(app, [request(), request()])
    status, lines, _ = parsed(t.sent)
    assert status == b"HTTP/1.1 413 Request Entity Too Large"
    assert [line for line in lines if line.startswith(b"connection")] == [b"connection: close"]
    assert not t.open_at_end
    assert t.sent.count(b"HTTP/1.1") == 1


@pytest.mark.parametrize(
    "header", [(b"x-bad", b"a\r\nset-cookie: x=1"), (b"x-bad", b"nul\x00"), (b"bad name", b"v")]
)
def test_a_bad_header_is_refused_as_uvicorn_refuses_it_and_nothing_is_sent(
    header: tuple[bytes, bytes],
) -> None:
    raised: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            respond(scope, 200, [header], b"{}")
        except RuntimeError as exc:
            raised.append(exc)
            raise

    t = drive(app, [request()])
    assert len(raised) == 1
    assert b"set-cookie" not in t.sent and b"nul" not in t.sent
    assert t.sent.startswith(b"HTTP/1.1 500")  # uvicorn's answer to an application error


def test_respond_declines_without_sending_where_asgi_must_answer() -> None:
    outcomes: list[bool] = []

    async def started_first(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        outcomes.append(respond(scope, 200, [], b"no"))
        await send({"type": "http.response.body", "body": b"ok"})

    t = drive(started_first, [request()])
    assert outcomes == [False]
    assert t.sent.endswith(b"\r\n\r\nok")

    async def head_request(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        outcomes.append(respond(scope, 200, [], b"no"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b""})

    drive(head_request, [request(method=b"HEAD")])
    assert outcomes == [False, False]
    # A scope that no ServingProtocol made (another server, a test's own scope).
    assert respond({"type": "http", "method": "POST", "headers": []}, 200, [], b"{}") is False


def test_a_request_whose_client_left_is_not_answered_and_its_scope_lets_go_of_the_connection() -> None:
    scopes: list[Any] = []
    outcomes: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await receive()
        await asyncio.sleep(0.05)  # the client leaves meanwhile (drive ends the connection)
        outcomes.append(respond(scope, 200, [], b"{}"))

    async def main() -> Recording:
        proto, transport = connected(app)
        proto.data_received(request())
        await asyncio.sleep(0.01)
        proto.connection_lost(None)
        await asyncio.sleep(0.1)
        return transport

    t = asyncio.run(main())
    assert outcomes == [False]
    assert t.sent == b""
    assert RESPOND not in scopes[0]  # no reference from a dead request's scope to its connection


def test_a_body_that_arrived_with_its_head_is_taken_once_and_receive_then_waits_for_the_end() -> None:
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append(arrived_body(scope))
        got.append(arrived_body(scope))  # taken: the second call has nothing
        try:
            got.append(await asyncio.wait_for(receive(), 0.01))
        except TimeoutError:
            got.append("waits")
        assert respond(scope, 200, [], b"ok")
        got.append(await receive())

    t = drive(app, [request()])
    assert got == [b"{}", None, "waits", {"type": "http.disconnect"}]
    assert t.sent.endswith(b"\r\n\r\nok")


def test_a_body_still_arriving_is_left_to_receive() -> None:
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append(arrived_body(scope))
        body = b""
        while True:
            msg = await receive()
            body += msg["body"]
            if not msg["more_body"]:
                break
        got.append(body)
        assert respond(scope, 200, [], b"ok")

    head = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n"
    drive(app, [head + b"abc", b"def"])
    assert got == [None, b"abcdef"]


def test_a_body_already_received_is_not_handed_out_again() -> None:
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append((await receive())["body"])
        got.append(arrived_body(scope))
        assert respond(scope, 200, [], b"ok")

    drive(app, [request()])
    assert got == [b"{}", None]


def test_a_request_without_a_body_has_an_empty_one() -> None:
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.append(arrived_body(scope))
        assert respond(scope, 200, [], b"ok")

    drive(app, [b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"])
    assert got == [b""]


def test_the_disconnection_check_turns_true_when_the_client_leaves_mid_response() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert arrived_body(scope) == b"{}"
        gone = disconnection(scope)
        assert gone is not None
        seen.append(gone())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        for _ in range(100):  # bounded: the client leaves within a few steps
            if gone():
                break
            await asyncio.sleep(0.005)
        seen.append(gone())

    async def main() -> None:
        proto, transport = connected(app)
        proto.data_received(request())
        await asyncio.sleep(0.02)
        transport.closed = True  # the client hangs up
        proto.connection_lost(None)
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert seen == [False, True]


def test_the_disconnection_check_is_left_to_receive_for_a_scope_the_protocol_did_not_make() -> None:
    assert disconnection({"type": "http", "method": "POST", "headers": []}) is None


def test_a_status_uvicorn_cannot_send_is_refused_too() -> None:
    raised: list[BaseException] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            respond(scope, 999, [], b"{}")
        except RuntimeError as exc:
            raised.append(exc)
            raise

    t = drive(app, [request()])
    assert len(raised) == 1
    assert t.sent.startswith(b"HTTP/1.1 500")
