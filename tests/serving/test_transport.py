"""The connection transport both services hand uvicorn (serving.protocol.Transport): a response
head waits for its body until the end of the event-loop step, so a JSON answer leaves in one
send; nothing is reordered, delayed past the step, or sent after the client left. (That a
close sends a held head first is checked end to end by the 408/431 answers in
tests/gateway/test_timeouts.py and the services' test_staged_close.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from serving.protocol import Transport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


class RecordingTransport:
    """Records what reaches the socket, one entry per send."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closing = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "write after close"
        self.sends.append(data)

    def writelines(self, parts: tuple[bytes, ...]) -> None:
        self.write(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8080) if name == "sockname" else default


class Protocol:
    """What the wrapper takes from serving.protocol.ServingProtocol: its loop and its close."""

    def __init__(self, raw: RecordingTransport) -> None:
        self.loop = asyncio.get_running_loop()
        self.close_connection = raw.close
        self.connection_closing = raw.is_closing


def _merging() -> tuple[Transport, RecordingTransport]:
    raw = RecordingTransport()
    return Transport(raw, Protocol(raw)), raw  # type: ignore[arg-type]


async def _next_step() -> None:
    await asyncio.sleep(0)


def test_a_head_and_the_body_written_in_the_same_step_leave_in_one_send() -> None:
    async def main() -> None:
        t, raw = _merging()
        t.write(HEAD)
        assert raw.sends == []
        t.write(b"{}")
        assert raw.sends == [HEAD + b"{}"]
        await _next_step()
        assert raw.sends == [HEAD + b"{}"]

    asyncio.run(main())


def test_a_head_alone_is_sent_when_the_step_ends_and_later_writes_follow_it_in_order() -> None:
    async def main() -> None:
        t, raw = _merging()
        t.write(HEAD.replace(b"content-length: 2", b"transfer-encoding: chunked"))
        await _next_step()
        assert len(raw.sends) == 1 and raw.sends[0].startswith(b"HTTP/1.1 200")
        for i in range(3):
            t.write(b"5\r\nevent\r\n")
            assert len(raw.sends) == 2 + i  # a body chunk is never held
        t.write(b"0\r\n\r\n")
        assert raw.sends[1:] == [b"5\r\nevent\r\n"] * 3 + [b"0\r\n\r\n"]

    asyncio.run(main())


def test_a_large_body_is_handed_over_with_its_head_without_being_held() -> None:
    async def main() -> None:
        t, raw = _merging()
        body = b"x" * (1 << 20)
        t.write(HEAD)
        t.write(body)
        assert raw.sends == [HEAD + body]

    asyncio.run(main())


def test_flush_sends_a_held_head_once_and_abort_or_a_lost_client_drops_it() -> None:
    async def main() -> None:
        t, raw = _merging()
        t.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
        t.flush()
        await _next_step()
        assert raw.sends == [b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n"]

        t, raw = _merging()
        t.write(HEAD)
        t.abort()
        await _next_step()
        assert raw.sends == [] and raw.aborted

        t, raw = _merging()
        t.write(HEAD)
        raw.closing = True  # the connection was lost before the step ended
        await _next_step()
        assert raw.sends == []

    asyncio.run(main())


def test_everything_else_is_the_underlying_transport() -> None:
    async def main() -> None:
        t, raw = _merging()
        assert t.get_extra_info("sockname") == ("127.0.0.1", 8080)
        assert t.is_closing() is False
        raw.closing = True
        assert t.is_closing() is True

    asyncio.run(main())
