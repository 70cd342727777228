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

Timers are armed only when a request spans several reads: a request that arrives whole in
one read (nearly all of them) costs a few attribute checks and no timer.

uvicorn writes a response's head as soon as the application starts the response, and its
body in a second write: two sends, and two wake-ups of the client, per JSON answer. The
protocol hands uvicorn a :class:`HeadMergingTransport`, which holds a head until the end of
the current event-loop step: a body written in the same step (every JSON answer) leaves
with it in one send; a head alone (an SSE stream waiting for its first event) is sent when
the step ends.
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


class HeadMergingTransport:
    """A connection's transport that holds a response head until the end of the loop step,
    so the body written right after it leaves in the same send. Writes keep their order;
    everything else is the underlying transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

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
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():  # the client left: nothing to send it
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


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
        merging: Any = HeadMergingTransport(transport, self.loop)
        super().connection_made(merging)
        # uvicorn arms its keep-alive timer only after a response: bound the first request too.
        self._arm(self._header_timeout, _HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
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
