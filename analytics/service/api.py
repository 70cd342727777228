"""The analytics HTTP API: experiments, reports, snapshots, health and Prometheus metrics.

Reads need a read credential (``analytics.service.access``: the read or admin token as a bearer
header, or the dashboard's session; anyone with ``LIFTGATE_READ_ACCESS=open``); mutating
calls and ``?fresh=true`` need ``Authorization: Bearer <LIFTGATE_ADMIN_TOKEN>`` (401 without
a bearer token, 403 with a wrong one) and changes are written to ``audit_log``.
``/healthz`` and ``/metrics`` (Prometheus) stay open. Errors are ``{"detail": reason}``.
Changes to configuration (experiments, metric definitions, rollouts) are the control
plane's: ``control.api``, mounted by ``analytics.service.app`` at ``/admin``.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Final

import orjson
from fastapi import APIRouter, HTTPException, Query, Response
from sqlalchemy import Connection, text

from analytics.report.catalogue import BUILTINS, spec_dict
from analytics.report.schema import ExperimentSummary, Report, Verdict, headline
from analytics.report.snapshots import latest_snapshot, load_timeseries, save_snapshot, with_current_point
from analytics.service.access import Admin, Reader
from analytics.service.context import Ctx, ServiceContext
from control import audit

router = APIRouter()


__all__ = ["Admin", "Ctx", "Reader", "resolve_experiment", "router"]

_ID: Final = re.compile(r"[0-9]{1,10}")  # ASCII digits only: "²".isdigit() is True
_ID_MAX: Final = 2**31 - 1  # experiments.id is an int4
_NAME_MAX: Final = 128  # experiments.name


def resolve_experiment(conn: Connection, id_or_name: str) -> int:
    """The experiment's id; 404 when there is none. An id beyond the column's range, or a
    name no experiment can have (too long, control characters), is simply not found."""
    missing = HTTPException(404, f"experiment {id_or_name[:_NAME_MAX]!r} not found")
    if _ID.fullmatch(id_or_name):
        if int(id_or_name) > _ID_MAX:
            raise missing
        row = conn.execute(text("SELECT id FROM experiments WHERE id = :v"), {"v": int(id_or_name)}).first()
    elif len(id_or_name) > _NAME_MAX or not id_or_name.isprintable():
        raise missing
    else:
        row = conn.execute(text("SELECT id FROM experiments WHERE name = :v"), {"v": id_or_name}).first()
    if row is None:
        raise missing
    return int(row[0])


@router.get("/healthz")
def healthz(ctx: Ctx) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    workers = {name: t.is_alive() for name, t in ctx.threads.items()}
    return {"status": "ok", "workers": workers}


@router.get("/metrics")
def prometheus_metrics(ctx: Ctx) -> Response:
    return Response(ctx.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")


_LIST_SQL = text(
    """
    SELECT e.id, e.name, e.route, e.mode, e.status, e.rollout_stage, e.started_at,
           s.created_at, s.units, s.verdicts
    FROM experiments e
    LEFT JOIN LATERAL (
        SELECT created_at, (report->>'units')::bigint AS units, report->'verdicts' AS verdicts
        FROM analysis_snapshots WHERE experiment_id = e.id
        ORDER BY created_at DESC, id DESC LIMIT 1
    ) s ON true
    ORDER BY e.id
    """
)


@router.get("/api/experiments", response_model=list[ExperimentSummary])
def list_experiments(ctx: Ctx, _: Reader) -> list[ExperimentSummary]:
    out: list[ExperimentSummary] = []
    with ctx.engine.connect() as conn:
        for eid, name, route, mode, status, stage, started, at, units, verdicts in conn.execute(_LIST_SQL):
            if at is None:
                # Never snapshotted: count its units directly (index-only, one experiment).
                units = conn.execute(
                    text("SELECT count(*) FROM unit_rollups WHERE experiment_id = :e"),
                    {"e": eid},
                ).scalar_one()
            raw = verdicts if isinstance(verdicts, list) else orjson.loads(verdicts) if verdicts else []
            verdict = headline([Verdict.model_validate(v) for v in raw])
            out.append(
                ExperimentSummary(
                    id=eid, name=name, route=route, mode=mode, status=status, stage=stage,
                    units=int(units or 0), verdict=verdict, started_at=started, report_at=at,
                )
            )  # fmt: skip
    return out


def _compute(ctx: ServiceContext, conn: Connection, eid: int, source: str) -> Report:
    started = time.perf_counter()
    report = ctx.build(conn, eid)
    ctx.metrics.build_seconds.labels(source).observe(time.perf_counter() - started)
    return report


@router.get("/api/experiments/{id_or_name}/report", response_model=Report)
def get_report(
    ctx: Ctx, reader: Reader, id_or_name: str, fresh: Annotated[bool, Query()] = False
) -> Response:
    if fresh and not reader.admin:
        # A fresh report costs a full computation: admins only, and rate limited below.
        raise HTTPException(403, "fresh=true recomputes the report and needs the admin token")
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        if fresh and (wait := ctx.fresh_wait(eid)) > 0:
            raise HTTPException(
                429,
                f"a fresh report of this experiment was computed less than"
                f" {ctx.settings.fresh_min_interval_s:g} s ago; retry in {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        report = None if fresh else latest_snapshot(conn, eid)
        age = (datetime.now(UTC) - report.generated_at).total_seconds() if report is not None else None
        if report is not None and age is not None and age <= ctx.settings.report_max_age_s:
            series = load_timeseries(conn, eid, ctx.settings.max_timeseries_points)
            report = report.model_copy(update={"timeseries": series})
            ctx.metrics.report_requests.labels("snapshot").inc()
        else:
            report = _compute(ctx, conn, eid, "api")
            ctx.metrics.report_requests.labels("computed").inc()
    return Response(report.model_dump_json(), media_type="application/json")


@router.post("/api/experiments/{id_or_name}/snapshot", response_model=Report, status_code=201)
def post_snapshot(ctx: Ctx, actor: Admin, id_or_name: str) -> Response:
    with ctx.engine.begin() as conn:
        eid = resolve_experiment(conn, id_or_name)
        report = _compute(ctx, conn, eid, "api")
        snapshot_id = save_snapshot(conn, report, source="api")
        audit.write(
            conn, actor=actor, action="snapshot", entity="experiment", entity_id=str(eid),
            before=None, after={"snapshot_id": snapshot_id, "generated_at": report.generated_at.isoformat()},
        )  # fmt: skip
    ctx.metrics.snapshots.labels("ok").inc()
    series = with_current_point(report.timeseries, report)
    body = report.model_copy(update={"timeseries": series}).model_dump_json()
    return Response(body, media_type="application/json", status_code=201)


# --- metric definitions ------------------------------------------------------------------


@router.get("/api/metrics")
def list_metrics(ctx: Ctx, _: Reader) -> list[dict[str, Any]]:
    out = [spec_dict(m) | {"builtin": True} for m in BUILTINS.values()]
    with ctx.engine.connect() as conn:
        for (definition,) in conn.execute(text("SELECT definition FROM metric_definitions ORDER BY name")):
            out.append(dict(definition) | {"builtin": False})
    return out
