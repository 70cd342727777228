"""A small synchronous client for the control plane's admin API (``/admin/...``).

Every command that changes something talks to one admin base URL: the analytics service
(``--admin-url``, else ``LIFTGATE_ADMIN_URL``, else what ``liftgate up`` recorded in its
state directory, else ``http://127.0.0.1:8090``). Used by ``liftgate up`` (seeding the
demo), ``liftgate experiments`` and ``liftgate rollout``. Standard library only: the CLI
makes a handful of calls, so a blocking client keeps it simple.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

TOKEN_FILE = "admin_token"
READ_TOKEN_FILE = "read_token"
RUN_FILE = "up.json"  # written by `liftgate up`: its URLs (liftgate.stack)
DEFAULT_ADMIN_URL = "http://127.0.0.1:8090"
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"


def _state(state_dir: Path | None) -> Path:
    return state_dir or Path(os.environ.get("LIFTGATE_STATE_DIR", Path.cwd() / ".liftgate"))


def recorded_url(kind: str, state_dir: Path | None = None) -> str | None:
    """The URL a running ``liftgate up`` recorded in its run file (``gateway``, ``analytics``,
    ``admin``), or None when there is no run file or it names none."""
    try:
        recorded = json.loads((_state(state_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    url = recorded.get(kind) if isinstance(recorded, dict) else None
    return url if isinstance(url, str) and url else None


def resolve_admin_url(explicit: str | None, state_dir: Path | None = None) -> str:
    """The admin base URL: --admin-url, else LIFTGATE_ADMIN_URL, else the running ``liftgate
    up``'s (its run file), else the default analytics address."""
    if explicit:
        return explicit
    env = os.environ.get("LIFTGATE_ADMIN_URL")
    if env:
        return env
    return recorded_url("admin", state_dir) or recorded_url("analytics", state_dir) or DEFAULT_ADMIN_URL


def resolve_analytics_url(explicit: str | None, state_dir: Path | None = None) -> str:
    """The analytics service: the flag (or its environment variable), else the running ``liftgate
    up``'s, else http://127.0.0.1:8090 — so ``liftgate up --analytics-port N`` just works."""
    return explicit or recorded_url("analytics", state_dir) or DEFAULT_ADMIN_URL


def resolve_gateway_url(explicit: str | None, state_dir: Path | None = None) -> str:
    """The gateway: the flag (or LIFTGATE_GATEWAY_URL), else the running ``liftgate up``'s,
    else http://127.0.0.1:8080."""
    return explicit or recorded_url("gateway", state_dir) or DEFAULT_GATEWAY_URL


class AdminError(RuntimeError):
    """An admin call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def resolve_token(explicit: str | None, state_dir: Path | None = None) -> str:
    """--token, else LIFTGATE_TOKEN (a user's API token, ``liftgate users token``), else
    LIFTGATE_ADMIN_TOKEN, else ``<state dir>/admin_token`` (what ``liftgate up`` wrote)."""
    if explicit:
        return explicit
    for var in ("LIFTGATE_TOKEN", "LIFTGATE_ADMIN_TOKEN"):
        env = os.environ.get(var)
        if env:
            return env
    path = _state(state_dir) / TOKEN_FILE
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    if not token:
        raise AdminError(
            0,
            f"no admin token: pass --token, set LIFTGATE_ADMIN_TOKEN, or run `liftgate up` (writes {path})",
        )
    return token


def resolve_read_token(explicit: str | None, state_dir: Path | None = None) -> str:
    """A credential to read the analytics API: --token, else LIFTGATE_READ_TOKEN, else
    LIFTGATE_ADMIN_TOKEN, else what ``liftgate up`` wrote (``read_token``, ``admin_token``);
    "" when there is none (the service then says what it needs)."""
    if explicit:
        return explicit
    for var in ("LIFTGATE_READ_TOKEN", "LIFTGATE_ADMIN_TOKEN"):
        if os.environ.get(var):
            return os.environ[var]
    state = _state(state_dir)
    for name in (READ_TOKEN_FILE, TOKEN_FILE):
        try:
            token = (state / name).read_text().strip()
        except OSError:
            continue
        if token:
            return token
    return ""


def _detail(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:300]
    if isinstance(data, dict):
        if "detail" in data:
            detail = data["detail"]
            return detail if isinstance(detail, str) else json.dumps(detail)
        if isinstance(data.get("error"), dict):
            return str(data["error"].get("message"))
    return json.dumps(data)[:300]


class AdminClient:
    def __init__(self, base_url: str, token: str, *, timeout: float = 15.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(exc.code, f"{method} {path}: HTTP {exc.code}: {_detail(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(0, f"{method} {path}: cannot reach {self.base_url} ({exc})") from None
        return json.loads(raw) if raw else None

    @staticmethod
    def _q(name: str) -> str:
        return urllib.parse.quote(str(name), safe="")

    # -- upstreams -------------------------------------------------------------------
    def upstreams(self) -> list[dict[str, Any]]:
        return _items(self.request("GET", "/admin/upstreams"))

    def create_upstream(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", "/admin/upstreams", spec)
        return result

    # -- experiments -----------------------------------------------------------------
    def experiments(self) -> list[dict[str, Any]]:
        return _items(self.request("GET", "/admin/experiments"))

    def experiment(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/admin/experiments/{self._q(name)}")
        return result

    def create_experiment(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", "/admin/experiments", spec)
        return result

    def action(self, name: str, action: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/admin/experiments/{self._q(name)}/{action}")
        return result


def _items(data: Any) -> list[dict[str, Any]]:
    """List endpoints may answer a bare list or an object wrapping one."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for key in ("items", "experiments", "upstreams", "data"):
            if isinstance(data.get(key), list):
                items: list[dict[str, Any]] = data[key]
                return items
    return []
