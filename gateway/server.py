"""How the gateway is served: uvicorn (uvloop + httptools) with read deadlines it lacks.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but bounds neither how
long a request's headers nor its body may take to arrive (uvicorn issue #157), and only
arms the keep-alive timer after a first response. A client that opens connections and
trickles bytes ("slowloris"), or declares a body it never sends, holds a connection, a
task and its buffers for ever. :class:`GatewayProtocol` is uvicorn's httptools protocol,
selected through uvicorn's documented ``http=`` option, plus three checks and a close:

* **header deadline** — a request's line and headers must be complete within
  ``header_timeout_s`` of its first byte; a new connection must send its first request
  within the same time. Expired: ``408`` (if a request had started) and close.
* **body deadline** — the body must be complete within ``body_timeout_s`` of the headers.
  Expired: the connection is closed; the application sees ``http.disconnect``.
* **header size** — more than ``max_header_bytes`` of request line + headers: ``431``, close.
* **staged close** — a connection closed while its client may still be sending (a request
  refused before its whole body was read, with ``connection: close``: 413, or
  401/403/429/400 on a large or chunked body; a 431; uvicorn's 400 for a request that does
  not parse) is half-closed: the answer and a FIN go out, and what the client still sends is
  read and dropped for up to ``linger_s`` seconds or ``linger_bytes`` bytes, after which the
  socket is closed (aborted). Closing a socket with unread input makes the kernel answer
  with a reset instead of a FIN, and a reset can destroy the answer before the client reads
  it (RFC 9112 §9.6; Apache's and nginx's "lingering close"). A connection closed between
  requests (keep-alive timeout, shutdown) or by a deadline is closed at once: nothing is in
  flight, or the client is the slow one the deadline is there to cut off, and lingering
  would extend its hold.

Timers are armed only when a request spans several reads: a request that arrives whole in
one read (nearly all of them) costs a few attribute checks and no timer.

uvicorn writes a response's head as soon as the application starts the response, and its
body in a second write: two sends, and two wake-ups of the client, per JSON answer. The
protocol's transport wrapper holds a head until the end of the current event-loop step: a
body written in the same step (every JSON answer) leaves with it in one send; a head alone
(an SSE stream waiting for its first event) is sent when the step ends, and a close sends
what is held first.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

_IDLE, _HEADERS, _BODY = 0, 1, 2
_HEAD = b"HTTP/"
_MERGE_MAX = 64 * 1024  # a larger body is handed over with the head as two buffers, not copied
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True, slots=True)
class ReadLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    linger_s: float
    linger_bytes: int

    @classmethod
    def of(cls, settings: GatewaySettings) -> ReadLimits:
        return cls(
            settings.header_timeout_s,
            settings.body_timeout_s,
            settings.max_header_bytes,
            settings.linger_s,
            settings.linger_bytes,
        )


# The settings' defaults: used only when the served application does not carry its own.
_DEFAULTS = ReadLimits(
    header_timeout_s=GatewaySettings.model_fields["header_timeout_s"].default,
    body_timeout_s=GatewaySettings.model_fields["body_timeout_s"].default,
    max_header_bytes=GatewaySettings.model_fields["max_header_bytes"].default,
    linger_s=GatewaySettings.model_fields["linger_s"].default,
    linger_bytes=GatewaySettings.model_fields["linger_bytes"].default,
)


def _limits_of(app: Any) -> ReadLimits:
    """The limits the application was built with (uvicorn may wrap it in middlewares)."""
    for _ in range(8):
        limits = getattr(app, "read_limits", None)
        if isinstance(limits, ReadLimits):
            return limits
        app = getattr(app, "app", None)
        if app is None:
            break
    return _DEFAULTS


class _Transport:
    """The connection's transport as uvicorn sees it: the same, except ``close`` and
    ``is_closing``, which are the protocol's (a staged close, see the module doc), and
    ``write``, which holds a response head until the end of the event-loop step, so the body
    written right after it (every JSON answer) leaves in the same send. Writes keep their
    order; body chunks are never held; ``flush`` sends what is held.

    The other calls a request makes go straight to the transport's own methods (bound once
    per connection, no ``__getattr__`` on the way); anything else is looked up on it."""

    def __init__(self, transport: asyncio.Transport, protocol: GatewayProtocol) -> None:
        self._transport = transport
        self._loop = protocol.loop
        self._held: bytes | None = None
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.abort = transport.abort
        self.close = protocol.close_connection
        self.is_closing = protocol.connection_closing

    # Methods, not attributes bound in __init__: a bound method of its own instance would
    # make every wrapper a reference cycle (left to the cyclic garbage collector).
    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= _MERGE_MAX:
                self._transport.write(held + data)
            else:
                self._transport.writelines((held, data))
        elif data[:5] == _HEAD:
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():  # the client left: nothing to send it
                self._transport.write(held)

    def writelines(self, data: Any) -> None:
        self.flush()
        self._transport.writelines(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body deadlines, a header size limit and a
    staged close."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = _limits_of(self.app)
        self._header_timeout = limits.header_timeout_s
        self._body_timeout = limits.body_timeout_s
        self._max_header_bytes = limits.max_header_bytes
        self._linger_s = limits.linger_s
        self._linger_bytes = limits.linger_bytes
        self._linger: asyncio.TimerHandle | None = None  # set while a staged close drains
        self._lingered = 0
        self._phase = _IDLE
        self._head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase = _IDLE

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._raw = transport
        self._wrapper = _Transport(transport, self)
        self.transport = self._wrapper  # type: ignore[assignment]
        # uvicorn arms its keep-alive timer only after a response: bound the first request too.
        self._arm(self._header_timeout, _HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)
        # The transport's close/is_closing are this protocol's bound methods: hand them back
        # to the closed transport, so protocol and wrapper do not keep each other alive
        # (a reference cycle would leave every connection to the cyclic garbage collector).
        self._wrapper.close = self._raw.close
        self._wrapper.is_closing = self._raw.is_closing

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # a staged close: dropped, up to linger_bytes
            self._lingered += len(data)
            if self._lingered > self._linger_bytes:
                self._raw.abort()
            return
        if self._phase != _BODY:
            self._head_bytes += len(data)
        super().data_received(data)
        phase = self._phase
        if phase == _HEADERS:
            if self._head_bytes > self._max_header_bytes:
                self._refuse(_431)
            elif self._timer_phase != _HEADERS:
                self._arm(self._header_timeout, _HEADERS)
        elif phase == _BODY:
            if self._timer_phase != _BODY:
                self._arm(self._body_timeout, _BODY)
        elif self._timer is not None:
            self._disarm()

    # httptools parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEADERS

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._head_bytes = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        super().on_message_complete()

    # deadlines
    def _arm(self, delay: float, phase: int) -> None:
        if self._linger is not None:  # a staged close bounds the rest (the parser refused)
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, self._expired)
        self._timer_phase = phase

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_phase = _IDLE

    def _expired(self) -> None:
        self._timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        # A deadline cuts a slow client off at once (no staged close): lingering would extend
        # the very hold the deadline bounds, and such a client has little or nothing in flight.
        if self._phase == _HEADERS:
            self._refuse(_408, linger=False)
        else:  # a body that did not arrive in time, or no first request at all
            self._phase = _IDLE
            transport.close()

    def _refuse(self, response: bytes, *, linger: bool = True) -> None:
        self._disarm()
        if not linger:  # the phase decides the close: mid-request, a staged one
            self._phase = _IDLE
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()
        self._phase = _IDLE

    # closing (uvicorn closes through ``self.transport``: see ``_Transport``)
    def connection_closing(self) -> bool:
        return self._linger is not None or self._raw.is_closing()

    def close_connection(self) -> None:
        """Close at once between requests; mid-request (the client may still be sending its
        body or headers), a staged close: half-close, drop its input, close within bounds."""
        self._wrapper.flush()  # a held response head goes out before any close
        transport = self._raw
        if self._linger is not None or transport.is_closing():
            return
        if self._phase == _IDLE or self._linger_s <= 0 or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()  # the answer, then a FIN: the client reads the answer whole
        except (OSError, RuntimeError):
            transport.close()
            return
        self._disarm()  # the read deadlines are over: the linger bound replaces them
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A request still being read (refused by the parser, say): its task learns now, as
            # uvicorn's connection_lost would tell it, that no more body will come.
            cycle.disconnected = True
            cycle.message_event.set()
        self._lingered = 0
        # abort, not close: a client that neither reads nor stops gets no more time
        self._linger = self.loop.call_later(self._linger_s, transport.abort)
        transport.resume_reading()  # drain even if reading was paused (flow control)


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """The uvicorn settings every entry point serves the gateway with (plus app/host/port)."""
    return {
        "loop": "uvloop",
        "http": GatewayProtocol,
        "access_log": False,
        "log_level": settings.log_level,
        "server_header": False,
        "proxy_headers": False,
        "date_header": False,
        "timeout_keep_alive": settings.keep_alive_timeout_s,
    }
