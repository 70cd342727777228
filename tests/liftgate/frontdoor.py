"""Helpers for the front-door tests: a real gateway (uvicorn thread, real database config)
with a recording sink, and the ``liftgate`` CLI run as a real subprocess."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import uvicorn

from contracts.events import Event, FeedbackEvent, InteractionEvent
from gateway.app import create_app
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "frontdoor-" + secrets.token_hex(16)


class RecordingSink:
    """Keeps every event in memory (a real sink; the gateway cannot tell the difference)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    def stats(self) -> dict[str, int]:
        return {"queued": 0, "delivered": len(self.events)}

    def interactions(self) -> list[InteractionEvent]:
        return [e for e in list(self.events) if isinstance(e, InteractionEvent)]

    def feedback(self) -> list[FeedbackEvent]:
        return [e for e in list(self.events) if isinstance(e, FeedbackEvent)]


class Gateway:
    """The real gateway app on a free port, reading its config from ``database_url``."""

    def __init__(self, database_url: str) -> None:
        self.sink = RecordingSink()
        settings = GatewaySettings(admin_token=ADMIN_TOKEN, database_url=database_url, refresh_interval_s=0.2)
        app = create_app(settings, self.sink, metrics=GatewayMetrics())
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, loop="asyncio")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def liftgate(
    *args: str, token: str | None = ADMIN_TOKEN, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real ``liftgate`` command line (``python -m liftgate``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTGATE_")}
    env["COLUMNS"] = "200"
    if token:
        env["LIFTGATE_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "liftgate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env=env,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
