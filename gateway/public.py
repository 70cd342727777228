"""The non-hot endpoints: ``/v1/models``, ``/v1/feedback``, ``/healthz``, ``/readyz``, ``/metrics``."""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any

import aiohttp
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contracts.events import FEEDBACK_KINDS, FeedbackEvent
from gateway import errors
from gateway.ids import uuid7
from gateway.routing import api_key_of, key_hash, parse_tags

public_router = APIRouter()

_CUSTOM_KIND = re.compile(r"^[a-z][a-z0-9_.\-]{0,63}$")
_BINARY_KINDS = frozenset(
    {"thumbs_up", "thumbs_down", "regenerate", "copy", "edit", "continued", "task_success"}
)
RATING_RANGE = (0.0, 10.0)


def _error(status: int, body: bytes) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _runtime(request: Request) -> Any:
    return request.app.state.runtime


def _auth_error(request: Request) -> Response | None:
    snap = _runtime(request).snapshot()
    if not snap.api_key_hashes:
        return None
    key = api_key_of(request.headers.get("authorization", "").encode("latin-1"))
    if key is None or key_hash(key) not in snap.api_key_hashes:
        return _error(*errors.unauthorized())
    return None


@public_router.get("/v1/models")
async def models(request: Request) -> Response:
    denied = _auth_error(request)
    if denied is not None:
        return denied
    snap = _runtime(request).snapshot()
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "liftgate"} for name in sorted(snap.routes)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


def _bad(message: str, param: str | None = None) -> Response:
    return _error(*errors.bad_request(message, param))


def validate_feedback(data: Any) -> tuple[str, str, float, str | None, dict[str, str]] | str:
    """(request_id, kind, value, unit_id, tags) or the reason it is invalid."""
    if not isinstance(data, dict):
        return "body must be a JSON object"
    rid = data.get("request_id")
    if not isinstance(rid, str) or not rid or len(rid) > 64:
        return "request_id must be a non-empty string of at most 64 characters"
    kind = data.get("kind")
    if not isinstance(kind, str) or not (kind in FEEDBACK_KINDS or _CUSTOM_KIND.match(kind)):
        return (
            "kind must be one of "
            + ", ".join(sorted(FEEDBACK_KINDS))
            + " or a custom name (lowercase letters, digits, _ . -; at most 64 characters)"
        )
    value = data.get("value", None)
    if value is None:
        if kind == "rating":
            return "value is required for kind 'rating'"
        value = 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "value must be a finite number"
    if kind == "rating" and not RATING_RANGE[0] <= value <= RATING_RANGE[1]:
        return f"rating value must be between {RATING_RANGE[0]:g} and {RATING_RANGE[1]:g}"
    if kind in _BINARY_KINDS and value not in (0, 1):
        return f"value for kind '{kind}' must be 0 or 1"
    unit = data.get("unit_id")
    if unit is not None and (not isinstance(unit, str) or len(unit) > 256):
        return "unit_id must be a string of at most 256 characters"
    tags = data.get("tags", {})
    if isinstance(tags, str):
        tags = parse_tags(tags)
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        return "tags must be an object mapping strings to strings"
    if len(tags) > 16:
        return "at most 16 tags"
    return rid, kind, float(value), unit, {k[:64]: v[:64] for k, v in tags.items()}


@public_router.post("/v1/feedback")
async def feedback(request: Request) -> Response:
    denied = _auth_error(request)
    if denied is not None:
        return denied
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return _bad("Request body is not valid JSON.")
    checked = validate_feedback(data)
    if isinstance(checked, str):
        return _bad(checked)
    rid, kind, value, unit, tags = checked
    rt = _runtime(request)
    known = rt.recorder.recent.get(rid) if rt.recorder is not None else None
    experiment_id = variant = None
    if known is not None:
        unit = unit or known[0]
        experiment_id, variant = known[1], known[2]
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
    return Response(
        orjson.dumps({"status": "accepted", "event_id": event.event_id, "request_id": rid}),
        status_code=202,
        media_type="application/json",
    )


@public_router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _probe(session: aiohttp.ClientSession, url: Any, headers: Any) -> bool:
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            await resp.read()
            return resp.status < 500
    except (TimeoutError, aiohttp.ClientError):
        return False


@public_router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    rt = _runtime(request)
    loaded = bool(rt.holder.loaded_at) and time.monotonic() - rt.holder.loaded_at < 10
    cache = rt.extra.get("probe_cache")
    if cache is None or time.monotonic() - cache[0] > 2.0:
        names = list(rt.pool.clients)
        results = await asyncio.gather(
            *(
                _probe(
                    rt.pool.clients[n].session, rt.pool.clients[n].urls["models"], rt.pool.clients[n].headers
                )
                for n in names
            )
        )
        cache = (time.monotonic(), dict(zip(names, results, strict=True)))
        rt.extra["probe_cache"] = cache
    upstreams: dict[str, bool] = cache[1]
    sink_ok = bool(rt.sink.healthy())
    ready = loaded and sink_ok and all(upstreams.values())
    body = {
        "ready": ready,
        "config_loaded": loaded,
        "routes": len(rt.snapshot().routes),
        "upstreams": upstreams,
        "sink": {"healthy": sink_ok, **rt.sink.stats()},
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@public_router.get("/metrics")
async def metrics(request: Request) -> Response:
    rt = _runtime(request)
    rt.metrics.update_sink(rt.sink.stats())
    content, media = rt.metrics.render()
    return Response(content, media_type=media)
