"""The analytics service: FastAPI app factory, lifespan, and background workers.

``create_app(settings)`` builds the app; the lifespan creates the database engine and
starts the background workers, each a thread that runs until its stop event is set:

- the snapshotter (every running experiment, every ``snapshot_interval_s``);
- the Kafka consumer, when ``LIFTGATE_KAFKA_BOOTSTRAP`` is set (and
  ``LIFTGATE_ANALYTICS_CONSUMER`` is not false);
- the rollout controller (``analytics.rollout.service.controller_worker``);
- anything else listed in :func:`default_workers`: a factory
  ``(ServiceContext) -> BackgroundWorker | None``.

The dashboard (``analytics.web``) is mounted under ``/dashboard`` by :func:`_mount_dashboard`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Connection, Engine, create_engine
from starlette.exceptions import HTTPException as StarletteHTTPException

from analytics.report import ReportOptions, build_report
from analytics.report_schema import Report
from analytics.service_metrics import ServiceMetrics
from analytics.settings import AnalyticsSettings
from analytics.snapshot import Snapshotter

log = logging.getLogger(__name__)

WORKER_JOIN_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class BackgroundWorker:
    """A long-running job: ``run(stop)`` must return soon after ``stop`` is set."""

    name: str
    run: Callable[[threading.Event], None]


@dataclass(slots=True)
class ServiceContext:
    """What the service's parts share; built in the lifespan, kept on ``app.state.ctx``."""

    settings: AnalyticsSettings
    engine: Engine
    metrics: ServiceMetrics
    options: ReportOptions
    threads: dict[str, threading.Thread] = field(default_factory=dict)

    def build(self, conn: Connection, experiment_id: int, now: datetime | None = None) -> Report:
        return build_report(conn, experiment_id, now=now, options=self.options)


WorkerFactory = Callable[[ServiceContext], BackgroundWorker | None]


def snapshotter_worker(ctx: ServiceContext) -> BackgroundWorker | None:
    if ctx.settings.snapshot_interval_s <= 0:
        return None

    def observe(seconds: float, ok: bool) -> None:
        ctx.metrics.build_seconds.labels("snapshotter").observe(seconds)
        ctx.metrics.snapshots.labels("ok" if ok else "error").inc()

    snap = Snapshotter(
        ctx.engine,
        ctx.build,
        ctx.settings.snapshot_interval_s,
        on_built=observe,
        keep_full_s=ctx.settings.snapshot_keep_full_s,
    )
    return BackgroundWorker("snapshotter", snap.run)


def consumer_worker(ctx: ServiceContext) -> BackgroundWorker | None:
    if not ctx.settings.kafka_bootstrap or not ctx.settings.analytics_consumer:
        return None
    # Imported here: the consumer pulls in kafka-python, which the service needs only then.
    from analytics.consumer import ConsumerMetrics, run_consumer

    settings = ctx.settings
    # The consumer's metrics go on the service's registry, so /metrics shows them.
    metrics = ConsumerMetrics(registry=ctx.metrics.registry)
    return BackgroundWorker("consumer", lambda stop: run_consumer(settings, stop, metrics))


def default_workers() -> list[WorkerFactory]:
    """Background workers of ``python -m analytics`` (add new ones here)."""
    from analytics.rollout.service import controller_worker

    return [snapshotter_worker, consumer_worker, controller_worker]


def _run_worker(ctx: ServiceContext, worker: BackgroundWorker, stop: threading.Event) -> None:
    gauge = ctx.metrics.worker_up.labels(worker.name)
    gauge.set(1)
    try:
        worker.run(stop)
    except Exception:
        log.exception("background worker %s died", worker.name)
    finally:
        gauge.set(0)


def _mount_dashboard(app: FastAPI) -> None:
    """Mount ``analytics.web`` (the dashboard pages) under /dashboard when it exists."""
    if importlib.util.find_spec("analytics.web") is None:
        return
    web = importlib.import_module("analytics.web")
    mount = getattr(web, "mount", None)
    if callable(mount):
        mount(app)
    elif (router := getattr(web, "router", None)) is not None:
        app.include_router(router)  # its paths already start with /dashboard


def create_app(
    settings: AnalyticsSettings,
    *,
    workers: Sequence[WorkerFactory] | None = None,
    metrics: ServiceMetrics | None = None,
) -> FastAPI:
    from analytics import api
    from analytics.rollout import api as rollout_api

    service_metrics = metrics if metrics is not None else ServiceMetrics()
    factories = list(default_workers() if workers is None else workers)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_engine(settings.database_url, pool_size=5, max_overflow=10, pool_pre_ping=True)
        ctx = ServiceContext(settings, engine, service_metrics, ReportOptions.from_settings(settings))
        app.state.ctx = ctx
        stop = threading.Event()
        for factory in factories:
            worker = factory(ctx)
            if worker is None:
                continue
            thread = threading.Thread(
                target=_run_worker, args=(ctx, worker, stop), name=f"analytics-{worker.name}", daemon=True
            )
            thread.start()
            ctx.threads[worker.name] = thread
            log.info("started background worker %s", worker.name)
        try:
            yield
        finally:
            stop.set()
            for name, thread in ctx.threads.items():
                thread.join(WORKER_JOIN_TIMEOUT_S)
                if thread.is_alive():
                    log.warning("background worker %s did not stop within %ss", name, WORKER_JOIN_TIMEOUT_S)
            engine.dispose()

    app = FastAPI(title="liftgate analytics", lifespan=lifespan)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error: %s", type(exc).__name__)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    app.include_router(api.router)
    app.include_router(rollout_api.router)
    _mount_dashboard(app)
    return app
