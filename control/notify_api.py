"""The admin API of notifications: webhooks, their test button and the delivery log.

Served with the rest of the admin API (same credential check, same audit):

- ``/admin/webhooks`` (GET, POST), ``/admin/webhooks/{name}`` (GET, DELETE);
- ``/admin/webhooks/{name}/test`` (POST): one ``test`` notification sent now, its delivery
  returned (``status`` ``delivered`` or ``failed`` with the reason);
- ``/admin/webhooks/{name}/deliveries`` and ``/admin/notifications/deliveries`` (GET,
  ``?status=pending|delivered|failed&limit=``): the delivery log, newest first;
- ``/admin/notifications/kinds`` (GET): every event kind and what it means.

A webhook's URL and secret are write-only: answers show the URL's scheme and host and
whether the webhook signs (``signed``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from control import notifications
from control.deps import Admin, Plane
from control.notify_payload import KINDS
from control.webhook_sender import send_test

router = APIRouter(prefix="/admin")
Status = Literal["pending", "delivered", "failed"]
Limit = Annotated[int, Query(ge=1, le=1000)]


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]
    url: Annotated[str, Field(min_length=1, max_length=2048)]
    secret: Annotated[str, Field(max_length=512)] | None = None
    format: Literal["json", "slack"] = "json"
    events: Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=64)] = [
        notifications.ALL
    ]


@router.get("/webhooks")
def list_webhooks(who: Admin, plane: Plane) -> list[dict[str, Any]]:
    with plane.engine.connect() as conn:
        return notifications.list_webhooks(conn)


@router.post("/webhooks", status_code=201)
def add_webhook(body: WebhookIn, who: Admin, plane: Plane) -> dict[str, Any]:
    with plane.engine.begin() as conn:
        return notifications.add_webhook(
            conn,
            name=body.name,
            url=body.url,
            secret=body.secret,
            fmt=body.format,
            events=body.events,
            actor=who.actor,
            policy=plane.notify.policy(),
        )


@router.get("/webhooks/{name}")
def get_webhook(name: str, who: Admin, plane: Plane) -> dict[str, Any]:
    with plane.engine.connect() as conn:
        return notifications.get_webhook(conn, name)


@router.delete("/webhooks/{name}", status_code=204)
def remove_webhook(name: str, who: Admin, plane: Plane) -> None:
    with plane.engine.begin() as conn:
        notifications.remove_webhook(conn, name, who.actor)


@router.post("/webhooks/{name}/test")
async def test_webhook(name: str, who: Admin, plane: Plane) -> dict[str, Any]:
    return await send_test(plane.engine, name, who.actor, plane.notify)


@router.get("/webhooks/{name}/deliveries")
def webhook_deliveries(
    name: str, who: Admin, plane: Plane, status: Status | None = None, limit: Limit = 100
) -> list[dict[str, Any]]:
    with plane.engine.connect() as conn:
        notifications.get_webhook(conn, name)  # 404 for an unknown name
        return notifications.deliveries(conn, webhook=name, status=status, limit=limit)


@router.get("/notifications/deliveries")
def all_deliveries(
    who: Admin, plane: Plane, webhook: str | None = None, status: Status | None = None, limit: Limit = 100
) -> list[dict[str, Any]]:
    with plane.engine.connect() as conn:
        return notifications.deliveries(conn, webhook=webhook, status=status, limit=limit)


@router.get("/notifications/kinds")
def kinds(who: Admin) -> dict[str, str]:
    return dict(KINDS)
