"""What the hot path's request and answer cost in the serving protocol, ASGI messages vs
``serving.protocol.arrived_body`` + ``respond``, measured in isolation.

The end-to-end harness (README) cannot resolve a few µs on a shared 2-core box, so this
drives ``gateway.server.GatewayProtocol`` on one keep-alive connection with an in-memory
transport (as ``hardening_bench`` does) and two applications that do what the proxy does
with a request that arrived whole and a JSON answer: one reads the body with ``receive()``
and answers with ``http.response.start`` + ``http.response.body``, the other takes the body
with ``arrived_body`` and answers with ``respond``. CPU µs per request; rounds alternate the
order (AB, BA, ...) and the saving is the median of the paired round differences.

  python -m bench.gateway.respond_bench [--requests 10000] [--rounds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from bench.gateway.hardening_bench import BODY, HEAD, Transport
from gateway.server import GatewayProtocol
from serving.protocol import arrived_body, respond

ANSWER = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0}],"usage":{}}ok'
HEADERS = [(b"content-type", b"application/json"), (b"x-request-id", b"req-0123456789abcdef01234567")]


async def by_asgi(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    msg = await receive()
    assert msg["body"] == BODY
    head = [HEADERS[0], (b"content-length", b"%d" % len(ANSWER)), *HEADERS[1:]]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": ANSWER})


async def by_respond(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = arrived_body(scope)
    assert body == BODY
    assert respond(scope, 200, list(HEADERS), ANSWER)


async def _round(app: Any, n: int) -> float:
    # As the entry points serve (gateway.server.uvicorn_options): no proxy-headers middleware.
    config = Config(app, log_level="warning", access_log=False, lifespan="off", proxy_headers=False)
    config.load()
    done = asyncio.Event()
    proto = GatewayProtocol(config=config, server_state=ServerState(), app_state={})
    proto.connection_made(Transport(done))
    data = HEAD + BODY
    t0 = time.process_time()
    for _ in range(n):
        done.clear()
        proto.data_received(data)
        await done.wait()
    elapsed = time.process_time() - t0
    proto.connection_lost(None)
    return elapsed / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    asgi: list[float] = []
    fast: list[float] = []
    for r in range(a.rounds):
        order = (by_asgi, by_respond) if r % 2 == 0 else (by_respond, by_asgi)
        for app in order:
            (asgi if app is by_asgi else fast).append(uvloop.run(_round(app, a.requests)))
    saved = [x - y for x, y in zip(asgi, fast, strict=True)]
    print(f"CPU µs per request, {a.requests} requests per round, {a.rounds} rounds (median, min)")
    print(
        "| ASGI receive + 2 sends | arrived_body + respond | saved: median of round differences (min–max) |"
    )
    print("|---|---|---|")
    print(
        f"| {statistics.median(asgi):.2f} ({min(asgi):.2f}) | {statistics.median(fast):.2f} ({min(fast):.2f}) "
        f"| {statistics.median(saved):.2f} ({min(saved):.2f} – {max(saved):.2f}) |"
    )


if __name__ == "__main__":
    main()
