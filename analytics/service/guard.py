"""The request guard: what every request must pass before any route reads its body.

An ASGI middleware in front of the whole analytics app, in this order:

1. a path with a NUL or another control character is refused (400): no file, experiment or
   metric can have such a name, and it must not reach the filesystem or the database;
2. a ``Content-Length`` above ``max_body_bytes`` is refused (413) before a byte is read;
3. a request that could change something (any method but GET/HEAD/OPTIONS, except the
   sign-in and sign-out forms, which check their own CSRF token) needs a credential of at
   least the operator role (:mod:`control.auth`: a bearer token, or the session cookie *with*
   its CSRF token in ``X-CSRF-Token``) before its body is read — a wrong token with a
   200 MiB body costs one header check (and one indexed lookup for a user's token or
   session). The route then checks the exact role it needs; the principal resolved here is
   handed to it in the ASGI scope, so a request is resolved once;
4. the body is counted while it streams (413 as soon as it exceeds the limit, chunked
   bodies included) and must arrive within ``body_timeout_s`` (408).

Refusals are JSON ``{"detail": reason}`` like every other error of the service. One made
before the body is read closes the connection when the declared body is larger than
:data:`DRAIN_BYTES` or chunked (such an upload is never read); a smaller body is discarded
as it arrives and the connection kept, because closing on unread bytes makes the kernel
reset the connection, which can destroy the answer before the client reads it (clients
such as Python's http.client write a request's headers and body separately). A refusal
while the body streams (too large, too slow) closes the connection. A closed connection whose
client may still be sending is closed in stages by the server (``serving.protocol``:
the answer, a FIN, then what the client sends is dropped within bounds), except after the
body deadline's 408, which closes at once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any, Final

import orjson
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, cookie_parser

from analytics.service.access import LOGIN_PATH, Access
from control.auth import SCOPE_KEY, Denied, Principal, denial
from serving.protocol import CLOSE_AT_ONCE

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_OPEN_POSTS: Final = frozenset({LOGIN_PATH, "/dashboard/logout"})
DRAIN_BYTES: Final = 64 * 1024
#: POSTs that change nothing (a question with a body): a read credential suffices.
_READ_POSTS: Final = frozenset({"/api/rollout-plans/check"})


class RequestGuard:
    def __init__(self, app: ASGIApp, access: Access, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.access = access
        self.max_body = max_body_bytes
        self.body_timeout = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            refusal = await self._credential_refusal(scope)
        if refusal is not None:
            headers = Headers(scope=scope)
            length = headers.get("content-length", "0")
            small = length.isascii() and length.isdigit() and int(length) <= DRAIN_BYTES
            await _respond(send, *refusal, close="transfer-encoding" in headers or not small)
            return
        await self._guarded(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, dict[str, str]] | None:
        path: str = scope.get("path", "")
        if _CONTROL.search(path):
            return 400, "the path contains a control character", {}
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None:
            if not length.isascii() or not length.isdigit():
                return 400, "invalid Content-Length", {}
            if int(length) > self.max_body:
                return 413, f"request body larger than {self.max_body} bytes", {}
        return None

    async def _credential_refusal(self, scope: Scope) -> tuple[int, str, dict[str, str]] | None:
        """A change needs an operator (a read-only POST any reader) before its body is read."""
        path: str = scope.get("path", "")
        method: str = scope["method"]
        if method in _SAFE_METHODS or path in _OPEN_POSTS:
            return None
        headers = Headers(scope=scope)
        read_only = method == "POST" and path in _READ_POSTS
        if read_only and "authorization" not in headers:
            return None  # the route's read dependency decides (session cookie or open mode)
        cookies = cookie_parser(headers.get("cookie", ""))
        # Read-only POSTs change nothing, so they are resolved like a GET (no CSRF token needed).
        as_method = "GET" if read_only else method
        try:
            principal = await self._resolve(as_method, headers, cookies)
            refused = denial(principal, "viewer" if read_only else "operator")
        except Denied as exc:
            refused = exc
        if refused is not None:
            extra = {"www-authenticate": "Bearer"} if refused.status == 401 else {}
            return refused.status, refused.reason, extra
        scope[SCOPE_KEY] = principal
        return None

    async def _resolve(self, method: str, headers: Headers, cookies: dict[str, str]) -> Principal | None:
        auth = self.access.auth
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            found = auth.bootstrap(token.strip(), headers.get("x-liftgate-actor"))
            if found is not None:
                return found  # the bootstrap tokens need no database
        # A user's token or a session: one indexed query, off the event loop.
        return await run_in_threadpool(partial(auth.resolve, method, headers, cookies))

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        received = 0
        started = refused = body_done = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the guard answered already; the app's late response is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def refuse(status: int, reason: str, *, at_once: bool = False) -> Message:
            nonlocal refused
            if at_once:  # a deadline: no staged close, which would extend the hold it bounds
                scope[CLOSE_AT_ONCE] = True
            if not started:
                await _respond(send, status, reason, {}, close=True)
            refused = True
            return {"type": "http.disconnect"}

        async def guarded_receive() -> Message:
            nonlocal received, body_done
            if refused:
                return {"type": "http.disconnect"}
            if body_done:  # e.g. a streaming response waiting for the client to go away
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                return await refuse(
                    408, f"request body not received within {self.body_timeout:g} s", at_once=True
                )
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    return await refuse(413, f"request body larger than {self.max_body} bytes")
                body_done = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except ClientDisconnect:
            # The disconnect the guard itself reported after answering (413, 408): the app
            # stopping on it is the expected end, not an error for uvicorn to log with a
            # traceback on every refused upload.
            if not refused:
                raise


async def _respond(send: Send, status: int, reason: str, headers: dict[str, str], *, close: bool) -> None:
    body = orjson.dumps({"detail": reason})
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *([(b"connection", b"close")] if close else []),
        *((k.encode(), v.encode()) for k, v in headers.items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
