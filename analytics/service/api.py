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

import dataclasses
import math
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

import orjson
from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, text

from analytics.report.catalogue import BUILTINS, spec_dict
from analytics.report.probe import JudgeEndpoint, run_probe
from analytics.report.risks import resolve_phrases
from analytics.report.schema import ExperimentSummary, Report, Verdict, headline
from analytics.report.snapshots import latest_snapshot, load_timeseries, save_snapshot, with_current_point
from analytics.rollout.plan import PlanError, parse_plan
from analytics.service.access import Admin, Operator, Reader
from analytics.service.context import Ctx, ServiceContext
from analytics.service.data_quality_api import refresh_gauges
from contracts.ngrams import phrase_lookup
from control import audit

router = APIRouter()


__all__ = ["Admin", "Ctx", "Operator", "Reader", "resolve_experiment", "router"]

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
def healthz(ctx: Ctx, response: Response) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    workers = {name: t.is_alive() for name, t in ctx.threads.items()}
    if not all(workers.values()):
        # A background worker ended (its reason is in the log): e.g. the consumer, and with it
        # ingest, stopped for good. The process answers but no longer does its job.
        response.status_code = 503
        return {"status": "failing", "workers": workers}
    return {"status": "ok", "workers": workers}


@router.get("/metrics")
def prometheus_metrics(ctx: Ctx) -> Response:
    refresh_gauges(ctx)
    return Response(ctx.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")


_LIST_SQL = text(
    """
    SELECT e.id, e.name, e.route, e.mode, e.status, e.rollout_stage, e.rollout_plan, e.started_at,
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
        for eid, name, route, mode, status, stage, plan, started, at, units, verdicts in conn.execute(
            _LIST_SQL
        ):
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
                    stage_percent=stage_percent(plan, stage), units=int(units or 0), verdict=verdict, started_at=started, report_at=at,
                )
            )  # fmt: skip
    return out


def stage_percent(plan: Any, stage: int | None) -> float | None:
    """The candidate's percent at ``stage`` of ``plan`` (None without a stage or a valid plan)."""
    if stage is None or plan is None:
        return None
    try:
        parsed = parse_plan(plan)
    except PlanError:
        return None
    return parsed.stage(stage).percent if 0 <= stage < len(parsed.stages) else None


def _compute(
    ctx: ServiceContext,
    conn: Connection,
    eid: int,
    source: str,
    cuped_theta: str | None = None,
    proportion_test: str | None = None,
) -> Report:
    started = time.perf_counter()
    report = ctx.build(conn, eid, cuped_theta=cuped_theta, proportion_test=proportion_test)
    ctx.metrics.build_seconds.labels(source).observe(time.perf_counter() - started)
    return report


def _served_report(ctx: ServiceContext, conn: Connection, eid: int, fresh: bool) -> Report:
    """The latest snapshot when it is recent enough (and not ``fresh``), else a new report."""
    report = None if fresh else latest_snapshot(conn, eid)
    age = (datetime.now(UTC) - report.generated_at).total_seconds() if report is not None else None
    if report is not None and age is not None and age <= ctx.settings.report_max_age_s:
        series = load_timeseries(conn, eid, ctx.settings.max_timeseries_points)
        ctx.metrics.report_requests.labels("snapshot").inc()
        served = report.model_copy(update={"timeseries": series})
        ctx.metrics.observe_risks(served)
    else:
        served = _compute(ctx, conn, eid, "api")
        ctx.metrics.report_requests.labels("computed").inc()
    return served


@router.get("/api/experiments/{id_or_name}/report", response_model=Report)
def get_report(
    ctx: Ctx,
    reader: Reader,
    id_or_name: str,
    fresh: Annotated[bool, Query()] = False,
    cuped_theta: Annotated[Literal["pooled", "pooled_sums", "per_arm"] | None, Query()] = None,
    proportion_test: Annotated[Literal["welch", "pooled_z"] | None, Query()] = None,
) -> Response:
    """The latest snapshot (or a computed report). ``cuped_theta``/``proportion_test`` select
    another convention (docs/statistics.md): that report is computed, not a snapshot, so any
    reader may ask but at most once per ``fresh_min_interval_s`` per experiment (429)."""
    if fresh and not reader.may("operator"):
        # A fresh report costs a full computation: operators only, and rate limited below.
        raise HTTPException(403, "fresh=true recomputes the report and needs the operator role")
    conventions = cuped_theta is not None or proportion_test is not None
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        if (fresh or conventions) and (wait := ctx.fresh_wait(eid)) > 0:
            raise HTTPException(
                429,
                f"a fresh report of this experiment was computed less than"
                f" {ctx.settings.fresh_min_interval_s:g} s ago; retry in {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        if conventions:
            chosen = _compute(ctx, conn, eid, "api", cuped_theta, proportion_test)
            ctx.metrics.report_requests.labels("computed").inc()
            return Response(chosen.model_dump_json(), media_type="application/json")
        report = _served_report(ctx, conn, eid, fresh)
    return Response(report.model_dump_json(), media_type="application/json")


MAX_LOOKUP_PHRASES: Final = 100
MAX_PHRASE_CHARS: Final = 200


@router.get("/api/experiments/{id_or_name}/rl-risks")
def get_rl_risks(
    ctx: Ctx,
    _: Reader,
    id_or_name: str,
    phrase: Annotated[list[str] | None, Query()] = None,
) -> Response:
    """The report's ``rl_risks`` section (the same numbers as ``/report``, from the same
    snapshot or computation), one entry per candidate. With content logging ``hashed``,
    ``phrase`` (repeatable) names candidate phrases: the service hashes them with the
    deployment's key and shows the text of the hashes they match (as the configured phrase
    list does); the phrases themselves are neither stored nor logged."""
    lookup = dict(ctx.options.phrase_lookup)
    if phrase:
        if ctx.options.ngram_key is None:
            raise HTTPException(409, "no n-gram key configured: set LIFTGATE_NGRAM_KEY (the gateway's key)")
        if len(phrase) > MAX_LOOKUP_PHRASES:
            raise HTTPException(422, f"at most {MAX_LOOKUP_PHRASES} phrases")
        if not all(0 < len(p) <= MAX_PHRASE_CHARS and p.isprintable() for p in phrase):
            raise HTTPException(
                422, f"each phrase must be printable text of 1 to {MAX_PHRASE_CHARS} characters"
            )
        lookup |= phrase_lookup(ctx.options.ngram_key, phrase)
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        report = _served_report(ctx, conn, eid, False)
    sections = [r.model_copy(update={"phrases": resolve_phrases(r.phrases, lookup)}) for r in report.rl_risks]
    body = {
        "experiment_id": report.experiment_id, "name": report.name, "generated_at": report.generated_at,
        "alpha": report.alpha, "rl_risks": [r.model_dump(mode="json") for r in sections],
    }  # fmt: skip
    return Response(orjson.dumps(body), media_type="application/json")


class ProbeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phrase: str = Field(min_length=1, max_length=200)
    variant: str | None = Field(default=None, max_length=64)
    samples: int = Field(default=40, ge=10, le=200)


@router.post("/api/experiments/{id_or_name}/rl-risks/probe")
def post_probe(ctx: Ctx, actor: Admin, id_or_name: str, body: ProbeRequest) -> dict[str, Any]:
    """Re-score stored responses with the phrase removed / inserted (analytics.report.probe).
    Admin only: it sends stored user text to the judge and costs 4 × samples judge calls."""
    s = ctx.settings
    if not s.judge_url:
        # 409, not 503: the service is healthy, it is configured without a judge
        raise HTTPException(409, "no judge configured: set LIFTGATE_JUDGE_URL (and LIFTGATE_JUDGE_MODEL)")
    if not body.phrase.isprintable():
        raise HTTPException(422, "phrase must be printable text")
    judge = JudgeEndpoint(s.judge_url, s.judge_model, s.judge_api_key, score_min=s.judge_score_min,
                          score_max=s.judge_score_max, timeout_s=s.judge_timeout_s)  # fmt: skip
    with ctx.engine.connect() as conn:
        eid = resolve_experiment(conn, id_or_name)
        rows = conn.execute(
            text("SELECT name, is_control FROM variants WHERE experiment_id = :e ORDER BY id"), {"e": eid}
        ).all()
        control = next((n for n, c in rows if c), None)
        candidates = [n for n, c in rows if not c]
        variant = body.variant or (candidates[0] if len(candidates) == 1 else None)
        if control is None or variant is None or variant not in candidates:
            raise HTTPException(422, f"variant must name one candidate of the experiment: {candidates}")
        run = run_probe(conn, eid, control, variant, body.phrase, judge, body.samples, ctx.settings.alpha)
    return {"experiment_id": eid, "variant": variant, "control": control, "failed_calls": run.failed,
            **dataclasses.asdict(run.result)}  # fmt: skip


@router.post("/api/experiments/{id_or_name}/snapshot", response_model=Report, status_code=201)
def post_snapshot(ctx: Ctx, actor: Operator, id_or_name: str) -> Response:
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
