"""A raw-socket client for the staged close, shared by both services' tests
(tests/gateway/test_staged_close.py, tests/analytics/service/test_staged_close.py): it keeps
sending after the answer, the way an upload refused mid-body does, and tells a FIN from a
reset."""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass
from typing import Any

KiB, MiB = 1024, 1024 * 1024
PIECE = b"x" * (16 * KiB)


@dataclass
class Outcome:
    answer: bytes  # everything the server sent
    ended: str  # "fin" (the server half-closed; nothing went wrong), "reset", or "open"
    sent_after: int  # bytes the client sent after the answer's first byte, without error
    sent: int  # bytes the client sent in all, head excluded
    ended_after_s: float  # from the answer's first byte to the reset (or to the client's own end)


def stream(port: int, head: str, frame: bytes, every_s: float, after: int, deadline_s: float) -> Outcome:
    """Send ``head``, then ``frame`` every ``every_s`` seconds (0: as fast as the socket takes
    it), reading at the same time, until ``after`` bytes were sent past the answer's first
    byte, the connection is reset, or ``deadline_s``. A FIN from the server does not stop the
    client: a half-closed connection still carries what the client sends."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(head.encode())
    s.setblocking(False)
    answer, out = b"", b""
    sent, sent_after, fin, answered_at = 0, 0, False, 0.0
    start = time.monotonic()
    next_at, end = start, start + deadline_s
    ended = "open"
    try:
        while time.monotonic() < end and not (answered_at and sent_after >= after):
            now = time.monotonic()
            writing = bool(out) or now >= next_at
            readable, writable, _ = select.select([] if fin else [s], [s] if writing else [], [], 0.005)
            if readable:
                part = s.recv(65536)
                if part:
                    answer += part
                    answered_at = answered_at or time.monotonic()
                else:
                    fin = True
            if writable:
                if not out:
                    out = frame
                    next_at = max(next_at + every_s, now) if every_s else now
                n = s.send(out)
                out = out[n:]
                sent += n
                if answered_at:
                    sent_after += n
    except (ConnectionResetError, BrokenPipeError):
        ended = "reset"
    else:
        ended = "fin" if fin else "open"
    ended_after = time.monotonic() - (answered_at or start)
    if ended != "reset":  # read the rest of the answer, if any, the way a client would
        s.setblocking(True)
        s.settimeout(2)
        try:
            while part := s.recv(65536):
                answer += part
        except (ConnectionResetError, TimeoutError):
            pass
    s.close()
    return Outcome(answer, ended, sent_after, sent, ended_after)


def parse_400_mid_body(port: int, head: bytes, state: Any, linger_s: float) -> None:
    """Start a chunked upload after ``head``, wait until the server's request task reads it,
    then send a garbage chunk-size line: the 400 must arrive whole, what the client still sends
    must be dropped without a reset, and the request task must end at once (well within the
    linger, ``linger_s``), then the connection ends with a FIN. ``state``: uvicorn's
    ``ServerState``."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + chunk(PIECE))
        deadline = time.monotonic() + 5
        while not state.tasks:  # the app is reading the body
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.005)
        s.sendall(b"zz\r\n" + PIECE)
        answer = b""
        while not answer.endswith(b"received."):
            part = s.recv(65536)
            assert part, answer
            answer += part
        t0 = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 400") and b"connection: close" in answer, answer
        for _ in range(8):  # still sending: dropped, no reset
            s.sendall(PIECE)
            time.sleep(0.01)
        while state.tasks:
            assert time.monotonic() - t0 < linger_s / 2, "the request task waited for the linger"
            time.sleep(0.005)
        assert s.recv(1) == b""


def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def whole(answer: bytes) -> tuple[int, bytes]:
    """Status and body of a complete answer (its Content-Length body all there)."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    assert sep, f"no complete head: {answer[:300]!r}"
    lines = head.decode("latin-1").lower().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines if line.startswith("content-length:"))
    assert len(body) == length, f"{len(body)} of {length} body bytes: {answer!r}"
    assert "connection: close" in lines, answer
    return int(lines[0].split()[1]), body


def settled(state: Any, within_s: float) -> None:
    """Every connection gone and every request task finished within ``within_s`` (the linger
    bound and some slack). ``state``: uvicorn's ``ServerState``."""
    deadline = time.monotonic() + within_s
    while state.connections or state.tasks:
        assert time.monotonic() < deadline, (len(state.connections), len(state.tasks))
        time.sleep(0.02)
