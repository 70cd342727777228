"""What the input boundary and the read deadlines cost per request, measured in isolation.

The end-to-end harness (README) is too noisy on a shared 2-core box to resolve a few µs, so
this measures the added work directly, A/B in the same process, rounds interleaved:

* **protocol** — uvicorn's ``HttpToolsProtocol`` vs ``gateway.server.GatewayProtocol`` on one
  keep-alive connection (in-memory transport, a minimal ASGI app): CPU µs per request, for
  requests that arrive in one read (the common case: no timer) and in three reads (headers,
  then the body in two parts: timers armed and cancelled); and with a new connection for
  each request (the connection's setup and teardown: the first-request timer, the transport
  wrapper of the staged close).
* **checks** — the hot path's added per-request calls on the harness's request:
  ``completion_problem`` + ``too_deep`` + the per-client ``ConcurrencyLimit`` acquire/release.

  python -m bench.gateway.hardening_bench [--requests 10000] [--rounds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import timeit
from typing import Any

import orjson
import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.inputs import completion_problem, too_deep
from gateway.limits import ConcurrencyLimit
from gateway.server import GatewayProtocol

BODY = orjson.dumps(
    {
        "model": "fake",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "temperature": 0,
    }
)
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Authorization: Bearer sk-bench-1234\r\nContent-Length: %d\r\n\r\n" % len(BODY)
)


class Transport(asyncio.Transport):
    """Enough of a transport for uvicorn's protocol: counts responses, never blocks."""

    def __init__(self, done: asyncio.Event) -> None:
        super().__init__()
        self.done = done
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 9000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: Any) -> None:
        if bytes(data).endswith(b"ok"):
            self.done.set()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _protocol_round(
    cls: type[HttpToolsProtocol], n: int, parts: list[bytes], connection_each: bool = False
) -> float:
    config = Config(app, log_level="warning", access_log=False, lifespan="off")
    config.load()
    done = asyncio.Event()
    state = ServerState()
    proto = cls(config=config, server_state=state, app_state={})
    proto.connection_made(Transport(done))
    t0 = time.process_time()
    for _ in range(n):
        if connection_each:
            proto = cls(config=config, server_state=state, app_state={})
            proto.connection_made(Transport(done))
        done.clear()
        for part in parts:
            proto.data_received(part)
        await done.wait()
        if connection_each:
            proto.connection_lost(None)
    elapsed = time.process_time() - t0
    if not connection_each:
        proto.connection_lost(None)
    return elapsed / n * 1e6


def bench_protocol(n: int, rounds: int) -> None:
    """Rounds alternate the order (AB, BA, ...); ``added`` is the median of the per-round
    differences (paired, so load that drifts during the run cancels out), with the minimum of
    each column beside the median: on a busy box the minimum is the cost with the least noise."""
    whole = [HEAD + BODY]
    split = [HEAD, BODY[:20], BODY[20:]]
    print(f"protocol: µs of CPU per request, {n} requests per round, {rounds} rounds")
    print(
        "| request arrives | HttpToolsProtocol median (min) | GatewayProtocol median (min) | added: median of round differences (min–max) |"
    )
    print("|---|---|---|---|")
    cases = (
        ("in one read", whole, False),
        ("in three reads", split, False),
        ("on a new connection", whole, True),
    )
    for label, parts, connection_each in cases:
        base: list[float] = []
        ours: list[float] = []
        for r in range(rounds):
            order = (
                (HttpToolsProtocol, GatewayProtocol) if r % 2 == 0 else (GatewayProtocol, HttpToolsProtocol)
            )
            for cls in order:
                (base if cls is HttpToolsProtocol else ours).append(
                    uvloop.run(_protocol_round(cls, n, parts, connection_each))
                )
        diffs = [o - b for o, b in zip(ours, base, strict=True)]
        print(
            f"| {label} | {statistics.median(base):.2f} ({min(base):.2f}) | {statistics.median(ours):.2f} "
            f"({min(ours):.2f}) | {statistics.median(diffs):+.2f} ({min(diffs):+.2f} – {max(diffs):+.2f}) |"
        )


def bench_checks(rounds: int) -> None:
    req = orjson.loads(BODY)
    limit = ConcurrencyLimit(64)

    def checks() -> None:
        completion_problem(req, "chat")
        too_deep(BODY, req)
        limit.acquire("client")
        limit.release("client")

    runs = [min(timeit.repeat(checks, number=100_000, repeat=3)) / 100_000 * 1e6 for _ in range(rounds)]
    print(
        f"\nchecks: completion_problem + too_deep + acquire/release = {statistics.median(runs):.2f} µs per request"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    bench_protocol(a.requests, a.rounds)
    bench_checks(a.rounds)


if __name__ == "__main__":
    main()
