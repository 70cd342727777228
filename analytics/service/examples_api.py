"""``GET /api/experiments/{ref}/examples`` and ``GET /api/experiments/{ref}/shadow-pairs``.

Sampled requests of an experiment (per variant, segment, category, feedback kind, judge
score range, failure and time window; ``?metric=`` lists the requests behind a report
metric) and shadow pairs with both answers side by side. Read access, like the report.
Documents are built by :mod:`analytics.report.examples` (sampling, cursors, content rules).

Bad parameters answer 422 with the reason (``{"detail": ...}``); an unknown experiment 404; a
page that would take longer than ``examples.TIMEOUT_MS`` in the database 503 with the reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from analytics.report import examples
from analytics.report.examples import ExampleError, ExampleFilter, ExampleTimeout
from analytics.service.api import Ctx, resolve_experiment

router = APIRouter()

_Text = Annotated[str | None, Query(min_length=1, max_length=256)]


def _filter(
    variant: str | None,
    segment: str | None,
    category: str | None,
    feedback: str | None,
    score_min: float | None,
    score_max: float | None,
    judge: str | None,
    error: bool | None,
    since: datetime | None,
    until: datetime | None,
) -> ExampleFilter:
    return ExampleFilter(
        variant=variant, segment=segment, category=category, feedback=feedback, score_min=score_min,
        score_max=score_max, judge=judge, error=error, since=since, until=until,
    )  # fmt: skip


@router.get("/api/experiments/{id_or_name}/examples")
def get_examples(
    ctx: Ctx,
    id_or_name: str,
    variant: _Text = None,
    segment: Annotated[str | None, Query(min_length=3, max_length=386)] = None,
    category: _Text = None,
    feedback: _Text = None,
    score_min: float | None = None,
    score_max: float | None = None,
    judge: _Text = None,
    error: bool | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    metric: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=examples.MAX_LIMIT)] = examples.DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    flt = _filter(variant, segment, category, feedback, score_min, score_max, judge, error, since, until)
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        try:
            return examples.examples(conn, eid, flt, limit=limit, cursor=cursor, metric=metric)
        except ExampleError as exc:
            raise HTTPException(422, str(exc)) from None
        except ExampleTimeout as exc:
            raise HTTPException(503, str(exc)) from None


@router.get("/api/experiments/{id_or_name}/shadow-pairs")
def get_shadow_pairs(
    ctx: Ctx,
    id_or_name: str,
    variant: _Text = None,
    segment: Annotated[str | None, Query(min_length=3, max_length=386)] = None,
    category: _Text = None,
    score_min: float | None = None,
    score_max: float | None = None,
    judge: _Text = None,
    error: bool | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=examples.MAX_LIMIT)] = examples.DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    flt = _filter(variant, segment, category, None, score_min, score_max, judge, error, since, until)
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        try:
            return examples.shadow_pairs(conn, eid, flt, limit=limit, cursor=cursor)
        except ExampleError as exc:
            raise HTTPException(422, str(exc)) from None
        except ExampleTimeout as exc:
            raise HTTPException(503, str(exc)) from None
