"""The gateway application: ``create_app(settings, sink, ...)``.

Two layers: :class:`GatewayApp` is the ASGI entry point; it sends ``POST`` to the three
completion paths straight to :class:`gateway.proxy.CompletionProxy` (no router, no
middleware, no pydantic) and everything else — models, feedback, health, metrics, admin —
to a FastAPI app. The FastAPI lifespan builds every long-lived object (upstream sessions,
snapshot loader, shadow workers, sink) and tears it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.requests import Request

from gateway import errors
from gateway.config_source import ConfigSource, DatabaseConfigSource, SnapshotHolder
from gateway.metrics import GatewayMetrics
from gateway.proxy import CompletionProxy, Receive, Scope, Send, send_json
from gateway.recorder import Recorder
from gateway.settings import GatewaySettings
from gateway.shadow import ShadowMirror
from gateway.sink import EventSink
from gateway.snapshot import Snapshot
from gateway.upstreams import UpstreamPool

log = logging.getLogger(__name__)

HOT_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


@dataclass
class Runtime:
    """The long-lived objects of one gateway process (built in the lifespan)."""

    settings: GatewaySettings
    sink: EventSink
    metrics: GatewayMetrics
    source: ConfigSource
    holder: SnapshotHolder
    pool: UpstreamPool = field(default_factory=UpstreamPool)
    recorder: Recorder | None = None
    shadow: ShadowMirror | None = None
    proxy: CompletionProxy | None = None
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> Snapshot:
        return self.holder.current


class GatewayApp:
    """ASGI entry: hot paths to the raw proxy, the rest to FastAPI."""

    def __init__(self, api: FastAPI, runtime: Runtime) -> None:
        self.api = api
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = HOT_PATHS.get(scope["path"])
            proxy = self.runtime.proxy
            if endpoint is not None and proxy is not None:
                try:
                    await proxy(scope, receive, send, endpoint)
                except Exception:
                    log.exception("unexpected error in the proxy")
                    with contextlib.suppress(Exception):  # fails harmlessly if the response started
                        await send_json(send, 500, errors.error_body("Internal error.", "server_error"), [])
                return
        await self.api(scope, receive, send)


def create_app(
    settings: GatewaySettings,
    sink: EventSink,
    *,
    config_source: ConfigSource | None = None,
    metrics: GatewayMetrics | None = None,
) -> GatewayApp:
    """Build the gateway; nothing connects until the lifespan starts."""
    from gateway.admin import admin_router
    from gateway.public import public_router

    source = config_source if config_source is not None else DatabaseConfigSource(settings.database_url)
    gm = metrics if metrics is not None else GatewayMetrics()
    pool = UpstreamPool()

    def on_change(snap: Snapshot) -> None:
        pool.sync(snap.upstreams)
        gm.variant_weight.clear()
        for route in snap.routes.values():
            exp = route.experiment
            for name, share in route.layout.shares.items():
                gm.variant_weight.labels(route.route, exp.name, name).set(
                    share if route.active else float(name == route.control.name)
                )
            if exp.rollout_stage is not None:
                gm.rollout_stage.labels(route.route, exp.name).set(exp.rollout_stage)

    def on_tick(ok: bool) -> None:
        gm.config_reloads.labels("ok" if ok else "error").inc()
        gm.config_age.set(time.monotonic() - holder.loaded_at if holder.loaded_at else -1)
        with contextlib.suppress(Exception):
            gm.update_sink(sink.stats())

    holder = SnapshotHolder(source, settings.refresh_interval_s, on_change=on_change, on_tick=on_tick)
    runtime = Runtime(settings=settings, sink=sink, metrics=gm, source=source, holder=holder, pool=pool)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await sink.start()
        recorder = Recorder(sink, gm, memory=settings.feedback_memory)
        runtime.recorder = recorder
        runtime.shadow = ShadowMirror(
            runtime.pool, recorder, gm, settings.shadow_concurrency, settings.shadow_queue_size
        )
        runtime.shadow.start()
        try:
            await runtime.holder.refresh()
        except Exception as exc:  # start anyway; /readyz says not ready until a snapshot loads
            log.warning(
                "initial config load failed: %s: %s", type(exc).__name__, (str(exc) or "").split("\n")[0]
            )
        refresher = asyncio.get_running_loop().create_task(runtime.holder.run())
        runtime.proxy = CompletionProxy(runtime.snapshot, runtime.pool, recorder, runtime.shadow)
        # Everything built so far lives as long as the process: move it out of the cyclic
        # GC's reach so full collections stay short on the request path.
        gc.freeze()
        try:
            yield
        finally:
            runtime.proxy = None
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
            await runtime.shadow.close()
            await runtime.pool.close()
            await sink.close()
            dispose = getattr(source, "dispose", None)
            if dispose is not None:
                dispose()
            admin_engine = runtime.extra.pop("admin_engine", None)
            if admin_engine is not None:
                admin_engine.dispose()

    api = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    api.state.runtime = runtime

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        )
        if request.url.path.startswith("/v1/"):
            return JSONResponse(errors_json(reasons), status_code=400)
        return JSONResponse({"detail": reasons or "invalid request"}, status_code=422)

    @api.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(
            {"error": {"message": "Internal error.", "type": "server_error", "param": None, "code": None}},
            status_code=500,
        )

    api.include_router(public_router)
    api.include_router(admin_router)
    return GatewayApp(api, runtime)


def errors_json(message: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request",
        }
    }
