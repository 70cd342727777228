"""Rollout endpoints of the analytics service (included by ``analytics.service.app``).

- ``GET /api/experiments/{id_or_name}/rollout``: status, plan (defaults filled in), stages,
  ``plan_check`` (errors, warnings, detectable harm per guardrail per stage; see
  :mod:`analytics.rollout.check`) and the decision timeline (``decisions``: stage, to_stage,
  decision, reason, actor, evidence, created_at) — what the dashboard's rollout card draws.
- ``POST /api/rollout-plans/check``: ``{"plan": {...}, "route": "..."}`` (route optional) →
  the same ``plan_check`` for a plan not yet stored; read-only, so no token needed.
- the actions (advance, pause, resume, rollback) are the control plane's:
  ``POST /admin/experiments/{id_or_name}/rollout/<action>`` (``control.api``; the earlier
  ``/api/experiments/{id_or_name}/rollout/<action>`` answers the same).

Errors are ``{"detail": reason}``: 404 unknown experiment, 409 wrong state or not a
rollout, 422 invalid plan.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from analytics.rollout import manual
from analytics.rollout.baseline import EvidenceCache
from analytics.service.context import Ctx

router = APIRouter()


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
    # Routes carry no control characters (the gateway refuses them), and PostgreSQL cannot
    # hold a NUL: such a route is a 422 here, not a database error.
    route: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")


@router.post("/api/rollout-plans/check")
def post_plan_check(ctx: Ctx, request: Request, body: PlanCheckIn) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        return manual.plan_check(conn, body.plan, body.route, evidence=_evidence(request)).public()
