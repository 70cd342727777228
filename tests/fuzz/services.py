"""The services under attack as real processes: ``python -m gateway`` and ``python -m analytics``
on free ports, each writing its log to a ``*.log`` file under pytest's temp dir (read back
by the secret scan), with their memory and CPU time at hand."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.gateway.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def http_json(
    method: str, url: str, token: str | None = None, body: Any = None, timeout: float = 30
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            raw = res.read()
            return int(res.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return int(exc.code), json.loads(raw)
        except ValueError:
            return int(exc.code), raw.decode(errors="replace")


class Service:
    """One service process; ``with`` starts it (ready once ``/healthz`` answers 200) and stops it."""

    def __init__(self, module: str, env: dict[str, str], log: Path, port_variable: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("LIFTGATE_", "PROMETHEUS_"))}
        self.env = {**inherited, "LIFTGATE_LOG_LEVEL": "info", **env, port_variable: str(self.port)}
        self.cmd = [sys.executable, "-m", module]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Service:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                if http_json("GET", self.url + "/healthz", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(
                    f"{self.cmd} did not start:\n{self.log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def process(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def rss(self) -> int:
        return int(self.process().memory_info().rss)

    def cpu_s(self) -> float:
        times = self.process().cpu_times()
        return float(times.user + times.system)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def gateway(database_url: str, admin_token: str, log: Path, **env: str) -> Service:
    settings = {"LIFTGATE_DATABASE_URL": database_url, "LIFTGATE_ADMIN_TOKEN": admin_token, **env}
    return Service("gateway", settings, log, "LIFTGATE_PORT")


def analytics(database_url: str, admin_token: str, read_token: str, log: Path, **env: str) -> Service:
    settings = {
        "LIFTGATE_DATABASE_URL": database_url,
        "LIFTGATE_ADMIN_TOKEN": admin_token,
        "LIFTGATE_READ_TOKEN": read_token,
        **env,
    }
    return Service("analytics", settings, log, "LIFTGATE_ANALYTICS_PORT")
