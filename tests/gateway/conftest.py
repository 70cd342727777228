"""Gateway test helpers: a recording sink, a real simulator process, the gateway in a uvicorn thread."""

from __future__ import annotations

import http.client as httpclient
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, Protocol

import psutil
import pytest

from contracts.events import Event, FeedbackEvent, InteractionEvent
from gateway.app import GatewayApp, create_app
from gateway.config_source import ConfigSource, StaticConfigSource
from gateway.server import uvicorn_options
from gateway.settings import GatewaySettings
from gateway.snapshot import ExperimentConfig, UpstreamConfig, VariantConfig, build_snapshot
from gateway.telemetry import GatewayMetrics
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.known_secrets import secret
from tests.serving.uvicorn_thread import UvicornThread

ADMIN_TOKEN = secret("test-admin")


class MemorySink:
    """Records every event it is given (a real sink, in memory)."""

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

    def interactions(self, request_id: str | None = None) -> list[InteractionEvent]:
        return [
            e
            for e in self.events
            if isinstance(e, InteractionEvent)
            and (request_id is None or request_id in (e.request_id, e.pair_id))
        ]

    def feedback(self) -> list[FeedbackEvent]:
        return [e for e in self.events if isinstance(e, FeedbackEvent)]

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> list[InteractionEvent]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.interactions() if predicate(e)]
            if found:
                return found
            time.sleep(0.01)
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayThread(UvicornThread):
    """The real app served by uvicorn on a free port in a background thread, with the
    options every entry point uses (``gateway.server``: its protocol, deadlines, keep-alive).
    ``loop``: asyncio's own by default; ``"uvloop"`` is what the entry points serve with."""

    def __init__(self, app: GatewayApp, loop: str = "asyncio") -> None:
        self.app = app
        options = {**uvicorn_options(app.runtime.settings), "log_level": "warning", "loop": loop}
        super().__init__(app, lifespan="on", **options)


def settings(**kw: Any) -> GatewaySettings:
    """Test settings: client keys off unless a test asks for them (``client_keys="required"``)."""
    base: dict[str, Any] = {
        "admin_token": ADMIN_TOKEN,
        "database_url": "postgresql+psycopg://unused@127.0.0.1:1/x",
        "client_keys": "off",
    }
    base.update(kw)
    return GatewaySettings(**base)


def start_gateway(sink: MemorySink, source: ConfigSource, loop: str = "asyncio", **kw: Any) -> GatewayThread:
    app = create_app(settings(**kw), sink, config_source=source, metrics=GatewayMetrics())
    return GatewayThread(app, loop)


@pytest.fixture(scope="session")
def simulator() -> Iterator[str]:
    """One real simulator process serving fast, hanging and failing models."""
    fast: dict[str, Any] = {
        "latency_ms": 5.0,
        "latency_sd": 1.0,
        "ttft_ms": 2.0,
        "ttft_sd": 0.5,
        "tokens": 12.0,
        "tokens_sd": 2.0,
    }
    models = [
        SimulatorModel("base", **fast),
        SimulatorModel("cand", **fast),
        SimulatorModel("hanger", hang=True, hang_s=60.0),
        SimulatorModel("broken", error_rate=1.0, midstream_error_share=0.0, **fast),
        SimulatorModel("midbreak", error_rate=1.0, midstream_error_share=1.0, **fast),
        SimulatorModel(
            "slowstream",
            latency_ms=4000,
            latency_sd=1,
            ttft_ms=10,
            ttft_sd=1,
            tokens=80,
            tokens_sd=1,
            chunk_tokens=1,
        ),
    ]
    with SimulatorProcess(models) as sim:
        yield sim.url + "/v1"


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


def experiment(
    route: str,
    variants: list[VariantConfig],
    mode: str = "ab",
    status: str = "running",
    exp_id: int = 1,
    **kw: Any,
) -> ExperimentConfig:
    return ExperimentConfig(
        id=exp_id,
        name=f"exp-{route}",
        route=route,
        mode=mode,
        status=status,
        salt="s-" + route,
        variants=tuple(variants),
        **kw,
    )


def static_source(
    experiments: list[ExperimentConfig],
    upstreams: list[UpstreamConfig],
    keys: frozenset[str] = frozenset(),
    feedback_kinds: frozenset[str] = frozenset(),
) -> StaticConfigSource:
    return StaticConfigSource(
        build_snapshot(
            experiments, upstreams, keys, version=secrets.token_hex(4), feedback_kinds=feedback_kinds
        )
    )


class Resp:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = body
        self.text = body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def http(
    method: str,
    url: str,
    json_body: Any = None,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Resp:
    """A plain HTTP/1.1 call with the standard library (one connection per call)."""
    parts = urllib.parse.urlsplit(url)
    conn = httpclient.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    hdrs = dict(headers or {})
    if json_body is not None:
        content = json.dumps(json_body).encode()
        hdrs.setdefault("content-type", "application/json")
    try:
        conn.request(
            method, parts.path + (f"?{parts.query}" if parts.query else ""), body=content, headers=hdrs
        )
        r = conn.getresponse()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


#: Asks the gateway to name the arm that answered (blinded by default): these tests read it.
SHOW_VARIANT = {"X-Liftgate-Show-Variant": "true"}


def post(url: str, json_body: Any = None, **kw: Any) -> Resp:
    """POST, asking to see the variant (``headers`` given are added to that)."""
    kw["headers"] = {**SHOW_VARIANT, **(kw.get("headers") or {})}
    return http("POST", url, json_body, **kw)


def get(url: str, **kw: Any) -> Resp:
    return http("GET", url, **kw)


class GatewayProcess:
    """``python -m gateway`` as a real process (config from PostgreSQL; no Kafka: events are
    counted and dropped), for what only a separate process shows: its memory, its timeouts."""

    def __init__(self, database_url: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("LIFTGATE_KAFKA_BOOTSTRAP", "PROMETHEUS_MULTIPROC_DIR")
            },
            "LIFTGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "LIFTGATE_DATABASE_URL": database_url,
            "LIFTGATE_LOG_LEVEL": "warning",
            "LIFTGATE_REFRESH_INTERVAL_S": "0.2",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GatewayProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--port", str(self.port), "--workers", "1"],
            env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError("gateway process did not start")
            time.sleep(0.05)

    def rss(self) -> int:
        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class HasRss(Protocol):
    def rss(self) -> int: ...


class PeakRss:
    """Samples a process's RSS in a background thread; ``peak`` is the highest seen."""

    def __init__(self, gateway: HasRss, every_s: float = 0.01) -> None:
        self.gateway = gateway
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.gateway.rss())
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakRss:
        self.peak = self.gateway.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.peak = max(self.peak, self.gateway.rss())


def refused(url: str, reason: str) -> float:
    """``liftgate_gateway_refused_total{reason=...}`` as the gateway at ``url`` reports it."""
    prefix = f'liftgate_gateway_refused_total{{reason="{reason}"}} '
    for line in get(url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0
