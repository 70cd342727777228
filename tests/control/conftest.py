"""The analytics service (the control plane's home) as a real process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.known_secrets import secret
from tests.services import analytics_service

TOKEN = secret("control-admin")
DEADLINE_S = 30.0


@dataclass
class AdminService:
    url: str

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


@contextlib.contextmanager
def start_admin_service(database_url: str, extra_env: dict[str, str] | None = None) -> Iterator[AdminService]:
    """``python -m analytics`` without background workers but the ones ``extra_env`` turns on
    (``LIFTGATE_*`` names), no read token; stopped after the block."""
    settings: dict[str, str | None] = {"snapshot_interval_s": "0", "rollout_controller": "false"}
    settings |= {k.removeprefix("LIFTGATE_").lower(): v for k, v in (extra_env or {}).items()}
    with analytics_service(database_url, TOKEN, **{"read_token": None, **settings}) as url:
        yield AdminService(url)


@pytest.fixture(scope="module")
def admin_service(database_url: str) -> Iterator[AdminService]:
    """``python -m analytics`` without background workers: the test drives the controller."""
    with start_admin_service(database_url, {"LIFTGATE_NOTIFY_WORKER": "false"}) as svc:
        yield svc
