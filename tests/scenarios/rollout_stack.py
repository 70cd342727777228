"""Real processes for rollout scenarios: simulator, gateway (in-process ingest), analytics
service (controller + rollout API), standalone controllers, and a bounded traffic loop.

Everything listens on free ports on 127.0.0.1 and is stopped by the fixtures; every loop
is bounded in time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.known_secrets import secret, service_log

ROOT = Path(__file__).resolve().parents[2]
TOKEN = secret("scenario-admin")


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            if http("GET", url)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready within {timeout_s}s")


def service_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIFTGATE_KAFKA_BOOTSTRAP"}
    env.update(
        LIFTGATE_DATABASE_URL=database_url,
        LIFTGATE_ADMIN_TOKEN=TOKEN,
        LIFTGATE_SNAPSHOT_INTERVAL_S="0",
        LIFTGATE_ROLLOUT_TICK_S="0.3",
        LIFTGATE_ROLLOUT_SRM_GRACE_S="1.5",
        LIFTGATE_REFRESH_INTERVAL_S="0.5",
        LIFTGATE_CLIENT_KEYS="off",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``args`` as a process whose output goes to a log the secret scan reads."""
    with service_log(args[-1]) as log:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class Stack:
    database_url: str
    simulator: str
    gateway: str
    analytics: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        status, data = http(
            method, self.gateway + "/admin" + path, body, {"Authorization": f"Bearer {TOKEN}"}
        )
        assert status < 300, data
        return data

    def rollout(self, name: str, action: str | None = None) -> dict[str, Any]:
        path = f"/api/experiments/{name}/rollout" + (f"/{action}" if action else "")
        status, data = http("POST" if action else "GET", self.analytics + path, None,
                            {"Authorization": f"Bearer {TOKEN}", "X-Liftgate-Actor": "scenario"})  # fmt: skip
        assert status == 200, data
        assert isinstance(data, dict)
        return data

    def create_rollout(
        self, name: str, plan: dict[str, Any], candidate_model: str = "cand", control_model: str = "base"
    ) -> str:
        """Upstreams for the simulator's models and a started rollout; returns the route."""
        route = f"route-{name}"
        for up in ("base", "cand"):
            self.admin("POST", "/upstreams", {"name": f"{name}-{up}", "base_url": self.simulator})
        self.admin("POST", "/experiments", {
            "name": name, "route": route, "mode": "rollout", "rollout_plan": plan,
            "variants": [
                {"name": "control", "upstream": f"{name}-base", "model": control_model, "weight": 100,
                 "is_control": True},
                {"name": "candidate", "upstream": f"{name}-cand", "model": candidate_model, "weight": 0},
            ],
        })  # fmt: skip
        self.admin("POST", f"/experiments/{name}/start")
        return route

    def start_controller(self) -> subprocess.Popen[bytes]:
        proc = spawn([sys.executable, "-m", "analytics.rollout"], service_env(self.database_url))
        self.procs.append(proc)
        return proc


def start_stack(
    database_url: str, models: list[SimulatorModel], *, controller_in_service: bool
) -> Iterator[Stack]:
    sim = SimulatorProcess(models)
    sim_url = sim.start() + "/v1"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        gw_port, an_port = free_port(), free_port()
        gw = spawn([sys.executable, "-m", "tests.scenarios.rollout_gateway"],
                   service_env(database_url, LIFTGATE_PORT=str(gw_port), SCENARIO_LOSSY_ROUTE_PREFIX="route-lossy-"))  # fmt: skip
        procs.append(gw)
        an = spawn([sys.executable, "-m", "analytics"], service_env(
            database_url, LIFTGATE_ANALYTICS_PORT=str(an_port),
            LIFTGATE_ROLLOUT_CONTROLLER="true" if controller_in_service else "false",
        ))  # fmt: skip
        procs.append(an)
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", gw)
        wait_http(f"http://127.0.0.1:{an_port}/healthz", an)
        stack = Stack(
            database_url, sim_url, f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{an_port}", procs
        )
        yield stack
    finally:
        for p in procs:
            stop(p)
        sim.stop()


@dataclass
class Sent:
    at: datetime  # when the request was sent (its variant was assigned after this)
    unit: str
    variant: str | None
    status: int


class Traffic:
    """A bounded async request loop in a thread: ``units`` users, ``concurrency`` in flight."""

    def __init__(self, gateway: str, route: str, *, units: int = 600, concurrency: int = 24,
                 duration_s: float = 90.0) -> None:  # fmt: skip
        self.gateway, self.route, self.units = gateway, route, units
        self.concurrency, self.duration_s = concurrency, duration_s
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _main(self) -> None:
        deadline = time.monotonic() + self.duration_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            await asyncio.gather(*(self._worker(session, w, deadline) for w in range(self.concurrency)))

    async def _worker(self, session: aiohttp.ClientSession, worker: int, deadline: float) -> None:
        import random

        rng = random.Random(worker)
        while not self._stop.is_set() and time.monotonic() < deadline:
            unit = f"user-{rng.randrange(self.units)}"
            body = {"model": self.route, "messages": [{"role": "user", "content": f"hello from {unit}"}],
                    "max_tokens": 16}  # fmt: skip
            sent_at = datetime.now(UTC)
            try:
                async with session.post(self.gateway + "/v1/chat/completions", json=body,
                                        headers={"X-Liftgate-Unit": unit, "X-Liftgate-Show-Variant": "true"}) as resp:  # fmt: skip
                    await resp.read()
                    variant = resp.headers.get("X-Liftgate-Variant")
                    self.sent.append(Sent(sent_at, unit, variant, resp.status))
            except (aiohttp.ClientError, TimeoutError):
                continue


class RouteTraffic:
    """One bounded traffic driver for many routes at once: ``concurrency`` workers, each request
    to a random route among the active ones, from a unit drawn out of that route's ``units``
    (so most units send one or two requests, as new users do). ``stop_route`` ends a route's
    traffic; ``sent[route]`` counts answered requests."""

    def __init__(self, gateway: str, routes: list[str], *, units: int = 20_000, concurrency: int = 48,
                 duration_s: float = 240.0, max_tokens: int = 64) -> None:  # fmt: skip
        self.gateway, self.units, self.concurrency = gateway, units, concurrency
        self.duration_s, self.max_tokens = duration_s, max_tokens
        self.active: tuple[str, ...] = tuple(routes)
        self.sent: dict[str, int] = dict.fromkeys(routes, 0)
        self.errors: dict[str, int] = dict.fromkeys(routes, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> RouteTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def stop_route(self, route: str) -> None:
        # a new tuple, swapped in one assignment: workers read a consistent snapshot
        self.active = tuple(r for r in self.active if r != route)

    async def _main(self) -> None:
        deadline = time.monotonic() + self.duration_s
        conn = aiohttp.TCPConnector(limit=self.concurrency)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=10)) as session:
            await asyncio.gather(*(self._worker(session, w, deadline) for w in range(self.concurrency)))

    async def _worker(self, session: aiohttp.ClientSession, worker: int, deadline: float) -> None:
        import random

        rng = random.Random(1000 + worker)
        while not self._stop.is_set() and time.monotonic() < deadline:
            routes = self.active
            if not routes:
                await asyncio.sleep(0.05)
                continue
            route = routes[rng.randrange(len(routes))]
            unit = f"{route}-u{rng.randrange(self.units)}"
            body = {"model": route, "messages": [{"role": "user", "content": f"question {rng.random()}"}],
                    "max_tokens": self.max_tokens}  # fmt: skip
            try:
                async with session.post(self.gateway + "/v1/chat/completions", json=body,
                                        headers={"X-Liftgate-Unit": unit, "X-Liftgate-Show-Variant": "true"}) as resp:  # fmt: skip
                    await resp.read()
                    self.sent[route] += 1
                    if resp.status >= 500:
                        self.errors[route] += 1
            except (aiohttp.ClientError, TimeoutError):
                continue


def wait_for(
    predicate: Any, timeout_s: float, what: str, interval_s: float = 0.25, context: Any = None
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}; {context() if context else ''}")
