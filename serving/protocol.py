"""uvicorn's HTTP protocol with the read deadlines, header limit and staged close it lacks.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but bounds neither how
long a request's headers nor its body may take to arrive (uvicorn issue #157), and only
arms the keep-alive timer after a first response. A client that opens connections and
trickles bytes ("slowloris"), or declares a body it never sends, holds a connection, a
task and its buffers for ever. :class:`ServingProtocol` is uvicorn's httptools protocol,
selected through uvicorn's documented ``http=`` option (a class made by
:func:`protocol_class` for one service's :class:`ReadLimits` and :class:`Refusals`), plus
three checks and a close:

* **header deadline** — a request's line and headers must be complete within
  ``header_timeout_s`` of its first byte; a new connection must send its first request
  within the same time. Expired: the service's 408 (its ``Refusals``) and close.
* **body deadline** — the body must be complete within ``body_timeout_s`` of the headers
  (``None``: the application bounds its bodies itself). Expired: the connection is closed;
  the application sees ``http.disconnect``.
* **header size** — more than ``max_header_bytes`` of request line + headers: the service's
  431, and a staged close. Counted per read while a head is incomplete; a head that
  completes inside a read larger than the limit is measured exactly (URL and headers) and,
  if over, refused before its request runs.
* **staged close** — a connection closed while its client may still be sending (a request
  refused before its whole body was read, with ``connection: close``: 413, or
  401/403/429/400 on a large or chunked body; a 431; uvicorn's 400 for a request that does
  not parse) is half-closed: the answer and a FIN go out, and what the client still sends is
  read and dropped for up to ``linger_s`` seconds or ``linger_bytes`` bytes, after which the
  socket is closed (aborted). Closing a socket with unread input makes the kernel answer
  with a reset instead of a FIN, and a reset can destroy the answer before the client reads
  it (RFC 9112 §9.6; Apache's and nginx's "lingering close"). A connection closed between
  requests (keep-alive timeout, shutdown) or by a deadline (the protocol's own, or an
  application's that marks its request with :data:`CLOSE_AT_ONCE`) is closed at once:
  nothing is in flight, or the client is the slow one the deadline is there to cut off, and
  lingering would extend its hold. uvicorn's shutdown waits for its connections to end, so
  it waits for a lingering one no longer than the linger bound.

A connection has one keep-alive timer (uvicorn arms and cancels one per request): an answer
records when the connection fell idle, and the timer closes it ``timeout_keep_alive`` after
the last answer (:meth:`ServingProtocol.on_response_complete`).

Timers are armed only when a request spans several reads: a request that arrives whole in
one read (nearly all of them) costs a few attribute checks and no timer.

uvicorn writes a response's head as soon as the application starts the response, and its
body in a second write: two sends, and two wake-ups of the client, per JSON answer. The
protocol's transport wrapper (:class:`Transport`) holds a head until the end of the current
event-loop step: a body written in the same step (every JSON answer) leaves with it in one
send; a head alone (a stream waiting for its first event) is sent when the step ends, and a
close sends what is held first.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, Final

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

#: An ASGI scope key: a request whose scope holds it true has its connection closed at once
#: when its answer closes it (no staged close). For an application's own deadline refusal.
CLOSE_AT_ONCE: Final = "liftgate.close_at_once"

#: An ASGI scope key the protocol sets on every request, for :func:`respond` (an application
#: that does not use it sends through ASGI as usual).
RESPOND: Final = "liftgate.respond"

KiB = 1024
MiB = 1024 * KiB
# The defaults of both services' settings (serving.settings) and of ReadLimits.
HEADER_TIMEOUT_S: Final = 10.0
LINGER_S: Final = 2.0
LINGER_BYTES: Final = 4 * MiB
MAX_HEADER_BYTES: Final = 64 * KiB

_IDLE, _HEADERS, _BODY = 0, 1, 2
_HEAD = b"HTTP/"
_MERGE_MAX = 64 * KiB  # a larger body is handed over with the head as two buffers, not copied
# What uvicorn refuses in a response's header names and values (its ``send`` raises on them).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS_LINES: dict[int, bytes] = {}


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """How long a request may take to arrive, how large its head may be, how a refused
    client's connection is drained."""

    header_timeout_s: float = HEADER_TIMEOUT_S  # a request's head (also: a new connection's first request)
    body_timeout_s: float | None = None  # a request's body after its head (None: not timed here)
    max_header_bytes: int = MAX_HEADER_BYTES  # request line + headers
    linger_s: float = LINGER_S  # a staged close drops what a refused client still sends this long...
    linger_bytes: int = LINGER_BYTES  # ...and at most this much (0 s: close at once)


def refusal(status: bytes, body: bytes = b"", content_type: bytes = b"") -> bytes:
    """A whole ``connection: close`` answer: ``status`` is e.g. ``b"408 Request Timeout"``."""
    typed = b"content-type: " + content_type + b"\r\n" if content_type else b""
    return (
        b"HTTP/1.1 " + status + b"\r\n" + typed + b"content-length: " + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n" + body
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Refusals:
    """The protocol's own answers, in the service's error shape (``b""``: close, say nothing).
    Each is written only when no earlier response of the connection is still on its way."""

    head_timeout: bytes = refusal(b"408 Request Timeout")  # a request's head not complete in time
    first_request_timeout: bytes = b""  # a new connection that sent nothing in time
    head_too_large: bytes = refusal(b"431 Request Header Fields Too Large")


def limits_of(app: Any) -> ReadLimits | None:
    """The limits the application was built with (its ``read_limits``), if it carries them:
    how a service whose workers uvicorn starts in processes of their own passes its settings
    to the protocol (the ``http=`` class is pickled by name). uvicorn may wrap the
    application in middlewares."""
    for _ in range(8):
        limits = getattr(app, "read_limits", None)
        if isinstance(limits, ReadLimits):
            return limits
        app = getattr(app, "app", None)
        if app is None:
            break
    return None


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 599:  # uvicorn has no status line for it either (its send fails)
            raise RuntimeError(f"Invalid HTTP status code {status}.")
        try:
            phrase = HTTPStatus(status).phrase.encode()
        except ValueError:
            phrase = b""
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
    return line


def _serving(scope: Any) -> tuple[Any, Any] | None:
    """The :class:`ServingProtocol` serving the request of ``scope`` and its uvicorn request
    cycle, or None: a scope no ServingProtocol made, or a request not (or no longer) the
    connection's current one."""
    protocol = scope.get(RESPOND)
    if protocol is None:
        return None
    cycle = protocol.cycle
    if cycle is None or cycle.scope is not scope:
        return None
    return protocol, cycle


def respond(scope: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """Send a whole response — head, ``content-length`` and body in one write — for the
    request of ``scope``, as the two ASGI messages ``http.response.start`` +
    ``http.response.body`` would, minus their per-message work. ``headers`` must not carry a
    content length or transfer coding (the body's length is written). False, with nothing
    sent, when the response must go through ASGI instead: the request is not served by a
    :class:`ServingProtocol`, its response already started, the client left, writes are
    paused, an access log is written, or it is a ``HEAD``. Refuses bad header names and
    values as uvicorn does."""
    served = _serving(scope)
    if served is None:
        return False
    protocol, cycle = served
    if (
        cycle.response_started
        or cycle.disconnected
        or cycle.flow.write_paused
        or cycle.access_log
        or scope["method"] == "HEAD"
    ):
        return False
    keep_alive = cycle.keep_alive
    has_close = False
    parts = [_status_line(status)]
    for name, value in (*cycle.default_headers, *headers) if cycle.default_headers else headers:
        if _BAD_NAME.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if _BAD_VALUE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        name = name.lower()
        if name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
            keep_alive = False
            has_close = True
        parts += (name, b": ", value, b"\r\n")
    if not keep_alive:
        cycle.keep_alive = False
        if not has_close:
            parts.append(b"connection: close\r\n")
    parts.append(b"content-length: %d\r\n\r\n" % len(body))
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    transport = protocol._wrapper
    if len(body) <= _MERGE_MAX:
        parts.append(body)
        transport.write_whole(b"".join(parts))
    else:
        transport.write_whole(b"".join(parts), body)
    cycle.response_complete = True
    cycle.message_event.set()
    if not keep_alive:
        transport.close()
    cycle.on_response()
    return True


def arrived_body(scope: Any) -> bytes | None:
    """The request's whole body when all of it has arrived and none of it was received yet
    — what the application's first ``receive()`` would return, taken without the message
    round trip (the request is then read, as after that ``receive()``). None otherwise
    (more to come, already read, the client gone, a ``100 Continue`` to send, or a request
    not served by a :class:`ServingProtocol`): then ``receive()`` as usual."""
    served = _serving(scope)
    if served is None:
        return None
    cycle = served[1]
    if (
        cycle.more_body
        or cycle.disconnected
        or cycle.response_complete
        or cycle.waiting_for_100_continue
        or not cycle.message_event.is_set()  # nothing arrived since the last receive()
    ):
        return None
    body = bytes(cycle.body)
    cycle.body = bytearray()
    cycle.message_event.clear()
    cycle.flow.resume_reading()
    return body


def disconnection(scope: Any) -> Callable[[], bool] | None:
    """A check that turns true once the client of the request of ``scope`` is gone — what a
    ``receive()`` waiting after the whole body was read tells, without a task to wait in.
    None for a request not served by a :class:`ServingProtocol` (or queued behind another)."""
    served = _serving(scope)
    if served is None:
        return None
    protocol, cycle = served
    # uvicorn marks only the connection's newest request disconnected (a pipelined one may
    # follow this one): the transport tells for every request of the connection.
    is_closing = protocol._raw.is_closing
    return lambda: cycle.disconnected or is_closing()


class _HeadTooLarge(Exception):
    """Raised from the parser's callback: the head that just completed is over the limit."""


class Transport:
    """The connection's transport as uvicorn sees it: the same, except ``close`` and
    ``is_closing``, which are the protocol's (a staged close, see the module doc), and
    ``write``, which holds a response head until the end of the event-loop step, so the body
    written right after it (every JSON answer) leaves in the same send. Writes keep their
    order; body chunks are never held; ``flush`` sends what is held.

    The other calls a request makes go straight to the transport's own methods (bound once
    per connection, no ``__getattr__`` on the way); anything else is looked up on it."""

    def __init__(self, transport: asyncio.Transport, protocol: ServingProtocol) -> None:
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

    def write_whole(self, data: bytes, more: bytes = b"") -> None:
        """A whole response (:func:`respond`): never held, after anything that is."""
        self.flush()
        if more:
            self._transport.writelines((data, more))
        else:
            self._transport.write(data)

    def writelines(self, data: Any) -> None:
        self.flush()
        self._transport.writelines(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ServingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body deadlines, a header size limit and a
    staged close. A service serves a subclass with its own ``refusals``; the ``limits`` are
    the served application's ``read_limits`` if it has them (:func:`limits_of`), else the
    class's (:func:`protocol_class`)."""

    limits: ClassVar[ReadLimits] = ReadLimits()
    refusals: ClassVar[Refusals] = Refusals()
    _oversized = False  # set (on the instance) when a head that arrived whole is over the limit

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = limits_of(self.app)
        if limits is not None:
            self.limits = limits  # type: ignore[misc]  # the application's, over the class's
        self._linger: asyncio.TimerHandle | None = None  # set while a staged close drains
        self._lingered = 0
        self._phase = _IDLE
        self._head_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_phase = _IDLE
        # keep-alive: one timer per connection (see on_response_complete)
        self._idle_since: float | None = None  # loop time of the last answer; None: busy
        self._keep_alive: asyncio.TimerHandle | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._raw = transport
        self._wrapper = Transport(transport, self)
        self.transport = self._wrapper  # type: ignore[assignment]
        # uvicorn arms its keep-alive timer only after a response: bound the first request too.
        self._arm(self.limits.header_timeout_s, _HEADERS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
        if self._keep_alive is not None:
            self._keep_alive.cancel()
            self._keep_alive = None
        super().connection_lost(exc)
        # The transport's close/is_closing are this protocol's bound methods: hand them back
        # to the closed transport, so protocol and wrapper do not keep each other alive
        # (a reference cycle would leave every connection to the cyclic garbage collector).
        self._wrapper.close = self._raw.close
        self._wrapper.is_closing = self._raw.is_closing
        # Likewise the request's scope, which names this protocol (RESPOND): its task may still
        # run, and then answers through ASGI, which knows the client is gone.
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope.pop(RESPOND, None)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # a staged close: dropped, up to linger_bytes
            self._lingered += len(data)
            if self._lingered > self.limits.linger_bytes:
                self._raw.abort()
            return
        self._idle_since = None  # a request is arriving: the keep-alive timer lapses
        if self._phase != _BODY:
            self._head_bytes += len(data)
        super().data_received(data)
        phase = self._phase
        if phase == _HEADERS:
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(self.refusals.head_too_large)
            elif self._timer_phase != _HEADERS:
                self._arm(self.limits.header_timeout_s, _HEADERS)
        elif phase == _BODY:
            if self._timer_phase != _BODY:
                body_timeout = self.limits.body_timeout_s
                if body_timeout is not None:
                    self._arm(body_timeout, _BODY)
                elif self._timer is not None:
                    self._disarm()
        elif self._timer is not None:
            self._disarm()

    def handle_websocket_upgrade(self) -> None:
        # The connection is the WebSocket protocol's from here: no HTTP deadline applies.
        self._disarm()
        self._phase = _IDLE
        super().handle_websocket_upgrade()

    # httptools parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEADERS

    def on_headers_complete(self) -> None:
        # _head_bytes counts whole reads (the body's first bytes too): only a head that may be
        # over the limit is measured, and one that is stops the parser before its request runs.
        if self._head_bytes > self.limits.max_header_bytes and self._head_too_large():
            raise _HeadTooLarge  # uvicorn answers a parser error through send_400_response
        self._phase = _BODY
        self._head_bytes = 0
        super().on_headers_complete()
        self.scope[RESPOND] = self  # type: ignore[typeddict-unknown-key]  # see respond()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        super().on_message_complete()

    def on_response_complete(self) -> None:
        """uvicorn's, but the keep-alive timer is the connection's, not the request's: uvicorn
        arms a timer after every answer and cancels it when the next request arrives (its
        cost: bench/gateway/README.md). Here an answer records when the connection fell idle;
        the one timer, armed if none is, closes the connection ``timeout_keep_alive`` after
        that moment, re-arming itself for the rest when a later answer moved it, and lapsing
        when a request is arriving (the next answer arms it again)."""
        if self.pipeline or self.transport.is_closing():
            super().on_response_complete()  # start the pipelined request / nothing to keep
            return
        self.server_state.total_requests += 1
        self.flow.resume_reading()
        self._idle_since = self.loop.time()
        if self._keep_alive is None:
            self._keep_alive = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self._keep_alive = None
        since = self._idle_since
        if since is None:  # busy with a request: its answer arms the timer again
            return
        left = since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self._keep_alive = self.loop.call_later(left, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def _head_too_large(self) -> bool:
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        self._oversized = size > self.limits.max_header_bytes
        return self._oversized

    def send_400_response(self, msg: str) -> None:
        if self._oversized:  # not a request that does not parse: one whose head is too large
            self._refuse(self.refusals.head_too_large)
        else:
            super().send_400_response(msg)

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
        phase = self._phase
        if phase == _HEADERS:
            self._refuse(self.refusals.head_timeout, linger=False)
        elif phase == _IDLE:  # no first request at all
            self._refuse(self.refusals.first_request_timeout, linger=False)
        else:  # a body that did not arrive in time: the application sees a disconnect
            self._refuse(b"", linger=False)

    def _refuse(self, response: bytes, *, linger: bool = True) -> None:
        self._disarm()
        if not linger:  # the phase decides the close: mid-request, a staged one
            self._phase = _IDLE
        if not self.transport.is_closing():
            cycle = self.cycle
            # Never into the middle of an earlier response (a pipelined request's head).
            if response and (cycle is None or cycle.response_complete):
                self.transport.write(response)
            self.transport.close()
        self._phase = _IDLE

    # closing (uvicorn closes through ``self.transport``: see ``Transport``)
    def connection_closing(self) -> bool:
        return self._linger is not None or self._raw.is_closing()

    def close_connection(self) -> None:
        """Close at once between requests or after a deadline; mid-request (the client may
        still be sending its body or headers), a staged close: half-close, drop its input,
        close within bounds."""
        self._wrapper.flush()  # a held response head goes out before any close
        transport = self._raw
        if self._linger is not None or transport.is_closing():
            return
        limits = self.limits
        cycle = self.cycle
        if (
            self._phase == _IDLE
            or limits.linger_s <= 0
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
        self._disarm()  # the read deadlines are over: the linger bound replaces them
        if cycle is not None and not cycle.response_complete:
            # A request still being read (refused by the parser, say): its task learns now, as
            # uvicorn's connection_lost would tell it, that no more body will come.
            cycle.disconnected = True
            cycle.message_event.set()
        self._lingered = 0
        # abort, not close: a client that neither reads nor stops gets no more time
        self._linger = self.loop.call_later(limits.linger_s, transport.abort)
        transport.resume_reading()  # drain even if reading was paused (flow control)


def protocol_class(
    limits: ReadLimits, refusals: Refusals, name: str = "ServingProtocol"
) -> type[ServingProtocol]:
    """The protocol class (for uvicorn's ``http=``) serving with ``limits`` and ``refusals``."""
    return type(name, (ServingProtocol,), {"limits": limits, "refusals": refusals})
