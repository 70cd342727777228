"""Notification reads for the dashboard (readers): webhooks and the delivery log.

- ``GET /api/notifications/webhooks``: every webhook as the admin API shows it (the URL as
  ``scheme://host/***``, ``signed`` instead of the secret);
- ``GET /api/notifications/deliveries?webhook=&status=&limit=``: the delivery log, newest first.

Changes and the test button are the control plane's (``/admin/webhooks``, admin only).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from analytics.service.context import Ctx
from control import notifications

router = APIRouter()


@router.get("/api/notifications/webhooks")
def webhooks(ctx: Ctx) -> list[dict[str, Any]]:
    with ctx.engine.connect() as conn:
        return notifications.list_webhooks(conn)


@router.get("/api/notifications/deliveries")
def deliveries(
    ctx: Ctx,
    webhook: Annotated[str | None, Query(max_length=128)] = None,
    status: Literal["pending", "delivered", "failed"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    with ctx.engine.connect() as conn:
        return notifications.deliveries(conn, webhook=webhook, status=status, limit=limit)
