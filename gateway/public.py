"""The non-hot endpoints: ``/v1/models``, ``/v1/feedback``, ``/healthz``, ``/readyz``, ``/metrics``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contracts.events import FEEDBACK_KINDS, FeedbackEvent
from contracts.ids import uuid7
from gateway import errors
from gateway.feedback import SCHEMA as FEEDBACK_SCHEMA
from gateway.feedback import undefined_kind, validate_feedback
from gateway.inputs import MAX_DEPTH, too_deep
from gateway.snapshot import RouteConfig, Snapshot
from gateway.upstreams import UpstreamPool

public_router = APIRouter()

_FALLBACK_MODES = ("ab", "rollout")
_NOT_LOADED = "The gateway has not loaded its configuration yet; retry shortly."
_UNKNOWN_ID = (
    "This gateway has not served this request id among its last {} calls. The feedback is "
    "stored, and counted for a variant only once its interaction is stored (ingest joins by "
    "request id); feedback that never joins is reported by the analytics service "
    "(GET /api/data-quality)."
)
_PROBE_TTL_S = 2.0


def _error(status: int, body: bytes) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _runtime(request: Request) -> Any:
    return request.app.state.runtime


@public_router.get("/v1/models")
async def models(request: Request) -> Response:
    """The routes this gateway serves (the client key is checked before the route runs)."""
    snap = _runtime(request).snapshot()
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "liftgate"} for name in sorted(snap.routes)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


def _bad(request: Request, message: str, param: str | None = None) -> Response:
    _runtime(request).metrics.refused["invalid_request"].inc()
    return _error(*errors.bad_request(message, param))


@public_router.post(
    "/v1/feedback",
    status_code=202,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": FEEDBACK_SCHEMA}}}
    },
)
async def feedback(request: Request) -> Response:
    """A user's signal about one response (see ``gateway.feedback`` for the value rules)."""
    raw = await request.body()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _bad(request, "Request body is not valid JSON.")
    if isinstance(data, dict) and too_deep(raw, data):
        return _bad(request, f"Request body is nested too deeply (the limit is {MAX_DEPTH} levels).")
    checked = validate_feedback(data)
    if isinstance(checked, str):
        return _bad(request, checked)
    rid, kind, value, unit, tags = checked
    rt = _runtime(request)
    if kind not in FEEDBACK_KINDS:
        if not rt.holder.loaded_at:
            # Which custom kinds are declared is not known yet: a refusal would be final for
            # a kind that may be valid; a 503 asks the client to retry.
            rt.metrics.refused["not_ready"].inc()
            return _error(503, errors.error_body(_NOT_LOADED, "server_error", "config_not_loaded"))
        why = undefined_kind(kind, rt.snapshot().feedback_kinds, rt.feedback_kinds)
        if why is not None:
            rt.metrics.refused["invalid_request"].inc()
            return _error(
                400, errors.error_body(why, "invalid_request_error", "unknown_feedback_kind", "kind")
            )
    recorder = rt.recorder
    known = recorder.recent.get(rid) if recorder is not None else None
    experiment_id = variant = None
    warnings: list[dict[str, str]] = []
    if known is not None:
        unit = unit or known[0]
        experiment_id, variant = known[1], known[2]
    elif recorder is not None and recorder.memory:
        warnings.append({"code": "unknown_request_id", "message": _UNKNOWN_ID.format(recorder.memory)})
        rt.metrics.feedback_unknown_request.inc()
    event = FeedbackEvent(
        request_id=rid,
        unit_id=unit or "",
        kind=kind,
        value=value,
        experiment_id=experiment_id,
        variant=variant,
        tags=tags,
        event_id=uuid7(),
    )
    rt.recorder.emit(event)
    body = {"status": "accepted", "event_id": event.event_id, "request_id": rid, "warnings": warnings}
    return Response(orjson.dumps(body), status_code=202, media_type="application/json")


@public_router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _probe(session: aiohttp.ClientSession, url: Any, headers: Any) -> bool:
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            await resp.read()
            return resp.status < 500
    except Exception:  # whatever the reason, the upstream cannot be used now
        return False


def route_upstreams(route: RouteConfig) -> frozenset[str]:
    """The upstreams a route's users depend on: its control (or baseline), and each candidate
    with a share of a running A/B or rollout — unless a failed candidate call falls back to
    the control. Shadow candidates never answer a user."""
    needed = {route.control.upstream}
    exp = route.experiment
    if (
        route.active
        and exp.mode != "shadow"
        and not (exp.fallback_to_control and exp.mode in _FALLBACK_MODES)
    ):
        needed.update(
            v.upstream for v in exp.variants if not v.is_control and route.layout.shares.get(v.name, 0.0) > 0
        )
    return frozenset(needed)


async def _probe_all(pool: UpstreamPool, names: set[str]) -> dict[str, bool]:
    clients = {n: pool.clients[n] for n in names if n in pool.clients}
    results = await asyncio.gather(
        *(_probe(c.session, c.urls["models"], c.headers) for c in clients.values())
    )
    return dict(zip(clients, results, strict=True))


def route_problems(
    snap: Snapshot, reachable: dict[str, bool], config_errors: dict[str, str]
) -> dict[str, str | None]:
    """Route -> why it cannot serve now (None: it can)."""
    out: dict[str, str | None] = {}
    for name, route in snap.routes.items():
        reasons = []
        for up in sorted(route_upstreams(route)):
            if up not in reachable:
                why = config_errors.get(up, "no client")
                reasons.append(f"upstream {up!r} cannot be used ({why})")
            elif not reachable[up]:
                reasons.append(f"upstream {up!r} is unreachable")
        out[name] = "; ".join(reasons) or None
    return out


@public_router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 when the config is loaded, events are safe and every route can serve; else 503
    with the reasons. An upstream no route depends on does not count."""
    rt = _runtime(request)
    snap: Snapshot = rt.snapshot()
    loaded = bool(rt.holder.loaded_at) and time.monotonic() - rt.holder.loaded_at < 10
    needed = set().union(*(route_upstreams(r) for r in snap.routes.values()))
    cache = rt.extra.get("probe_cache")
    if cache is None or time.monotonic() - cache[0] > _PROBE_TTL_S or not needed <= cache[1].keys():
        cache = (time.monotonic(), await _probe_all(rt.pool, needed))
        rt.extra["probe_cache"] = cache
    reachable: dict[str, bool] = {n: ok for n, ok in cache[1].items() if n in needed}
    config_errors: dict[str, str] = dict(rt.pool.errors)
    routes = route_problems(snap, reachable, config_errors)
    sink_ok = bool(rt.sink.healthy())
    reasons = [f"route {name!r}: {why}" for name, why in sorted(routes.items()) if why]
    if not loaded:
        reasons.insert(0, "config not loaded (or not refreshed for 10 s)")
    if not sink_ok:
        reasons.append("the event sink is losing events")
    body = {
        "ready": not reasons,
        "reasons": reasons,
        "config_loaded": loaded,
        "routes": {
            name: {"ok": why is None, **({"reason": why} if why else {})} for name, why in routes.items()
        },
        "upstreams": reachable,
        "config_errors": config_errors,
        "sink": {"healthy": sink_ok, **rt.sink.stats()},
    }
    return JSONResponse(body, status_code=200 if not reasons else 503)


@public_router.get("/metrics")
async def metrics(request: Request) -> Response:
    rt = _runtime(request)
    rt.metrics.update_sink(rt.sink.stats())
    content, media = rt.metrics.render()
    return Response(content, media_type=media)
