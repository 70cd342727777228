"""A minimal keep-alive HTTP/1.1 client for upstream calls (asyncio Protocol + httptools parser).

Why not aiohttp on the hot path: its request machinery (header merging, tracing hooks,
payload registry, timer contexts) costs ~50–70 µs of CPU per call on this class of machine,
a quarter of the gateway's budget. Upstream calls are always the same shape — ``POST`` with a
JSON body to a known host — so the request head is pre-rendered per endpoint, written with
one ``transport.write``, and the response is parsed by httptools' C parser (the one uvicorn
uses). aiohttp stays for the rare calls (readiness probes).

Behaviour: a bounded pool of keep-alive connections per upstream (``max_connections``);
connect timeout; a total timeout for JSON calls and an idle-gap timeout between stream
chunks; a call that fails on a *reused* connection before any response byte arrives is
retried once on a fresh one (the server closed an idle keep-alive connection). Errors are
:class:`UpstreamError` with ``kind`` = ``connect`` | ``timeout`` | ``protocol``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

_PAUSE_CHUNKS = 64


class UpstreamError(Exception):
    def __init__(self, kind: str, message: str = "") -> None:
        super().__init__(message or kind)
        self.kind = kind


class _Conn(asyncio.Protocol):
    """One upstream connection; carries one request at a time."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        # The current wait's deadline (loop time) and the timer that checks it. One timer
        # outlives the waits it bounds: a wait only moves the deadline, and the timer, when it
        # fires early (armed for an earlier wait), is armed again for the deadline then
        # current. So a call costs no timer of its own.
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.got_bytes = False
        self.streaming = False
        self.complete = False
        self.keep_alive = False
        self.parts: list[bytes] = []
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - never requested
            self._fail(UpstreamError("protocol", "unexpected upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("protocol", f"bad response: {exc}"))
        else:
            # A stream's reader is woken once per read, not per chunk: a read often carries
            # a dozen SSE events, each its own chunk, and the reader takes them all at once.
            if self.streaming and self.parts:
                self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.pool._forget(self)
        if not self.complete:
            self._fail(UpstreamError("protocol", "upstream closed the connection"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.streaming:
            self._wake()

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        if (
            self.streaming
            and len(self.parts) > _PAUSE_CHUNKS
            and not self.paused
            and self.transport is not None
        ):
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # internals
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_deadline(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:  # no wait in progress: the next one arms the timer again
            return
        if self.loop.time() < deadline:  # armed for an earlier wait
            self._arm(deadline)
            return
        self._fail(UpstreamError("timeout", "upstream timed out"))
        self.abort()

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._check_deadline)
        self._timer_at = when

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def wait(self, timeout: float | None) -> None:
        """Wait for the next parser progress (or failure), bounded by ``timeout``."""
        waiter = self.waiter = self.loop.create_future()
        if timeout:
            deadline = self._deadline = self.loop.time() + timeout
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)
        try:
            await waiter
        finally:
            self.waiter = None
            self._deadline = None


class StreamResponse:
    """An open streamed response: iterate ``chunks()``, then ``release()``."""

    def __init__(self, conn: _Conn, gap_timeout: float) -> None:
        self.conn = conn
        self.status = conn.status
        self.gap_timeout = gap_timeout
        self._released = False

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self.conn
        while True:
            if conn.parts:
                data = b"".join(conn.parts) if len(conn.parts) > 1 else conn.parts[0]
                conn.parts.clear()
                if conn.paused and conn.transport is not None:
                    conn.paused = False
                    conn.transport.resume_reading()
                yield data
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.gap_timeout)

    async def read(self) -> bytes:
        out = []
        async for chunk in self.chunks():
            out.append(chunk)
        return b"".join(out)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.conn.pool.release(self.conn)


class HttpPool:
    """Keep-alive connections to one upstream (``base_url`` like ``http://host:port/v1``)."""

    def __init__(self, base_url: str, limit: int = 100, connect_timeout: float = 5.0) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.base_path = parts.path.rstrip("/")
        default_port = (self.https and self.port == 443) or (not self.https and self.port == 80)
        self.host_header = self.host if default_port else f"{self.host}:{self.port}"
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.loop = asyncio.get_running_loop()
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if self.https else None
        self.idle: list[_Conn] = []
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def head(self, path: str, extra_headers: dict[str, str]) -> bytes:
        """The pre-rendered request head up to (not including) Content-Length."""
        lines = [f"POST {self.base_path}{path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in extra_headers.items()]
        return ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")

    async def _acquire(self) -> _Conn:
        while True:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    conn.reused = True
                    return conn
            if self.open < self.limit:
                self.open += 1
                try:
                    _, proto = await asyncio.wait_for(
                        self.loop.create_connection(lambda: _Conn(self), self.host, self.port, ssl=self.ssl),
                        self.connect_timeout,
                    )
                except (TimeoutError, OSError, ssl.SSLError) as exc:
                    self.open -= 1
                    self._wake_one()
                    raise UpstreamError(
                        "connect", f"cannot connect to {self.host}:{self.port}: {exc}"
                    ) from None
                return proto
            waiter = self.loop.create_future()
            self.waiters.append(waiter)
            await waiter

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _forget(self, conn: _Conn) -> None:
        """Called once when a connection closes."""
        if conn in self.idle:
            self.idle.remove(conn)
        self.open -= 1
        self._wake_one()

    def release(self, conn: _Conn) -> None:
        if conn.closed:
            return
        if conn.complete and conn.keep_alive and conn.error is None and not self.closed:
            conn._reset()
            self.idle.append(conn)
            self._wake_one()
        else:
            conn.abort()

    async def _send(self, head: bytes, body: bytes, streaming: bool) -> _Conn:
        conn = await self._acquire()
        conn.streaming = streaming
        assert conn.transport is not None
        conn.transport.write(b"%s%d\r\n\r\n%s" % (head, len(body), body))
        return conn

    async def post(self, head: bytes, body: bytes, timeout: float) -> tuple[int, bytes]:
        """A JSON call: (status, body)."""
        for attempt in (0, 1):
            conn = await self._send(head, body, False)
            try:
                while not conn.complete and conn.error is None:
                    await conn.wait(timeout)
            except BaseException:  # cancelled: the connection is in an unknown state
                conn.abort()
                raise
            if conn.error is not None:
                retry = attempt == 0 and conn.reused and not conn.got_bytes and conn.error.kind == "protocol"
                conn.abort()
                if retry:
                    continue
                raise conn.error
            data = b"".join(conn.parts)
            status = conn.status
            self.release(conn)
            return status, data
        raise UpstreamError("protocol")  # pragma: no cover - loop always returns or raises

    async def stream(self, head: bytes, body: bytes, gap_timeout: float) -> StreamResponse:
        """Send a streamed call; returns once the response headers arrived."""
        for attempt in (0, 1):
            conn = await self._send(head, body, True)
            try:
                while not conn.status and conn.error is None:
                    await conn.wait(gap_timeout)
            except BaseException:
                conn.abort()
                raise
            if conn.error is not None:
                retry = attempt == 0 and conn.reused and not conn.got_bytes and conn.error.kind == "protocol"
                conn.abort()
                if retry:
                    continue
                raise conn.error
            return StreamResponse(conn, gap_timeout)
        raise UpstreamError("protocol")  # pragma: no cover

    async def close(self) -> None:
        self.closed = True
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()
