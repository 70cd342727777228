"""Real service processes for tests: free ports, plain HTTP helpers (stdlib only), a child
process ready once a URL answers 200, and the analytics service (``python -m analytics``) —
the one way tests start it and wait for its ``/healthz``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.known_secrets import secret

ROOT = Path(__file__).resolve().parents[1]
#: The read token of every analytics service these helpers start (reads need one).
READ_TOKEN = secret("read")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(
    method: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30,
    body: Any = None,
) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    hdrs = dict(headers or {})
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(url, method=method, headers=hdrs, data=data)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return int(res.status), res.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def get_json(url: str, token: str | None = None) -> Any:
    status, body = http("GET", url, {"Authorization": f"Bearer {token}"} if token else None)
    assert status == 200, f"GET {url}: {status} {body[:300]!r}"
    return json.loads(body)


def wait_http(url: str, deadline_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url`` until it answers 200 (or the process dies, or the deadline passes)."""
    end = time.monotonic() + deadline_s
    last = ""
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            status, body = http("GET", url, timeout=2)
            if status == 200:
                return
            last = f"{status} {body[:200]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {deadline_s}s: {last}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def child(
    cmd: list[str],
    env: Mapping[str, str | None],
    ready_url: str,
    deadline_s: float = 60,
    *,
    log: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until the block ends; enter once ``ready_url`` answers 200. ``env``
    overrides the inherited environment (``None`` removes a variable); ``log``: the file
    its stdout and stderr go to (else they are the test's)."""
    full = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for key in [k for k, v in env.items() if v is None]:
        full.pop(key, None)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("ab")) if log is not None else None
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=out, stderr=out)
        try:
            wait_http(ready_url, deadline_s, proc)
            yield proc
        finally:
            stop(proc)


def service_env(**settings: str | None) -> dict[str, str | None]:
    """The environment of a service child: no inherited ``LIFTGATE_*`` variable (the test's
    own, e.g. a Kafka bootstrap, would change what the service starts), then ``settings``
    as ``LIFTGATE_<NAME>`` (lower-case names without the prefix; ``None`` leaves one unset)."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LIFTGATE_")}
    env |= {f"LIFTGATE_{k.upper()}": v for k, v in settings.items()}
    return env


@contextlib.contextmanager
def analytics_service(
    database_url: str, admin_token: str, *, log: Path | None = None, **settings: str | None
) -> Iterator[str]:
    """``python -m analytics`` on a free port, ready once ``/healthz`` answers 200; yields its
    base URL and stops it after the block. ``settings`` are LIFTGATE_* variables (lower-case
    names without the prefix; ``None`` leaves one unset); nothing else is inherited. The
    read token is ``READ_TOKEN`` unless ``read_token`` is given."""
    port = free_port()
    env = service_env(
        **{
            "database_url": database_url,
            "admin_token": admin_token,
            "read_token": READ_TOKEN,
            "analytics_port": str(port),
            "log_level": "warning",
            **settings,
        }
    )
    url = f"http://127.0.0.1:{port}"
    with child([sys.executable, "-m", "analytics"], env, f"{url}/healthz", log=log):
        yield url
