"""A real webhook receiver: an aiohttp server on 127.0.0.1 in a thread of the test process.

It verifies each request's signature with the secret it was given (the way the docs tell
users to), records what arrived and when, and answers with the statuses it is told to
(e.g. ``[503, 503]`` then 200: a receiver failing twice before it succeeds).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from control import webhook_signature


@dataclass
class Received:
    at: float  # time.time() on arrival
    headers: dict[str, str]
    body: bytes
    verdict: str | None  # None: the signature verified

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Receiver:
    secret: str | None
    url: str = ""
    fail_first: list[int] = field(default_factory=list)  # statuses to answer before 200
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        verdict = (
            webhook_signature.verify(
                self.secret, request.headers.get(webhook_signature.HEADER), body, time.time()
            )
            if self.secret is not None
            else None
        )
        with self.lock:
            self.requests.append(Received(time.time(), dict(request.headers), body, verdict))
            status = self.fail_first.pop(0) if self.fail_first else (401 if verdict else 200)
        return web.Response(status=status, text="ok" if status == 200 else "no")

    def wait_for(self, predicate: Any, timeout_s: float) -> list[Received]:
        """The requests once ``predicate(requests)`` holds; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                seen = list(self.requests)
            if predicate(seen):
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"receiver: condition not met within {timeout_s}s; got {len(seen)} requests"
                )
            time.sleep(0.02)


@contextmanager
def running(secret: str | None, fail_first: list[int] | None = None) -> Iterator[Receiver]:
    receiver = Receiver(secret, fail_first=list(fail_first or []))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner_box: dict[str, web.AppRunner] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", receiver.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        receiver.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/hook"
        runner_box["runner"] = runner
        ready.set()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=serve, name="webhook-receiver", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("webhook receiver did not start")
    try:
        yield receiver
    finally:
        asyncio.run_coroutine_threadsafe(runner_box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
