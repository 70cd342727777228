"""The analytics service: FastAPI app factory, lifespan, and background workers.

``create_app(settings)`` builds the app; the lifespan creates the database engine and
starts the background workers, each a thread that runs until its stop event is set:

- the snapshotter (every running experiment, every ``snapshot_interval_s``);
- the Kafka consumer, when ``LIFTGATE_KAFKA_BOOTSTRAP`` is set (and
  ``LIFTGATE_ANALYTICS_CONSUMER`` is not false);
- the rollout controller (:func:`controller_worker`);
- the content retention job (``analytics.service.datasets.retention_worker``);
- the compaction of ``rl_rollups`` (:func:`rl_compaction_worker`);
- anything else listed in :func:`default_workers`: a factory
  ``(ServiceContext) -> BackgroundWorker | None``.

The dashboard (``analytics.web``) is mounted under ``/dashboard`` by :func:`_mount_dashboard`.

Access (``analytics.service.access`` over ``control.auth``): reads need a credential of any
role (unless ``LIFTGATE_READ_ACCESS=open``), changes an operator or an admin; every request
first passes ``analytics.service.guard`` (path, body size and time, the credential and its
CSRF token before any body of a change is read).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy import Connection, Engine, create_engine
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from analytics.report.assembly import ReportOptions
from analytics.report.snapshots import Snapshotter
from analytics.rollout import view
from analytics.rollout.settings import make_controller
from analytics.service import (
    api,
    data_quality_api,
    datasets,
    examples_api,
    login,
    notifications_api,
    offline_gate_api,
    rollout_api,
)
from analytics.service.access import Access, require_operator, require_read, require_read_page
from analytics.service.context import BackgroundWorker, ServiceContext, WorkerFactory
from analytics.service.datasets import retention_worker
from analytics.service.guard import RequestGuard
from analytics.service.settings import AnalyticsSettings
from analytics.service.telemetry import ServiceMetrics
from control import api as control_api
from control import notify_api
from control.auth import Authenticator
from control.plane import ControlPlane
from control.users import LockoutPolicy

log = logging.getLogger(__name__)

WORKER_JOIN_TIMEOUT_S = 10.0


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
    # Imported here: the consumer pulls in a Kafka client, which the service needs only then.
    from analytics.ingest.consumer import ConsumerMetrics, run_consumer

    settings = ctx.settings
    # The consumer's metrics go on the service's registry, so /metrics shows them.
    metrics = ConsumerMetrics(registry=ctx.metrics.registry)
    return BackgroundWorker("consumer", lambda stop: run_consumer(settings, stop, metrics))


def controller_worker(ctx: ServiceContext) -> BackgroundWorker | None:
    """The rollout controller (``python -m analytics.rollout`` runs it alone)."""
    settings = ctx.settings.rollout
    if not settings.rollout_controller:
        return None
    controller = make_controller(ctx.engine, settings, ctx.metrics.registry)

    def run(stop: threading.Event) -> None:
        controller.run(stop, settings.rollout_tick_s)

    return BackgroundWorker("rollout", run)


def control_plane(ctx: ServiceContext, authenticator: Authenticator | None = None) -> ControlPlane:
    """The admin API's dependencies: this service's engine, the metric catalogue's validation
    and the rollout actions (with the operator as the decision's actor)."""
    from analytics.ingest.rollups import backfill_segments
    from analytics.ingest.write import psycopg_connection
    from analytics.report.catalogue import BUILTINS, parse_spec, spec_dict
    from analytics.rollout import manual
    from analytics.rollout.telemetry import for_registry

    rollout_metrics = for_registry(ctx.metrics.registry)

    def metric_spec(body: Any) -> dict[str, Any]:
        return spec_dict(parse_spec(body))  # MetricError is a ValueError: a 422 with its reason

    def rollout_action(id_or_name: str, action: str, actor: str) -> dict[str, Any]:
        return manual.act(ctx.engine, id_or_name, action, actor, rollout_metrics)

    def segment_backfill(conn: Connection, experiment_id: int, keys: list[str]) -> int:
        with psycopg_connection(conn) as pg:
            return backfill_segments(pg, experiment_id, keys)

    return ControlPlane(
        ctx.settings.admin_token,
        engine=ctx.engine,
        metric_spec=metric_spec,
        builtin_metrics=frozenset(BUILTINS),
        rollout_action=rollout_action,
        segment_backfill=segment_backfill,
        read_token=ctx.settings.read_token,
        auth=authenticator,
        notify=ctx.settings.notify,
    )


def rl_compaction_worker(ctx: ServiceContext) -> BackgroundWorker | None:
    """Every ``rl_compact_interval_s``: ``rl_rollups``' appended rows summed into one row per
    key (``analytics.ingest.rollups.compact_all_rl_rollups``), at most one interval's work per
    run, so the report's RL-risks section reads about a row per key instead of one per
    response and thumb."""
    interval = ctx.settings.rl_compact_interval_s
    if interval <= 0:
        return None
    from analytics.ingest.rollups import compact_all_rl_rollups
    from analytics.ingest.write import psycopg_connection

    rows, ok, failed = (
        ctx.metrics.rl_compacted_rows,
        ctx.metrics.rl_compaction_runs.labels("ok"),
        ctx.metrics.rl_compaction_runs.labels("error"),
    )

    def run(stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                with psycopg_connection(ctx.engine) as pg:
                    moved = compact_all_rl_rollups(pg, deadline=time.monotonic() + interval)
            except Exception:  # retried at the next tick; the service keeps serving
                failed.inc()
                log.exception("rl_rollups compaction failed")
                continue
            ok.inc()
            rows.inc(moved)
            if moved:
                log.info("rl_rollups: %d appended rows compacted", moved)

    return BackgroundWorker("rl-compaction", run)


def notifier_worker(ctx: ServiceContext) -> BackgroundWorker | None:
    """Webhook deliveries from the notification outbox (``control.webhook_sender``)."""
    if not ctx.settings.notify.worker:
        return None
    from control.webhook_sender import Notifier

    return BackgroundWorker("notifier", Notifier(ctx.engine, ctx.settings.notify).run)


def default_workers() -> list[WorkerFactory]:
    """Background workers of ``python -m analytics`` (add new ones here)."""
    return [
        snapshotter_worker,
        consumer_worker,
        controller_worker,
        retention_worker,
        rl_compaction_worker,
        notifier_worker,
    ]


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
    """Mount ``analytics.web`` (the dashboard pages) under /dashboard when it exists, behind
    the sign-in page (``analytics.service.login``)."""
    app.include_router(login.router)
    if importlib.util.find_spec("analytics.web") is None:
        return
    web = importlib.import_module("analytics.web")
    router = getattr(web, "router", None)
    if router is None:
        router = importlib.import_module("analytics.web.pages").router
    app.include_router(router, dependencies=[Depends(require_read_page)])  # paths start with /dashboard


def _mount_docs(app: FastAPI) -> None:
    """The OpenAPI document and its Swagger UI, for readers only."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_read)])
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(require_read_page)])
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="liftgate analytics API")


def create_app(
    settings: AnalyticsSettings,
    *,
    workers: Sequence[WorkerFactory] | None = None,
    metrics: ServiceMetrics | None = None,
) -> FastAPI:
    service_metrics = metrics if metrics is not None else ServiceMetrics()
    factories = list(default_workers() if workers is None else workers)
    engine_box: list[Engine] = []

    def current_engine() -> Engine:
        if not engine_box:
            raise RuntimeError("the service's database engine is created by its lifespan")
        return engine_box[0]

    authenticator = Authenticator(settings.admin_token, settings.read_token, current_engine)
    access = Access(
        authenticator,
        settings.read_access,
        settings.session_ttl_s,
        LockoutPolicy(settings.login_max_failures, settings.login_lockout_s),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # hide_parameters: database errors never carry the statement's values (they reach logs).
        engine = create_engine(
            settings.database_url, pool_size=5, max_overflow=10, pool_pre_ping=True, hide_parameters=True
        )
        ctx = ServiceContext(
            settings, engine, service_metrics, ReportOptions.from_settings(settings, rollout=view.report_part)
        )
        engine_box[:] = [engine]
        app.state.ctx = ctx
        app.state.control = control_plane(ctx, authenticator)
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

    app = FastAPI(
        title="liftgate analytics", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.access = access
    app.add_middleware(
        RequestGuard,
        access=access,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
    )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        # The field's path inside the body; an error about the body itself (empty, not an
        # object) names the body.
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:
        if isinstance(exc, ClientDisconnect):  # gone, or cut off by the request guard: no one to answer
            return Response(status_code=499)
        log.exception("unhandled error: %s", type(exc).__name__)
        return JSONResponse({"detail": "internal error"}, status_code=500)

    app.include_router(api.router)
    app.include_router(rollout_api.router, dependencies=[Depends(require_read)])
    app.include_router(offline_gate_api.router, dependencies=[Depends(require_read)])
    app.include_router(notifications_api.router, dependencies=[Depends(require_read)])
    # Examples are users' prompts and the models' answers (raw content): operators and admins
    # only, not the read token or a viewer (docs/security.md).
    app.include_router(examples_api.router, dependencies=[Depends(require_operator)])
    app.include_router(data_quality_api.router, dependencies=[Depends(require_read)])
    app.include_router(datasets.router())
    app.include_router(control_api.router)
    app.include_router(control_api.legacy_router)
    app.include_router(notify_api.router)
    _mount_dashboard(app)
    _mount_docs(app)
    return app
