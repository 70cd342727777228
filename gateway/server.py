"""How the gateway is served: uvicorn (uvloop + httptools) with read deadlines it lacks.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but bounds neither how
long a request's headers nor its body may take to arrive (uvicorn issue #157), and only
arms the keep-alive timer after a first response. A client that opens connections and
trickles bytes ("slowloris"), or declares a body it never sends, holds a connection, a
task and its buffers for ever. :class:`GatewayProtocol` is uvicorn's httptools protocol,
selected through uvicorn's documented ``http=`` option, plus three checks:

* **header deadline** — a request's line and headers must be complete within
  ``header_timeout_s`` of its first byte; a new connection must send its first request
  within the same time. Expired: ``408`` (if a request had started) and close.
* **body deadline** — the body must be complete within ``body_timeout_s`` of the headers.
  Expired: the connection is closed; the application sees ``http.disconnect``.
* **header size** — more than ``max_header_bytes`` of request line + headers: ``431``, close.
* **lingering close** — a connection closed while the client may still be sending (a body
  refused past its limit, a 408/431) is half-closed first: the answer and a FIN go out, and
  what the client still sends is read and dropped for up to ``LINGER_S`` seconds or
  ``LINGER_BYTES`` bytes before the socket closes. Closing a socket with unread input makes
  the kernel send a reset, which can discard the answer before the client reads it (RFC 9112
  §9.6: "staged close"); a client streaming a 50 MiB body then saw a reset, not its 413.

Timers are armed only when a request spans several reads: a request that arrives whole in
one read (nearly all of them) costs a few attribute checks and no timer.
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
#: How long and how much a closing connection keeps draining its client's input (see above).
LINGER_S = 2.0
LINGER_BYTES = 4 * 1024 * 1024
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True, slots=True)
class ReadLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int

    @classmethod
    def of(cls, settings: GatewaySettings) -> ReadLimits:
        return cls(settings.header_timeout_s, settings.body_timeout_s, settings.max_header_bytes)


# The settings' defaults: used only when the served application does not carry its own.
_DEFAULTS = ReadLimits(
    header_timeout_s=GatewaySettings.model_fields["header_timeout_s"].default,
    body_timeout_s=GatewaySettings.model_fields["body_timeout_s"].default,
    max_header_bytes=GatewaySettings.model_fields["max_header_bytes"].default,
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


class _LingeringTransport:
    """The connection's transport, whose ``close`` is a staged close (see the module doc).

    Everything else is the wrapped transport's; uvicorn closes connections through it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._drained = 0
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        transport = self._transport
        if self.lingering or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()  # the answer, then FIN: the client reads it whole
        except (OSError, RuntimeError):
            transport.close()
            return
        self.lingering = True
        self._timer = self._loop.call_later(LINGER_S, transport.close)
        transport.resume_reading()  # drain what the client still sends (it may be paused)

    def drop(self, data: bytes) -> None:
        """Input that arrived while lingering: discarded, up to ``LINGER_BYTES``."""
        self._drained += len(data)
        if self._drained > LINGER_BYTES:
            self.abort()

    def abort(self) -> None:
        self.stop()
        self._transport.close()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class GatewayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body deadlines and a header size limit."""

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
        self._phase = _IDLE
        self._head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase = _IDLE

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._lingering = _LingeringTransport(transport, self.loop)
        self.transport = self._lingering  # type: ignore[assignment]
        # uvicorn arms its keep-alive timer only after a response: bound the first request too.
        self._arm(self._header_timeout, _HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lingering.stop()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering.lingering:
            self._lingering.drop(data)
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
        if self._phase == _HEADERS:
            self._refuse(_408)
        else:  # a body that did not arrive in time, or no first request at all
            transport.close()

    def _refuse(self, response: bytes) -> None:
        self._disarm()
        self._phase = _IDLE
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()


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
