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
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from contracts import redaction
from contracts.config_rules import key_problem, url_problem
from contracts.ngrams import NgramKey
from control.auth import admin_denial
from gateway import errors
from gateway.auth import client_key_digest, header, peer
from gateway.bodies import (
    CLOSE,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    content_length,
    is_chunked,
    read_body,
    refusal_headers,
    replay,
)
from gateway.category import CategoryRules, default_rules
from gateway.config_source import ConfigSource, DatabaseConfigSource, SnapshotHolder
from gateway.feedback import parse_kinds
from gateway.judge import DEFAULT_RUBRIC, JudgeConfig, JudgeSampler
from gateway.limits import ConcurrencyLimit, RateLimit
from gateway.ngrams import NgramConfig, NgramSampler
from gateway.proxy import CompletionProxy, send_json
from gateway.recorder import Recorder
from gateway.server import read_limits
from gateway.settings import GatewaySettings
from gateway.shadow import ShadowMirror
from gateway.sink import EventSink
from gateway.snapshot import Snapshot, UpstreamConfig
from gateway.telemetry import GatewayMetrics
from gateway.upstreams import UpstreamPool, make_client

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
    judge: JudgeSampler | None = None
    ngrams: NgramSampler | None = None
    proxy: CompletionProxy | None = None
    # Custom feedback kinds the settings declare (metric definitions declare more, per snapshot).
    feedback_kinds: frozenset[str] = frozenset()
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> Snapshot:
        return self.holder.current


class GatewayApp:
    """ASGI entry: hot paths to the raw proxy, the rest to FastAPI behind one guard.

    The guard decides from the headers alone — client key on ``/v1/*``, admin token on
    ``/admin/*``, per-client feedback rate, declared body size — and then reads the body
    within its path's limit before FastAPI sees it. A refusal before the body is read closes
    the connection when the declared body is large or chunked, so such an upload is never
    read; a small one is discarded as it arrives and the connection kept (``bodies.DRAIN_BYTES``).
    """

    def __init__(self, api: FastAPI, runtime: Runtime) -> None:
        self.api = api
        self.runtime = runtime
        s = runtime.settings
        self.read_limits = read_limits(s)  # read by serving.protocol (gateway.server)
        self.keys_required = s.client_keys == "required"
        self.feedback_rate = RateLimit(s.feedback_rate, s.feedback_burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST":
                endpoint = HOT_PATHS.get(scope["path"])
                proxy = self.runtime.proxy
                if endpoint is not None and proxy is not None:
                    try:
                        await proxy(scope, receive, send, endpoint)
                    except Exception:
                        log.exception("unexpected error in the proxy")
                        with contextlib.suppress(Exception):  # fails harmlessly if the response started
                            await send_json(
                                send, 500, errors.error_body("Internal error.", "server_error"), []
                            )
                    return
            await self._guarded(scope, receive, send)
            return
        await self.api(scope, receive, send)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        settings = self.runtime.settings
        refused = self.runtime.metrics.refused
        openai = path.startswith("/v1/")
        limit = settings.max_admin_body_bytes
        length = content_length(headers)
        end = refusal_headers(length, is_chunked(headers))  # of a refusal before the body is read
        if openai:
            client = peer(scope)
            if self.keys_required:
                digest = client_key_digest(header(headers, b"authorization"))
                if digest is None or digest not in self.runtime.snapshot().api_key_hashes:
                    refused["unauthorized"].inc()
                    await send_json(send, *errors.unauthorized(), end)
                    return
                client = digest
            if path == "/v1/feedback":
                limit = settings.max_feedback_body_bytes
                wait = self.feedback_rate.take(client)
                if wait:
                    refused["rate_limited"].inc()
                    retry = (b"retry-after", b"%d" % max(1, math.ceil(wait)))
                    msg = "Too many feedback calls for this client; retry later."
                    await send_json(send, *errors.rate_limited(msg), [retry, *end])
                    return
        elif path.startswith("/admin"):
            denial = admin_denial(header(headers, b"authorization"), settings.admin_token)
            if denial is not None:
                extra = [(b"www-authenticate", b"Bearer")] if denial[0] == 401 else []
                await send_json(send, denial[0], orjson.dumps({"detail": denial[1]}), [*extra, *end])
                return
        if length > limit:
            await self._too_large(send, openai, limit)
            return
        try:
            body = await read_body(receive, limit)
        except BodyTooLarge:
            await self._too_large(send, openai, limit)
            return
        except ClientGone:
            return
        await self.api(scope, replay(body, receive), send)

    async def _too_large(self, send: Send, openai: bool, limit: int) -> None:
        self.runtime.metrics.refused["body_too_large"].inc()
        if openai:
            await send_json(send, *errors.too_large(limit), [CLOSE])
        else:
            detail = orjson.dumps({"detail": f"request body too large (the limit is {limit} bytes)"})
            await send_json(send, 413, detail, [CLOSE])


def create_app(
    settings: GatewaySettings,
    sink: EventSink,
    *,
    config_source: ConfigSource | None = None,
    metrics: GatewayMetrics | None = None,
) -> GatewayApp:
    """Build the gateway; nothing connects until the lifespan starts."""
    from control.api import router as admin_router
    from control.plane import ControlPlane
    from gateway.public import public_router

    source = config_source if config_source is not None else DatabaseConfigSource(settings.database_url)
    # Compiled once here: a bad rules file stops the gateway at start, never a request.
    categories = (
        CategoryRules.load(Path(settings.category_rules)) if settings.category_rules else default_rules()
    )
    judge_config = _judge_config(settings)
    content_key = _content_key(settings)
    ngram_config = _ngram_config(settings, content_key)
    gm = metrics if metrics is not None else GatewayMetrics()
    pool = UpstreamPool()

    def apply(snap: Snapshot) -> dict[str, str]:
        problems = pool.sync(snap.upstreams)
        gm.variant_weight.clear()
        for route in snap.routes.values():
            exp = route.experiment
            for name, share in route.layout.shares.items():
                gm.variant_weight.labels(route.route, exp.name, name).set(
                    share if route.active else float(name == route.control.name)
                )
            if exp.rollout_stage is not None:
                gm.rollout_stage.labels(route.route, exp.name).set(exp.rollout_stage)
        return problems

    def on_tick(ok: bool) -> None:
        gm.flush()  # batched counts reach the counters at least this often
        gm.config_reloads.labels("ok" if ok else "error").inc()
        gm.config_age.set(time.monotonic() - holder.loaded_at if holder.loaded_at else -1)
        with contextlib.suppress(Exception):
            gm.update_sink(sink.stats())

    holder = SnapshotHolder(source, settings.refresh_interval_s, apply=apply, on_tick=on_tick)
    runtime = Runtime(
        settings=settings, sink=sink, metrics=gm, source=source, holder=holder, pool=pool,
        feedback_kinds=parse_kinds(settings.feedback_kinds),
    )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await sink.start()
        recorder = Recorder(sink, gm, memory=settings.feedback_memory, content_key=content_key)
        runtime.recorder = recorder
        runtime.shadow = ShadowMirror(
            runtime.pool,
            recorder,
            gm,
            settings.shadow_concurrency,
            settings.shadow_queue_size,
            settings.shadow_queue_bytes,
        )
        runtime.shadow.start()
        if judge_config is not None:
            upstream = UpstreamConfig(
                name=judge_config.name,
                base_url=settings.judge_url or "",
                api_key=settings.judge_api_key,
                timeout_s=settings.judge_timeout_s,
                max_connections=judge_config.concurrency,
            )
            redaction.remember(settings.judge_api_key)
            runtime.judge = JudgeSampler(judge_config, make_client(upstream), recorder, gm)
            runtime.judge.start()
            runtime.shadow.judge = runtime.judge
        if ngram_config is not None:
            runtime.ngrams = NgramSampler(ngram_config, recorder, gm)
            runtime.ngrams.start()
        try:
            await runtime.holder.refresh()
        except Exception as exc:  # start anyway; /readyz says not ready until a snapshot loads
            log.warning(
                "initial config load failed: %s: %s", type(exc).__name__, (str(exc) or "").split("\n")[0]
            )
        refresher = asyncio.get_running_loop().create_task(runtime.holder.run())
        runtime.proxy = CompletionProxy(
            runtime.snapshot,
            runtime.pool,
            recorder,
            runtime.shadow,
            keys_required=settings.client_keys == "required",
            max_body=settings.max_body_bytes,
            concurrency=ConcurrencyLimit(settings.client_max_concurrency),
            categories=categories,
            judge=runtime.judge,
            ngrams=runtime.ngrams,
        )
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
            if runtime.ngrams is not None:
                await runtime.ngrams.close()
            if runtime.judge is not None:
                await runtime.judge.close()
                await runtime.judge.client.http.close()
                await runtime.judge.client.session.close()
            await runtime.pool.close()
            await sink.close()
            dispose = getattr(source, "dispose", None)
            if dispose is not None:
                dispose()
            control.dispose()

    api = FastAPI(
        title="liftgate gateway",
        summary="Admin API and public non-completion routes of the liftgate gateway",
        description=(
            "Admin routes need `Authorization: Bearer $LIFTGATE_ADMIN_TOKEN`; `/v1/*` routes need a "
            "client API key when `LIFTGATE_CLIENT_KEYS=required`. The OpenAI-compatible completion "
            "routes (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) are served before "
            "this application and are not described here. Limits: docs/operations.md."
        ),
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served, behind the admin token, at /admin/openapi.json
    )
    api.state.runtime = runtime
    # The control plane's configuration routes, kept at the gateway's /admin for existing
    # clients: the same module (auth, lock, audit) the analytics service serves at its /admin.
    control = ControlPlane(settings.admin_token, database_url=settings.database_url)
    api.state.control = control

    @api.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        )
        if request.url.path.startswith("/v1/"):
            return JSONResponse(errors_json(reasons), status_code=400)
        return JSONResponse({"detail": reasons or "invalid request"}, status_code=422)

    @api.exception_handler(SQLAlchemyError)
    async def _database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        # Never the exception's text: it carries the statement's parameters and the
        # database's "failing row" detail (an upstream's API key, say). Inputs are validated
        # before they reach the database; this is the backstop.
        orig = getattr(exc, "orig", None)
        sqlstate = getattr(orig, "sqlstate", None) or "-"
        log.error(
            "database error on %s: %s (SQLSTATE %s)", request.url.path, type(orig or exc).__name__, sqlstate
        )
        if isinstance(exc, IntegrityError):
            return JSONResponse({"detail": "conflicts with an existing row or a constraint"}, status_code=409)
        if isinstance(exc, DBAPIError) and str(sqlstate).startswith("22"):  # data exception
            return JSONResponse({"detail": "a value is not acceptable to the database"}, status_code=422)
        if (isinstance(exc, DBAPIError) and exc.connection_invalidated) or str(sqlstate).startswith("08"):
            return JSONResponse({"detail": "the database is unavailable; retry later"}, status_code=503)
        return JSONResponse({"detail": "database error"}, status_code=500)

    @api.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody is listening any more

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


def _content_key(settings: GatewaySettings) -> NgramKey | None:
    """The deployment's content key (content logging ``hashed``: the digests and the n-gram
    hashes), or None when unset (then ``hashed`` stores nothing). A weak key stops the gateway
    at start; the key is masked in every log record from here on."""
    if not settings.ngram_key:
        return None
    redaction.remember(settings.ngram_key)
    return NgramKey(settings.ngram_key)


def _ngram_config(settings: GatewaySettings, key: NgramKey | None) -> NgramConfig | None:
    """The n-gram sampler's config, or None without a key or rate (then no n-gram is hashed)."""
    if key is None or settings.ngram_sample_rate <= 0.0:
        return None
    return NgramConfig(key=key, sample_rate=settings.ngram_sample_rate, queue_size=settings.ngram_queue_size)


def _judge_config(settings: GatewaySettings) -> JudgeConfig | None:
    """The judge sampler's config, or None when no judge is configured (the default)."""
    if not settings.judge_url or settings.judge_sample_rate <= 0.0:
        return None
    if not settings.judge_score_min < settings.judge_score_max:
        raise ValueError("judge_score_min must be below judge_score_max")
    problem = url_problem(settings.judge_url) or (
        key_problem(settings.judge_api_key) if settings.judge_api_key else None
    )
    if problem is not None:
        raise ValueError(f"judge: {problem}")
    return JudgeConfig(
        base_url=settings.judge_url,
        model=settings.judge_model,
        name=settings.judge_name,
        sample_rate=settings.judge_sample_rate,
        rubric=settings.judge_rubric or DEFAULT_RUBRIC,
        score_min=settings.judge_score_min,
        score_max=settings.judge_score_max,
        concurrency=settings.judge_concurrency,
        queue_size=settings.judge_queue_size,
        queue_bytes=settings.judge_queue_bytes,
    )
