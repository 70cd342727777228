"""Curated datasets in the analytics service: the ``/api/datasets`` routes and the content
retention job (``curation`` does the work; this module wires it to the service's engine,
credentials and background workers)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from sqlalchemy import Engine

from analytics.service.access import require_admin, require_read
from curation import retention
from curation.api import make_router

if TYPE_CHECKING:
    from analytics.service.context import BackgroundWorker, ServiceContext

log = logging.getLogger(__name__)


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.ctx.engine
    return engine


def router() -> APIRouter:
    return make_router(_engine, require_read, require_admin)


def retention_worker(ctx: ServiceContext) -> BackgroundWorker | None:
    """Clears stored text past its TTL and deletes expired datasets every
    ``retention_interval_s`` (0 = off)."""
    from analytics.service.context import BackgroundWorker

    interval = ctx.settings.retention_interval_s
    if interval <= 0:
        return None

    def run(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                retention.enforce(ctx.engine, datetime.now(UTC))
            except Exception:  # retried at the next tick; the service keeps serving
                log.exception("content retention run failed")
            stop.wait(interval)

    return BackgroundWorker("retention", run)
