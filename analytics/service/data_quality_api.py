"""``GET /api/data-quality``: feedback that never joined an interaction (read access).

The counts come from :mod:`analytics.report.data_quality`; the same total is exported as the
gauge ``liftgate_analytics_feedback_unjoined`` (refreshed by this endpoint and by a scrape of
``/metrics`` at most once a minute).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query

from analytics.report import data_quality
from analytics.service.context import Ctx, ServiceContext

log = logging.getLogger(__name__)

router = APIRouter()

GAUGE_MAX_AGE_S = 60.0


@router.get("/api/data-quality")
def get_data_quality(
    ctx: Ctx,
    window_s: Annotated[float, Query(ge=0, le=30 * 86_400)] = data_quality.DEFAULT_WINDOW_S,
    days: Annotated[int, Query(ge=1, le=366)] = data_quality.DEFAULT_DAYS,
) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        found = data_quality.feedback_quality(conn, window_s, days)
    if (window_s, days) == (data_quality.DEFAULT_WINDOW_S, data_quality.DEFAULT_DAYS):
        ctx.metrics.observe_feedback_quality(found.unjoined, found.pending)
    return {"feedback": dataclasses.asdict(found)}


def refresh_gauges(ctx: ServiceContext) -> None:
    """Before a scrape: recount when the gauges are older than a minute (never fails the scrape)."""
    if time.monotonic() - ctx.metrics.feedback_quality_at < GAUGE_MAX_AGE_S:
        return
    try:
        with ctx.engine.connect() as conn:
            found = data_quality.feedback_quality(conn)
    except Exception as exc:  # the scrape still serves every other metric
        log.warning("data quality gauges not refreshed: %s", type(exc).__name__)
        return
    ctx.metrics.observe_feedback_quality(found.unjoined, found.pending)
