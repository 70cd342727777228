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
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True, slots=True)
class ServerLimits:
    header_timeout_s: float = 10.0  # a request's head (also: a new connection's first request)
    keep_alive_s: int = 5  # an idle keep-alive connection (uvicorn's timeout_keep_alive)
    max_head_bytes: int = 64 * 1024  # request line + headers
    max_connections: int = 512  # connections + tasks at once; beyond: 503 (uvicorn's limit_concurrency)


def _response(status: bytes, detail: bytes) -> bytes:
    body = b'{"detail": "' + detail + b'"}'
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class _Timed(asyncio.Protocol):
    """One connection: uvicorn's protocol inside, head timing and size around it."""

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

    # -- asyncio.Protocol, delegated ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.inner.connection_made(transport)
        self._start_timer()  # the first request's head, from the connection's first moment

    def data_received(self, data: bytes) -> None:
        if self.parser is not None:
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade):
                self._stop_tracking()  # uvicorn answers the error (or takes the upgrade)
            if self.parser is not None and self.head_bytes > self.limits.max_head_bytes:
                self._close(b"431 Request Header Fields Too Large", b"request head too large")
                return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.parser = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- httptools callbacks (message boundaries) ------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun += 1
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
        if self.in_head:
            self._close(b"408 Request Timeout", b"request head not received in time")

    def _close(self, status: bytes, detail: bytes) -> None:
        self._stop_tracking()
        if self.transport is not None and not self.transport.is_closing():
            if self.begun <= 1:  # no earlier response can be on the wire: say why
                self.transport.write(_response(status, detail))
            self.transport.close()

    def _stop_tracking(self) -> None:
        self.parser = None
        self._cancel_timer()


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
