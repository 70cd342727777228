"""Rollout endpoints of the analytics service (included by ``analytics.app``).

- ``GET /api/experiments/{id_or_name}/rollout``: status, plan (defaults filled in), stages
  and the decision timeline (``decisions``: stage, to_stage, decision, reason, actor,
  evidence, created_at) — what the dashboard's rollout card draws.
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
from starlette.concurrency import run_in_threadpool

from analytics.api import Admin, Ctx
from analytics.rollout import manual
from analytics.rollout.telemetry import for_registry

router = APIRouter()
_ACTOR = re.compile(r"[^A-Za-z0-9_.@:\-]")


def _actor(admin: str, request: Request) -> str:
    name = _ACTOR.sub("", request.headers.get("x-liftgate-actor", ""))[:64]
    return f"{admin}:{name}" if name else admin


@router.get("/api/experiments/{id_or_name}/rollout")
def get_rollout(ctx: Ctx, id_or_name: str) -> dict[str, Any]:
    try:
        with ctx.engine.connect() as conn:
            return manual.status(conn, id_or_name)
    except manual.RolloutActionError as exc:
        raise HTTPException(exc.status, exc.detail) from None


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
