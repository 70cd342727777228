"""A real HTTP judge (OpenAI-compatible chat completions, aiohttp in a thread) that is biased
toward length: it prefers the longer of two answers with probability σ(Δ chars / 40), drawn
per pair from a hash of the two texts — so both orders get the same verdict — and grades
every single answer 7/10."""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

_BLOCK = re.compile(r"<<<(A|B)-([0-9a-f]{32})>>>\n(.*?)\n<<<END-\1-\2>>>", re.DOTALL)
SCALE = 40.0
_SCALE = web.AppKey("scale", float)


def verdict(a: str, b: str, scale: float = SCALE) -> str:
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    p_longer = 1 / (1 + math.exp(-(len(longer) - len(shorter)) / scale))
    u = int.from_bytes(hashlib.sha256((min(a, b) + "\x00" + max(a, b)).encode()).digest()[:8]) / 2**64
    winner = longer if u < p_longer else shorter
    return "A" if winner == a else "B"


async def _chat(request: web.Request) -> web.Response:
    body = await request.json()
    user = body["messages"][-1]["content"]
    blocks = {m.group(1): m.group(3) for m in _BLOCK.finditer(user)}
    reply = (
        f"VERDICT: {verdict(blocks['A'], blocks['B'], request.app[_SCALE])}"
        if "A" in blocks and "B" in blocks
        else "SCORE: 7"
    )
    return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})


@contextmanager
def running_judge(scale: float = SCALE) -> Iterator[str]:
    """The judge's base URL (``http://127.0.0.1:PORT/v1``) while the block runs; it prefers
    the longer answer with probability σ(Δ chars / ``scale``)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict[str, object] = {}

    async def start() -> None:
        app = web.Application()
        app[_SCALE] = scale
        app.router.add_post("/v1/chat/completions", _chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    assert started.wait(10), "judge server did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}/v1"
    finally:
        runner = state["runner"]
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
