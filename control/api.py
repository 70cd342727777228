"""The admin HTTP API: one router for every change to liftgate's configuration and rollouts.

Served by the analytics service at ``/admin/...`` (the one admin base URL the CLI and the
dashboard use); the gateway mounts the same router for its configuration routes (see
docs/operations.md), behind its own admin-token-only pre-check.

Every route names the role it needs (:mod:`control.deps` over :mod:`control.auth`, the one
check: 401 without a credential, 403 with a wrong one or too small a role): **viewer** reads
experiments; **operator** creates, edits, starts/pauses/stops experiments, acts on rollouts
and defines metrics (and reads upstreams); **admin** also manages upstreams, client API keys
and users. The caller is the audit actor (``user:<name>``, or ``admin[:<X-Liftgate-Actor>]``
for the bootstrap token). Errors are ``{"detail": reason}``: 404 unknown, 409 wrong state or
conflict, 422 invalid input. Routes:

- ``/admin/upstreams`` (GET, POST), ``/admin/upstreams/{name}`` (GET, PATCH, DELETE);
- ``/admin/experiments`` (GET, POST), ``/admin/experiments/check`` (POST: validate, write
  nothing), ``/admin/experiments/{id_or_name}`` (GET, PATCH),
  ``/admin/experiments/{id_or_name}/start|pause|stop`` (POST);
- ``/admin/experiments/{id_or_name}/rollout/advance|pause|resume|rollback`` (POST);
- ``/admin/experiments/{id_or_name}/segments/backfill`` (POST: recompute declared segments);
- ``/admin/api-keys`` (GET, POST), ``/admin/api-keys/{name}`` (DELETE: revoke);
- ``/admin/metrics`` (POST), ``/admin/metrics/{name}`` (PUT, DELETE);
- ``/admin/me``, ``/admin/users…`` (:mod:`control.users_api`);
- ``/admin/openapi.json``: the serving application's OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import orjson
from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from control import config, experiment_check, users_api
from control import metrics as metric_store
from control.bodies import (
    ApiKeyIn,
    ExperimentIn,
    ExperimentPatch,
    SegmentBackfillIn,
    UpstreamIn,
    UpstreamPatch,
)
from control.deps import Admin, Db, Operator, Plane, Viewer
from control.errors import ControlError
from control.plane import ControlPlane

ROLLOUT_ACTIONS: Final = ("advance", "pause", "resume", "rollback")


async def _json_body(request: Request) -> Any:
    """The request's JSON, parsed by orjson: its nesting limit (1,024) answers 422, where the
    standard library's parser raises RecursionError on ``[[[…`` 50,000 deep."""
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise ControlError(422, f"body: invalid JSON ({exc})") from None


JsonBody = Annotated[Any, Depends(_json_body)]
MetricBody = JsonBody


router = APIRouter(prefix="/admin")


@router.get("/openapi.json", include_in_schema=False)
def openapi_document(request: Request, who: Viewer) -> dict[str, Any]:
    """The OpenAPI document of the application serving this router."""
    document: dict[str, Any] = request.app.openapi()
    return document


# --- upstreams ---------------------------------------------------------------------------


@router.get("/upstreams")
def list_upstreams(who: Operator, db: Db) -> list[dict[str, Any]]:
    return config.list_upstreams(db)


@router.get("/upstreams/{name}")
def get_upstream(name: str, who: Operator, db: Db) -> dict[str, Any]:
    return config.get_upstream(db, name)


@router.post("/upstreams", status_code=201)
def create_upstream(body: UpstreamIn, who: Admin, db: Db) -> dict[str, Any]:
    return config.create_upstream(db, body, who.actor)


@router.patch("/upstreams/{name}")
def update_upstream(name: str, body: UpstreamPatch, who: Admin, db: Db) -> dict[str, Any]:
    return config.update_upstream(db, name, body, who.actor)


@router.delete("/upstreams/{name}", status_code=204)
def delete_upstream(name: str, who: Admin, db: Db) -> None:
    config.delete_upstream(db, name, who.actor)


# --- experiments -------------------------------------------------------------------------


@router.get("/experiments")
def list_experiments(who: Viewer, db: Db) -> list[dict[str, Any]]:
    return config.list_experiments(db)


@router.get("/experiments/{id_or_name}")
def get_experiment(id_or_name: str, who: Viewer, db: Db) -> dict[str, Any]:
    return config.get_experiment(db, id_or_name)


@router.post("/experiments", status_code=201)
def create_experiment(body: ExperimentIn, who: Operator, db: Db) -> dict[str, Any]:
    return config.create_experiment(db, body, who.actor)


@router.post(
    "/experiments/check",
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
    },
)
def check_experiment(who: Operator, plane: Plane, body: JsonBody) -> dict[str, Any]:
    """Validate an experiment (JSON, or ``{"yaml": text}``) exactly as creating it would; writes nothing."""
    return experiment_check.check(plane, body, who.actor)


@router.patch("/experiments/{id_or_name}")
def update_experiment(id_or_name: str, body: ExperimentPatch, who: Operator, db: Db) -> dict[str, Any]:
    return config.update_experiment(db, id_or_name, body, who.actor)


@router.post("/experiments/{id_or_name}/start")
def start_experiment(id_or_name: str, who: Operator, db: Db) -> dict[str, Any]:
    return config.transition(db, id_or_name, "start", who.actor)


@router.post("/experiments/{id_or_name}/pause")
def pause_experiment(id_or_name: str, who: Operator, db: Db) -> dict[str, Any]:
    return config.transition(db, id_or_name, "pause", who.actor)


@router.post("/experiments/{id_or_name}/stop")
def stop_experiment(id_or_name: str, who: Operator, db: Db) -> dict[str, Any]:
    return config.transition(db, id_or_name, "stop", who.actor)


@router.post("/experiments/{id_or_name}/rollout/{action}")
async def rollout_action(id_or_name: str, action: str, who: Operator, plane: Plane) -> Any:
    if action not in ROLLOUT_ACTIONS:
        raise ControlError(
            404, f"unknown rollout action {action!r}; expected one of {', '.join(ROLLOUT_ACTIONS)}"
        )
    if plane.rollout_action is None:
        raise ControlError(404, _ELSEWHERE)
    return await run_in_threadpool(plane.rollout_action, id_or_name, action, who.actor)


@router.post("/experiments/{id_or_name}/segments/backfill")
def backfill_segments(
    id_or_name: str, who: Operator, plane: Plane, db: Db, body: SegmentBackfillIn | None = None
) -> dict[str, Any]:
    """Recompute the segment rollups of declared tag keys (``keys``, default all declared)
    from the stored requests: for a key declared after traffic began."""
    if plane.segment_backfill is None:
        raise ControlError(404, _ELSEWHERE)
    return config.backfill_segments(
        db, id_or_name, body or SegmentBackfillIn(), who.actor, plane.segment_backfill
    )


# --- client API keys ---------------------------------------------------------------------


@router.get("/api-keys")
def list_keys(who: Admin, db: Db) -> list[dict[str, Any]]:
    return config.list_keys(db)


@router.post("/api-keys", status_code=201)
def create_key(body: ApiKeyIn, who: Admin, db: Db) -> dict[str, Any]:
    return config.create_key(db, body, who.actor)


@router.delete("/api-keys/{name}")
def revoke_key(name: str, who: Admin, db: Db) -> dict[str, Any]:
    return config.revoke_key(db, name, who.actor)


# --- metric definitions ------------------------------------------------------------------

_ELSEWHERE: Final = "served by the control plane: the analytics service's /admin (liftgate's admin base URL)"


_METRIC_DOC: Final[dict[str, Any]] = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}
}


def _spec(plane: ControlPlane, body: Any, name: str | None = None) -> dict[str, Any]:
    if plane.metric_spec is None:
        raise ControlError(404, _ELSEWHERE)
    if not isinstance(body, dict):
        raise ControlError(422, "a metric definition must be a JSON object")
    if name is not None and body.setdefault("name", name) != name:
        raise ControlError(422, f"name in the body ({body['name']!r}) differs from the URL ({name!r})")
    try:
        return plane.metric_spec(body)
    except ValueError as exc:
        raise ControlError(422, str(exc)) from None


def _not_builtin(plane: ControlPlane, name: str, verb: str) -> None:
    if plane.metric_spec is None:  # no catalogue here: all metric writes live elsewhere
        raise ControlError(404, _ELSEWHERE)
    if name in plane.builtin_metrics:
        raise ControlError(422, f"{name!r} is a built-in metric and cannot be {verb}")


@router.post("/metrics", status_code=201, openapi_extra=_METRIC_DOC)
def create_metric(plane: Plane, who: Operator, body: MetricBody) -> dict[str, Any]:
    spec = _spec(plane, body)
    with plane.engine.begin() as conn:
        metric_store.create(conn, spec, who.actor)
    return spec | {"builtin": False}


@router.put("/metrics/{name}", openapi_extra=_METRIC_DOC)
def update_metric(plane: Plane, who: Operator, name: str, body: MetricBody) -> dict[str, Any]:
    _not_builtin(plane, name, "changed")
    spec = _spec(plane, body, name)
    with plane.engine.begin() as conn:
        metric_store.update(conn, name, spec, who.actor)
    return spec | {"builtin": False}


@router.delete("/metrics/{name}", status_code=204)
def delete_metric(plane: Plane, who: Operator, name: str) -> Response:
    _not_builtin(plane, name, "deleted")
    with plane.engine.begin() as conn:
        metric_store.delete(conn, name, who.actor)
    return Response(status_code=204)


#: The analytics service's earlier paths of the same actions (the dashboard and older CLIs
#: call them): the same handlers, so the same auth, lock and audit.
legacy_router = APIRouter()
legacy_router.add_api_route(
    "/api/metrics", create_metric, methods=["POST"], status_code=201, openapi_extra=_METRIC_DOC
)
legacy_router.add_api_route("/api/metrics/{name}", update_metric, methods=["PUT"], openapi_extra=_METRIC_DOC)
legacy_router.add_api_route("/api/metrics/{name}", delete_metric, methods=["DELETE"], status_code=204)
legacy_router.add_api_route(
    "/api/experiments/{id_or_name}/rollout/{action}", rollout_action, methods=["POST"]
)

router.include_router(users_api.router)
