"""The gateway's own CPU per request at c=1, in one process, with a real upstream.

Drives the real gateway app (``bench.gateway.serve``'s seeded A/B snapshot, client key
required) through ``gateway.server.GatewayProtocol`` on one keep-alive connection with an
in-memory client transport, one request at a time; the upstream is the shared harness's fake
vLLM in its own process, reached over loopback by the gateway's real upstream client. CPU is
``time.process_time`` of this process (the gateway's event loop and, with ``--kafka``, the
sink's threads), so it leaves out only the client side's socket read and write, which the
end-to-end harness counts. ``--profile`` prints cProfile's call counts per request instead.

  python -m bench.gateway.c1_bench [--requests 5000] [--rounds 5] [--kafka 127.0.0.1:29092]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from bench.gateway.hardening_bench import BODY, HEAD, Transport
from bench.gateway.serve import FAKE_UPSTREAM, _die_with_parent, free_port, seeded_snapshot
from gateway.__main__ import make_sink
from gateway.app import create_app
from gateway.null_sink import NullSink
from gateway.server import GatewayProtocol
from gateway.settings import GatewaySettings


class Answers(Transport):
    """The client side: a request is done when its answer's last byte arrives."""

    def __init__(self, done: asyncio.Event) -> None:
        super().__init__(done)
        self.statuses: dict[bytes, int] = {}

    def write(self, data: Any) -> None:
        data = bytes(data)
        if data.startswith(b"HTTP/1.1 "):
            status = data[9:12]
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status != b"200" and self.statuses[status] == 1:
                print("answer:", data[:600], file=sys.stderr)
        if data.endswith(b"}"):
            self.done.set()


def _short(file: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", os.getcwd() + "/"):
        file = file.split(marker)[-1]
    return file


def start_upstream() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_UPSTREAM), "--port", str(port), "--tokens", "16"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("fake upstream did not start")


async def run(a: argparse.Namespace, upstream: str) -> None:
    settings = GatewaySettings(
        admin_token=secrets.token_urlsafe(24),
        kafka_bootstrap=a.kafka,
        spool_dir=tempfile.mkdtemp(prefix="liftgate-c1-spool-"),
        client_keys="required",
        client_max_concurrency=1024,
    )
    sink = make_sink(settings) if a.kafka else NullSink()
    app = create_app(settings, sink, config_source=seeded_snapshot(upstream, None, 1.0))
    config = Config(app, log_level="warning", access_log=False, lifespan="off", proxy_headers=False)
    config.load()
    async with app.api.router.lifespan_context(app.api):
        done = asyncio.Event()
        proto = GatewayProtocol(config=config, server_state=ServerState(), app_state={})
        client = Answers(done)
        proto.connection_made(client)
        data = HEAD + BODY

        user: list[float] = []

        async def requests(n: int) -> float:
            t0 = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(n):
                done.clear()
                proto.data_received(data)
                await asyncio.wait_for(done.wait(), 5)
            t1 = resource.getrusage(resource.RUSAGE_SELF)
            user.append((t1.ru_utime - t0.ru_utime) / n * 1e6)
            return (t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime) / n * 1e6

        await requests(500)  # warm: upstream connection, caches
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            await requests(a.requests)
            prof.disable()
            st = pstats.Stats(prof)
            calls = sum(v[1] for v in st.stats.values())  # type: ignore[attr-defined]
            print(f"python calls per request: {calls / a.requests:.1f}")
            by_file: dict[str, list[float]] = {}
            for (file, _, _), (_, nc, tt, _, _) in st.stats.items():  # type: ignore[attr-defined]
                short = _short(file)
                agg = by_file.setdefault(short, [0.0, 0.0])
                agg[0] += nc / a.requests
                agg[1] += tt / a.requests * 1e6
            print("calls/request  own µs/request (profiled)  file")
            for short, (nc, tt) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[: a.top]:
                print(f"{nc:6.1f}  {tt:7.2f}  {short}")
            print("calls/request  own µs/request (profiled)  function")
            rows = sorted(st.stats.items(), key=lambda kv: -kv[1][1])  # type: ignore[attr-defined]
            for (file, line, fn), (_, nc, tt, _ct, _) in rows[: a.top]:
                short = _short(file)
                print(f"{nc / a.requests:6.2f}  {tt / a.requests * 1e6:6.2f}µs  {short}:{line} {fn}")
        else:
            per = [await requests(a.requests) for _ in range(a.rounds)]
            print(
                f"cpu µs/request median {statistics.median(per):.1f} "
                f"(min {min(per):.1f} max {max(per):.1f}) rounds {[round(p, 1) for p in per]} "
                f"user median {statistics.median(user[1:]):.1f}"
            )
        proto.connection_lost(None)
        print(f"answers by status: {client.statuses}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kafka", default=None, help="bootstrap servers; events to Kafka (else a null sink)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    proc, upstream = start_upstream()
    try:
        uvloop.run(run(a, upstream))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


if __name__ == "__main__":
    main()
