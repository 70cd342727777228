"""Reading request bodies within a byte limit, as they stream.

The declared ``Content-Length`` is checked by the caller before anything is read (413 at
once); a chunked body is counted chunk by chunk and refused as soon as it passes the limit,
so an oversized upload never sits in memory. Time is bounded by the server's body deadline
(``serving.protocol``): a client that stops sending is disconnected, which ends the read here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CLOSE = (b"connection", b"close")
#: A request refused before its body is read keeps its connection when its declared body is
#: at most this big: the server discards the body as it arrives. Closing a connection with
#: unread data makes the kernel reset it, and a reset destroys an answer the client has not
#: read yet — clients such as Python's http.client write the headers and the body
#: separately, so the body often lands just before the close. A larger or chunked body is
#: refused with ``connection: close`` and never parsed or buffered: its connection is closed
#: in stages (``serving.protocol``), dropping what the client still sends, within bounds.
DRAIN_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    """The client disconnected (or was disconnected by a deadline) before its body arrived."""


def content_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The declared body length, -1 when there is none (chunked or no body)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return -1


def refusal_headers(length: int, chunked: bool) -> list[tuple[bytes, bytes]]:
    """The headers that end a refusal sent before the body is read: keep the connection for a
    small declared body (``length``: -1 when none is declared), close it otherwise."""
    return [CLOSE] if chunked or length > DRAIN_BYTES else []


def is_chunked(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"transfer-encoding" for name, _ in headers)


async def read_body(receive: Receive, limit: int) -> bytes:
    msg = await receive()
    if msg["type"] != "http.request":
        raise ClientGone
    body: bytes = msg.get("body", b"")
    size = len(body)
    if size > limit:
        raise BodyTooLarge
    if not msg.get("more_body"):
        return body
    parts = [body]
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientGone
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not msg.get("more_body"):
            return b"".join(parts)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then whatever the connection says next."""
    pending = True

    async def again() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
