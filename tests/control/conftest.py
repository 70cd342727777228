"""The analytics service (the control plane's home) as a real process on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.known_secrets import secret

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secret("control-admin")
DEADLINE_S = 30.0


@dataclass
class AdminService:
    url: str
    proc: subprocess.Popen[bytes]

    def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = TOKEN, actor: str | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        if actor is not None:
            req.add_header("X-Liftgate-Actor", actor)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def admin_service(database_url: str) -> Iterator[AdminService]:
    """``python -m analytics`` without background workers: the test drives the controller."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTGATE_")}
    env |= {
        "LIFTGATE_DATABASE_URL": database_url,
        "LIFTGATE_ADMIN_TOKEN": TOKEN,
        "LIFTGATE_ANALYTICS_PORT": str(port),
        "LIFTGATE_SNAPSHOT_INTERVAL_S": "0",
        "LIFTGATE_ROLLOUT_CONTROLLER": "false",
        "LIFTGATE_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen([sys.executable, "-m", "analytics"], cwd=ROOT, env=env)
    svc = AdminService(f"http://127.0.0.1:{port}", proc)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            if svc.call("GET", "/healthz")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("analytics service did not become healthy")
        time.sleep(0.05)
    yield svc
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
