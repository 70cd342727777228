"""Reading request bodies within a byte limit, as they stream.

The declared ``Content-Length`` is checked by the caller before anything is read (413 at
once); a chunked body is counted chunk by chunk and refused as soon as it passes the limit,
so an oversized upload never sits in memory. Time is bounded by the server's body deadline
(``gateway.server``): a client that stops sending is disconnected, which ends the read here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CLOSE = (b"connection", b"close")


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
