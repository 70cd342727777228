"""Rollout endpoints of the analytics service (included by ``analytics.service.app``).

- ``GET /api/experiments/{id_or_name}/rollout``: status, plan (defaults filled in), stages,
  ``plan_check`` (errors, warnings, detectable harm per guardrail per stage; see
  :mod:`analytics.rollout.check`) and the decision timeline (``decisions``: stage, to_stage,
  decision, reason, actor, evidence, created_at) — what the dashboard's rollout card draws.
- ``POST /api/rollout-plans/check``: ``{"plan": {...}, "route": "..."}`` (route optional) →
  the same ``plan_check`` for a plan not yet stored; read-only, so no token needed.
- ``POST /api/experiments/{id_or_name}/rollout/advance|pause|resume|rollback``: admin
  bearer token; the optional ``X-Liftgate-Actor`` header names the operator in the
  decision and the audit log (``admin:<name>``).

Errors are ``{"detail": reason}``: 404 unknown experiment, 409 wrong state or not a
rollout, 422 invalid plan.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from analytics.rollout import manual
from analytics.rollout.baseline import EvidenceCache
from analytics.rollout.telemetry import for_registry
from analytics.service.api import Admin, Ctx

router = APIRouter()
_ACTOR = re.compile(r"[^A-Za-z0-9_.@:\-]")


def _actor(admin: str, request: Request) -> str:
    name = _ACTOR.sub("", request.headers.get("x-liftgate-actor", ""))[:64]
    return f"{admin}:{name}" if name else admin


def _evidence(request: Request) -> EvidenceCache:
    """One cache of route traffic and baselines per app (the rollout page polls every 5 s)."""
    cache = getattr(request.app.state, "rollout_evidence", None)
    if not isinstance(cache, EvidenceCache):
        cache = EvidenceCache()
        request.app.state.rollout_evidence = cache
    return cache


@router.get("/api/experiments/{id_or_name}/rollout")
def get_rollout(ctx: Ctx, request: Request, id_or_name: str) -> dict[str, Any]:
    try:
        with ctx.engine.connect() as conn:
            return manual.status(conn, id_or_name, evidence=_evidence(request))
    except manual.RolloutActionError as exc:
        raise HTTPException(exc.status, exc.detail) from None


class PlanCheckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: dict[str, Any] | None = None
    route: str | None = Field(default=None, min_length=1, max_length=128)


@router.post("/api/rollout-plans/check")
def post_plan_check(ctx: Ctx, request: Request, body: PlanCheckIn) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        return manual.plan_check(conn, body.plan, body.route, evidence=_evidence(request)).public()


@router.post("/api/experiments/{id_or_name}/rollout/{action}")
async def post_rollout_action(ctx: Ctx, admin: Admin, request: Request, id_or_name: str, action: str) -> Any:
    if action not in manual.ACTIONS:
        raise HTTPException(
            404, f"unknown rollout action {action!r}; expected one of {', '.join(manual.ACTIONS)}"
        )
    metrics = for_registry(ctx.metrics.registry)
    try:
        return await run_in_threadpool(
            manual.act, ctx.engine, id_or_name, action, _actor(admin, request), metrics
        )
    except manual.RolloutActionError as exc:
        raise HTTPException(exc.status, exc.detail) from None
