"""Helpers for the front-door tests: a real gateway (uvicorn thread, real database config)
with a recording sink, and the ``liftgate`` CLI run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.telemetry import GatewayMetrics
from tests.gateway.conftest import GatewayThread, MemorySink, free_port
from tests.known_secrets import secret

__all__ = ["ADMIN_TOKEN", "ROOT", "Gateway", "free_port", "liftgate"]

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = secret("frontdoor")


class Gateway(GatewayThread):
    """The real gateway app on a free port, reading its config from ``database_url``."""

    def __init__(self, database_url: str) -> None:
        self.sink = MemorySink()
        settings = GatewaySettings(
            admin_token=ADMIN_TOKEN, database_url=database_url, refresh_interval_s=0.2, client_keys="off"
        )
        super().__init__(create_app(settings, self.sink, metrics=GatewayMetrics()))


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
