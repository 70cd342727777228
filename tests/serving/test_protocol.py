"""The header size limit of serving.protocol, read by read: a head over the limit is refused
with the service's 431 before its request runs, whether it arrives in pieces or whole in one
read (the size is counted per read, so a head that completes inside a read is measured
exactly), and a head under the limit is served whatever body arrives with it.

The protocol is uvicorn's own, driven through an in-memory transport (as in
bench/gateway/hardening_bench.py), so the reads are exactly the ones written here; both
services' real-socket tests (test_staged_close.py, test_timeouts.py, test_api_hardening.py)
cover the same limit end to end."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from serving.protocol import ReadLimits, Refusals, protocol_class, refusal

LIMIT = 4096
REFUSALS = Refusals(head_too_large=refusal(b"431 Request Header Fields Too Large", b'{"detail": "big"}'))


class Transport(asyncio.Transport):
    """Records what the protocol sends and how it closes."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = b""
        self.closed = self.eof = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 9000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.sent += bytes(data)

    def writelines(self, data: Any) -> None:
        for part in data:
            self.write(part)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def serve(reads: list[bytes]) -> tuple[Transport, list[str]]:
    """Feed ``reads`` to one connection of the protocol; the paths the application saw, and
    what reached the transport."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> Transport:
        config = Config(app, log_level="critical", access_log=False, lifespan="off")
        config.load()
        cls = protocol_class(ReadLimits(max_header_bytes=LIMIT, linger_s=0.05), REFUSALS)
        proto = cls(config=config, server_state=ServerState(), app_state={})
        transport = Transport()
        proto.connection_made(transport)
        for data in reads:
            if not transport.closed and not transport.eof:
                proto.data_received(data)
            await asyncio.sleep(0.01)
        proto.connection_lost(None)
        return transport

    return asyncio.run(main()), seen


def head(pad: int) -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * pad + b"\r\nContent-Length: %d\r\n\r\n"


def test_a_head_over_the_limit_that_arrives_whole_in_one_read_is_refused_before_its_request_runs() -> None:
    transport, seen = serve([head(2 * LIMIT) % 2 + b"{}"])
    assert transport.sent == REFUSALS.head_too_large
    assert seen == []
    assert transport.eof, "the refusal is closed in stages (the client may still be sending)"


def test_a_head_over_the_limit_that_arrives_in_pieces_is_refused() -> None:
    whole = head(2 * LIMIT) % 2 + b"{}"
    transport, seen = serve([whole[i : i + 1000] for i in range(0, len(whole), 1000)])
    assert transport.sent == REFUSALS.head_too_large
    assert seen == []


def test_a_head_under_the_limit_is_served_whatever_body_arrives_with_it_in_the_same_read() -> None:
    body = b"b" * (8 * LIMIT)
    transport, seen = serve([head(LIMIT // 2) % len(body) + body])
    assert seen == ["/x"]
    assert transport.sent.startswith(b"HTTP/1.1 200") and transport.sent.endswith(b"ok")


def test_a_head_just_over_the_limit_in_one_read_with_its_body_is_refused_and_just_under_is_served() -> None:
    # What is measured: the URL, and each header's name and value plus 4 (": " and CRLF).
    fixed = len("/x") + len("hostx") + 4 + len("x-pad") + 4 + len("content-length10000") + 4
    under = head(LIMIT - fixed) % 10000 + b"c" * 10000
    over = head(LIMIT - fixed + 1) % 10000 + b"c" * 10000
    assert serve([under])[1] == ["/x"]
    transport, seen = serve([over])
    assert transport.sent == REFUSALS.head_too_large and seen == []
