"""Gateway test helpers: a recording sink, a real simulator process, the gateway in a uvicorn thread."""

from __future__ import annotations

import http.client as httpclient
import json
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from contracts.events import Event, FeedbackEvent, InteractionEvent
from gateway.app import GatewayApp, create_app
from gateway.config_source import ConfigSource, StaticConfigSource
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.snapshot import ExperimentConfig, UpstreamConfig, VariantConfig, build_snapshot
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.known_secrets import secret

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


class GatewayThread:
    """The real app served by uvicorn on a free port in a background thread."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, loop="asyncio")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> GatewayThread:
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


def settings(**kw: Any) -> GatewaySettings:
    base: dict[str, Any] = {
        "admin_token": ADMIN_TOKEN,
        "database_url": "postgresql+psycopg://unused@127.0.0.1:1/x",
    }
    base.update(kw)
    return GatewaySettings(**base)


def start_gateway(sink: MemorySink, source: ConfigSource, **kw: Any) -> GatewayThread:
    app = create_app(settings(**kw), sink, config_source=source, metrics=GatewayMetrics())
    return GatewayThread(app)


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
    experiments: list[ExperimentConfig], upstreams: list[UpstreamConfig], keys: frozenset[str] = frozenset()
) -> StaticConfigSource:
    return StaticConfigSource(build_snapshot(experiments, upstreams, keys, version=secrets.token_hex(4)))


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


def post(url: str, json_body: Any = None, **kw: Any) -> Resp:
    return http("POST", url, json_body, **kw)


def get(url: str, **kw: Any) -> Resp:
    return http("GET", url, **kw)
