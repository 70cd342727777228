"""The analytics service's HTTP server: uvicorn, plus the timeouts uvicorn does not have.

uvicorn closes a keep-alive connection idle for ``timeout_keep_alive`` seconds, but waits
for ever for a request's head: a client that opens connections and sends nothing, or
sends its headers a byte at a time (slowloris), holds them indefinitely. Each connection
is therefore wrapped (:func:`timed_protocol`, given to uvicorn as its ``http`` protocol
class): a request's head must be complete within ``header_timeout_s`` of the connection
opening or of the request's first byte, and may not exceed ``max_head_bytes``; otherwise
the connection is answered 408 / 431 and closed. The wrapper follows message boundaries
with its own ``httptools`` parser (the same parser uvicorn uses) and passes every byte on
unchanged. Bodies are timed and bounded per request by ``analytics.service.guard``.

A connection closed while its client may still be sending (a request refused before its
whole body was read and answered with ``connection: close``: 413, or 401/403 on a large or
chunked body; a 431; uvicorn's 400 for a request that does not parse) is closed in stages:
the answer and a FIN go out, then what the client still sends is read and dropped for up to
``linger_s`` seconds or ``linger_bytes`` bytes, after which the socket is aborted. Closing a
socket with unread input makes the kernel answer with a reset instead of a FIN, and a reset
can destroy the answer before the client reads it (RFC 9112 §9.6; Apache's and nginx's
"lingering close"). A connection closed between requests (keep-alive timeout, shutdown) or
by a deadline (the head's 408 here, the body's 408 in the guard, which marks its request
with :data:`CLOSE_AT_ONCE`) is closed at once: nothing is in flight, or the client is the
slow one the deadline cuts off, and lingering would extend its hold. The gateway's
``gateway.server`` does the same for its own protocol.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final, cast

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True, slots=True)
class ServerLimits:
    header_timeout_s: float = 10.0  # a request's head (also: a new connection's first request)
    keep_alive_s: int = 5  # an idle keep-alive connection (uvicorn's timeout_keep_alive)
    max_head_bytes: int = 64 * 1024  # request line + headers
    max_connections: int = 512  # connections + tasks at once; beyond: 503 (uvicorn's limit_concurrency)
    linger_s: float = 2.0  # a staged close drops what a refused client still sends this long...
    linger_bytes: int = 4 * 1024 * 1024  # ...and at most this much (0 s: close at once)


#: An ASGI scope key: a request whose scope holds it true has its connection closed at once
#: when its answer closes it (no staged close): set for a deadline's refusal.
CLOSE_AT_ONCE: Final = "liftgate.close_at_once"


def _response(status: bytes, detail: bytes) -> bytes:
    body = b'{"detail": "' + detail + b'"}'
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class _Transport:
    """The connection's transport as uvicorn's protocol sees it: the same, except ``close``
    and ``is_closing``, which are the wrapper's (a staged close, see the module doc). The
    calls a request makes are the transport's own methods, bound once per connection."""

    def __init__(self, transport: asyncio.Transport, outer: _Timed) -> None:
        self._transport = transport
        self.write = transport.write
        self.writelines = transport.writelines
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.abort = transport.abort
        self.close = outer.close_connection
        self.is_closing = outer.connection_closing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Timed(asyncio.Protocol):
    """One connection: uvicorn's protocol inside, head timing and size and a staged close
    around it."""

    inner_class: type[asyncio.Protocol] = HttpToolsProtocol
    limits = ServerLimits()

    def __init__(self, **kwargs: Any) -> None:
        self.inner = self.inner_class(**kwargs)
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.timer: asyncio.TimerHandle | None = None
        self.in_head = True  # waiting for a request's head to complete
        self.head_bytes = 0  # the current head's URL and header bytes
        self.begun = 0  # requests begun on this connection
        self.in_request = False  # a request begun and not wholly received: the client may be sending
        self.linger: asyncio.TimerHandle | None = None  # set while a staged close drops input
        self.lingered = 0  # bytes dropped by it
        self.wrapper: _Transport | None = None  # the transport uvicorn's protocol sees

    # -- asyncio.Protocol, delegated ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.wrapper = _Transport(self.transport, self)
        self.inner.connection_made(cast(asyncio.Transport, self.wrapper))
        self._start_timer()  # the first request's head, from the connection's first moment

    def data_received(self, data: bytes) -> None:
        if self.linger is not None:  # a staged close: dropped, up to linger_bytes
            self.lingered += len(data)
            if self.lingered > self.limits.linger_bytes and self.transport is not None:
                self.transport.abort()
            return
        if self.parser is not None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.in_request = True  # uvicorn answers 400 and closes: the rest is unread
                self._stop_tracking()
            except httptools.HttpParserUpgrade:
                self._stop_tracking()  # uvicorn takes the upgrade (or refuses it)
            if self.parser is not None and self.head_bytes > self.limits.max_head_bytes:
                self._close(b"431 Request Header Fields Too Large", b"request head too large")
                return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.linger is not None:
            self.linger.cancel()
        self.parser = None
        self.inner.connection_lost(exc)
        # The wrapper's close/is_closing are this protocol's bound methods: hand the closed
        # transport's back, so the two do not keep each other alive (a reference cycle would
        # leave every connection to the cyclic garbage collector).
        if self.wrapper is not None and self.transport is not None:
            self.wrapper.close = self.transport.close
            self.wrapper.is_closing = self.transport.is_closing
            self.wrapper = None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- httptools callbacks (message boundaries) ------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun += 1
        self.in_request = True
        self.head_bytes = 0
        if not self.in_head:
            self.in_head = True
            self._start_timer()

    def on_url(self, url: bytes) -> None:
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self.in_head = False
        self._cancel_timer()
        if self.head_bytes <= self.limits.max_head_bytes:
            self.head_bytes = 0  # checked; the body does not count

    def on_message_complete(self) -> None:
        self.in_request = False

    # -- timing ------------------------------------------------------------------------------

    def _start_timer(self) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.limits.header_timeout_s, self._expired)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.in_head:  # a deadline: closed at once (see the module doc)
            self._close(b"408 Request Timeout", b"request head not received in time", at_once=True)

    def _close(self, status: bytes, detail: bytes, *, at_once: bool = False) -> None:
        self._stop_tracking()
        if self.transport is not None and not self.connection_closing():
            if self.begun <= 1:  # no earlier response can be on the wire: say why
                self.transport.write(_response(status, detail))
            if at_once:
                self.transport.close()
            else:
                self.close_connection()

    def _stop_tracking(self) -> None:
        self.parser = None
        self._cancel_timer()

    # -- closing (uvicorn's protocol closes through the wrapper: see _Transport) ------------

    def connection_closing(self) -> bool:
        return self.linger is not None or self.transport is None or self.transport.is_closing()

    def close_connection(self) -> None:
        """Close at once between requests or after a deadline; mid-request (the client may
        still be sending), a staged close: half-close, drop its input, abort within bounds."""
        transport = self.transport
        if transport is None or self.connection_closing():
            return
        cycle = getattr(self.inner, "cycle", None)  # uvicorn's request/response cycle, if any
        if (
            not self.in_request
            or self.limits.linger_s <= 0
            or (cycle is not None and cycle.scope.get(CLOSE_AT_ONCE))
            or not transport.can_write_eof()
        ):
            transport.close()
            return
        try:
            transport.write_eof()  # the answer, then a FIN: the client reads the answer whole
        except (OSError, RuntimeError):
            transport.close()
            return
        self._stop_tracking()  # the head deadline is over: the linger bound replaces it
        if cycle is not None and not cycle.response_complete:
            # A request still reading its body (refused by the parser, say): it learns now, as
            # uvicorn's connection_lost would tell it, that no more body will come.
            cycle.disconnected = True
            cycle.message_event.set()
        self.lingered = 0
        # abort, not close: a client that neither reads nor stops gets no more time
        self.linger = asyncio.get_running_loop().call_later(self.limits.linger_s, transport.abort)
        transport.resume_reading()  # drain even if uvicorn paused reading (flow control)


def timed_protocol(limits: ServerLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol with ``limits`` on every request's head (a class for ``http=``)."""
    return type("TimedHttpToolsProtocol", (_Timed,), {"limits": limits})


def serve(app: Any, host: str, port: int, log_level: str, limits: ServerLimits) -> None:
    """Run ``app`` until interrupted (uvicorn's signal handling)."""
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=timed_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s,
        limit_concurrency=limits.max_connections,
        server_header=False,
    )
