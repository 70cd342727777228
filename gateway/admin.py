"""Admin API (bearer ``LIFTGATE_ADMIN_TOKEN``): upstreams, experiments, client API keys.

401 without (or with a malformed) ``Authorization: Bearer`` header, 403 with a wrong token
(constant-time compare; checked from the headers before the body is read, see
``gateway.app``). Invalid definitions answer 422 ``{"detail": reason}`` (``admin_models``).
A name or id in the path that cannot exist (control characters, too long, an id beyond the
column's range) is a 404 without a database round trip. ``GET /admin/openapi.json`` serves
the OpenAPI document of the admin API and the public non-completion routes. Every change
writes an ``audit_log`` row with the state before and after; upstream API keys never appear
there or in responses (masked), client API keys are returned once and stored as SHA-256.
The gateway picks changes up through its snapshot refresh (≤ 1 s).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from contracts import offline_gate, redaction
from contracts.tables import ApiKey, AuditLog, Experiment, Upstream, Variant
from gateway.admin_models import (
    ApiKeyIn,
    ExperimentIn,
    ExperimentPatch,
    UpstreamIn,
    UpstreamPatch,
    VariantIn,
    check_experiment,
)
from gateway.auth import admin_denial, header
from gateway.inputs import has_control
from gateway.routing import key_hash

MAX_ID = 2**31 - 1  # ids are 32-bit integer columns
# Declares the scheme in the OpenAPI document; the check itself is admin_denial's.
_bearer = HTTPBearer(auto_error=False, description="LIFTGATE_ADMIN_TOKEN")


def _runtime(request: Request) -> Any:
    return request.app.state.runtime


def require_admin(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> str:
    denial = admin_denial(
        header(request.scope["headers"], b"authorization"), _runtime(request).settings.admin_token
    )
    if denial is not None:
        status, reason = denial
        raise HTTPException(status, reason, headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)
    actor = request.headers.get("x-liftgate-actor", "admin")[:128]
    return "admin" if has_control(actor) else actor


def _path_name(value: str, what: str) -> str:
    """A name from the URL path, or 404 when no row could have it (nothing reaches the database)."""
    if not value or len(value) > 128 or has_control(value):
        raise HTTPException(404, f"no {what} with that name")
    return value


def _engine(request: Request) -> Engine:
    rt = _runtime(request)
    engine: Engine | None = rt.extra.get("admin_engine")
    if engine is None:
        engine = create_engine(
            rt.settings.database_url, pool_size=2, max_overflow=4, pool_pre_ping=True, hide_parameters=True
        )
        rt.extra["admin_engine"] = engine
    return engine


def get_session(request: Request) -> Any:
    with Session(_engine(request), expire_on_commit=False) as session:
        yield session


Actor = Annotated[str, Depends(require_admin)]
Db = Annotated[Session, Depends(get_session)]
admin_router = APIRouter(prefix="/admin")


@admin_router.get("/openapi.json", include_in_schema=False)
def openapi_document(request: Request, actor: Actor) -> dict[str, Any]:
    """The OpenAPI document of the admin API and the public non-completion routes."""
    document: dict[str, Any] = request.app.openapi()
    return document


def _audit(
    db: Session, actor: str, action: str, entity: str, entity_id: Any, before: Any, after: Any
) -> None:
    db.add(
        AuditLog(
            actor=actor, action=action, entity=entity, entity_id=str(entity_id), before=before, after=after
        )
    )


def _commit(db: Session) -> None:
    try:
        db.commit()
    except IntegrityError as exc:
        db.rollback()
        text = str(exc.orig)
        if "uq_experiments_running_route" in text:
            raise HTTPException(422, "another experiment is already running on this route") from None
        raise HTTPException(409, "conflicts with an existing row (duplicate name?)") from None


# --- upstreams ---------------------------------------------------------------------------


def upstream_out(u: Upstream) -> dict[str, Any]:
    return {
        "name": u.name,
        "base_url": u.base_url,
        "api_key": ("***" + u.api_key[-4:] if len(u.api_key) >= 12 else "***") if u.api_key else None,
        "timeout_s": u.timeout_s,
        "connect_timeout_s": u.connect_timeout_s,
        "max_connections": u.max_connections,
    }


def _upstream(db: Session, name: str) -> Upstream:
    name = _path_name(name, "upstream")
    u = db.scalar(select(Upstream).where(Upstream.name == name))
    if u is None:
        raise HTTPException(404, f"no upstream named {name!r}")
    return u


@admin_router.get("/upstreams")
def list_upstreams(actor: Actor, db: Db) -> list[dict[str, Any]]:
    return [upstream_out(u) for u in db.scalars(select(Upstream).order_by(Upstream.id))]


@admin_router.get("/upstreams/{name}")
def get_upstream(name: str, actor: Actor, db: Db) -> dict[str, Any]:
    return upstream_out(_upstream(db, name))


@admin_router.post("/upstreams", status_code=201)
def create_upstream(body: UpstreamIn, actor: Actor, db: Db) -> dict[str, Any]:
    redaction.remember(body.api_key)  # masked in logs before anything can fail
    if db.scalar(select(Upstream.id).where(Upstream.name == body.name)) is not None:
        raise HTTPException(409, f"upstream {body.name!r} already exists")
    u = Upstream(**body.model_dump())
    db.add(u)
    db.flush()
    _audit(db, actor, "create", "upstream", u.name, None, upstream_out(u))
    _commit(db)
    return upstream_out(u)


@admin_router.patch("/upstreams/{name}")
def update_upstream(name: str, body: UpstreamPatch, actor: Actor, db: Db) -> dict[str, Any]:
    redaction.remember(body.api_key)  # masked in logs before anything can fail
    u = _upstream(db, name)
    before = upstream_out(u)
    for key, value in body.model_dump(exclude_unset=True).items():
        setattr(u, key, value)
    u.updated_at = func.now()
    db.flush()
    db.refresh(u)
    _audit(db, actor, "update", "upstream", u.name, before, upstream_out(u))
    _commit(db)
    return upstream_out(u)


@admin_router.delete("/upstreams/{name}", status_code=204)
def delete_upstream(name: str, actor: Actor, db: Db) -> None:
    u = _upstream(db, name)
    if db.scalar(select(func.count()).select_from(Variant).where(Variant.upstream_id == u.id)):
        raise HTTPException(409, f"upstream {name!r} is used by experiment variants")
    _audit(db, actor, "delete", "upstream", u.name, upstream_out(u), None)
    db.delete(u)
    _commit(db)


# --- experiments -------------------------------------------------------------------------

_EXP_FIELDS = [
    "id",
    "name",
    "route",
    "mode",
    "status",
    "description",
    "salt",
    "unit_key",
    "coverage",
    "targeting",
    "forced",
    "shadow_sample_rate",
    "fallback_to_control",
    "content_logging",
    "metrics",
    "rollout_plan",
    "rollout_stage",
    "status_reason",
]


def experiment_out(e: Experiment) -> dict[str, Any]:
    out = {k: getattr(e, k) for k in _EXP_FIELDS}
    for k in ("started_at", "stopped_at", "stage_started_at", "created_at", "updated_at"):
        value = getattr(e, k)
        out[k] = value.isoformat() if isinstance(value, datetime) else None
    out["variants"] = [
        {
            "name": v.name,
            "upstream": v.upstream.name,
            "model": v.model,
            "weight": v.weight,
            "is_control": v.is_control,
        }
        for v in e.variants
    ]
    return out


def _experiment(db: Session, id_or_name: str) -> Experiment:
    q = select(Experiment).options(selectinload(Experiment.variants).selectinload(Variant.upstream))
    if id_or_name.isascii() and id_or_name.isdigit():
        if len(id_or_name) > 10 or int(id_or_name) > MAX_ID:
            raise HTTPException(404, f"no experiment {id_or_name!r}")
        cond = Experiment.id == int(id_or_name)
    else:
        cond = Experiment.name == _path_name(id_or_name, "experiment")
    e = db.scalar(q.where(cond))
    if e is None:
        raise HTTPException(404, f"no experiment {id_or_name!r}")
    return e


def _upstream_ids(db: Session) -> dict[str, int]:
    return {name: uid for uid, name in db.execute(select(Upstream.id, Upstream.name))}


def _set_variants(db: Session, e: Experiment, variants: list[VariantIn], ids: dict[str, int]) -> None:
    existing = {v.name: v for v in e.variants}
    keep = []
    for spec in variants:
        v = existing.get(spec.name) or Variant(name=spec.name)
        v.upstream_id = ids[spec.upstream]
        v.model, v.weight, v.is_control = spec.model, spec.weight, spec.is_control
        keep.append(v)
    e.variants = keep


def _running_elsewhere(db: Session, route: str, exp_id: int | None) -> bool:
    q = select(Experiment.id).where(Experiment.route == route, Experiment.status == "running")
    if exp_id is not None:
        q = q.where(Experiment.id != exp_id)
    return db.scalar(q.limit(1)) is not None


@admin_router.get("/experiments")
def list_experiments(actor: Actor, db: Db) -> list[dict[str, Any]]:
    q = select(Experiment).options(selectinload(Experiment.variants).selectinload(Variant.upstream))
    return [experiment_out(e) for e in db.scalars(q.order_by(Experiment.id))]


@admin_router.get("/experiments/{id_or_name}")
def get_experiment(id_or_name: str, actor: Actor, db: Db) -> dict[str, Any]:
    return experiment_out(_experiment(db, id_or_name))


@admin_router.post("/experiments", status_code=201)
def create_experiment(body: ExperimentIn, actor: Actor, db: Db) -> dict[str, Any]:
    fields = body.model_dump(exclude={"variants"})
    ids = _upstream_ids(db)
    reason = check_experiment(fields, body.variants, set(ids))
    if reason:
        raise HTTPException(422, reason)
    if db.scalar(select(Experiment.id).where(Experiment.name == body.name)) is not None:
        raise HTTPException(409, f"experiment {body.name!r} already exists")
    fields["salt"] = fields["salt"] or secrets.token_hex(8)
    e = Experiment(**fields, status="draft")
    _set_variants(db, e, body.variants, ids)
    db.add(e)
    db.flush()
    e = _experiment(db, str(e.id))
    _audit(db, actor, "create", "experiment", e.id, None, experiment_out(e))
    _commit(db)
    return experiment_out(e)


@admin_router.patch("/experiments/{id_or_name}")
def update_experiment(id_or_name: str, body: ExperimentPatch, actor: Actor, db: Db) -> dict[str, Any]:
    e = _experiment(db, id_or_name)
    before = experiment_out(e)
    changes = body.model_dump(exclude_unset=True, exclude={"variants"})
    merged = {**before, **changes}
    ids = _upstream_ids(db)
    variants = body.variants if body.variants is not None else [VariantIn(**v) for v in before["variants"]]
    reason = check_experiment(merged, variants, set(ids))
    if reason:
        raise HTTPException(422, reason)
    if e.status == "running" and "route" in changes and _running_elsewhere(db, changes["route"], e.id):
        raise HTTPException(422, "another experiment is already running on this route")
    for key, value in changes.items():
        setattr(e, key, value)
    if body.variants is not None:
        _set_variants(db, e, body.variants, ids)
    e.updated_at = func.now()
    db.flush()
    db.expire_all()
    after = _experiment(db, str(e.id))
    if after.status == "running":
        _require_gate(db, after)
    _audit(db, actor, "update", "experiment", e.id, before, experiment_out(after))
    _commit(db)
    return experiment_out(after)


def _require_gate(db: Session, e: Experiment) -> None:
    """An A/B experiment shows its candidates to users: when it declares an offline gate, every
    candidate with traffic must have passed it as configured now (rollouts are held by their
    controller instead, which serves only the control until the gate passes)."""
    control = next((v for v in e.variants if v.is_control), None)
    if e.mode != "ab" or control is None:
        return
    conn = db.connection()
    for v in e.variants:
        if v.is_control or v.weight <= 0:
            continue
        gate = offline_gate.check(conn, e.id, v.name, control.name, required=False)
        if not gate.passed:
            raise HTTPException(409, f"variant {v.name!r}: {gate.reason}")


_TRANSITIONS = {
    "start": ({"draft", "paused"}, "running"),
    "pause": ({"running"}, "paused"),
    "stop": ({"draft", "running", "paused"}, "stopped"),
}


def _transition(id_or_name: str, action: str, actor: str, db: Session) -> dict[str, Any]:
    e = _experiment(db, id_or_name)
    allowed, target = _TRANSITIONS[action]
    if e.status not in allowed:
        raise HTTPException(409, f"cannot {action} an experiment that is {e.status}")
    if target == "running" and _running_elsewhere(db, e.route, e.id):
        raise HTTPException(422, f"another experiment is already running on route {e.route!r}")
    if target == "running":
        _require_gate(db, e)
    before = experiment_out(e)
    e.status = target
    now = datetime.now(UTC)
    if action == "start" and e.started_at is None:
        e.started_at = now
    if action == "stop":
        e.stopped_at = now
    e.status_reason = f"{action} by {actor}"
    e.updated_at = now
    db.flush()
    _audit(db, actor, action, "experiment", e.id, before, experiment_out(e))
    _commit(db)
    return experiment_out(e)


@admin_router.post("/experiments/{id_or_name}/start")
def start_experiment(id_or_name: str, actor: Actor, db: Db) -> dict[str, Any]:
    return _transition(id_or_name, "start", actor, db)


@admin_router.post("/experiments/{id_or_name}/pause")
def pause_experiment(id_or_name: str, actor: Actor, db: Db) -> dict[str, Any]:
    return _transition(id_or_name, "pause", actor, db)


@admin_router.post("/experiments/{id_or_name}/stop")
def stop_experiment(id_or_name: str, actor: Actor, db: Db) -> dict[str, Any]:
    return _transition(id_or_name, "stop", actor, db)


# --- client API keys ---------------------------------------------------------------------


def key_out(k: ApiKey) -> dict[str, Any]:
    return {"name": k.name, "prefix": k.prefix, "revoked": k.revoked, "created_at": k.created_at.isoformat()}


@admin_router.get("/api-keys")
def list_keys(actor: Actor, db: Db) -> list[dict[str, Any]]:
    return [key_out(k) for k in db.scalars(select(ApiKey).order_by(ApiKey.id))]


@admin_router.post("/api-keys", status_code=201)
def create_key(body: ApiKeyIn, actor: Actor, db: Db) -> dict[str, Any]:
    if db.scalar(select(ApiKey.id).where(ApiKey.name == body.name)) is not None:
        raise HTTPException(409, f"api key {body.name!r} already exists")
    key = "lg-" + secrets.token_urlsafe(24)
    k = ApiKey(name=body.name, key_hash=key_hash(key), prefix=key[:8])
    db.add(k)
    db.flush()
    db.refresh(k)
    _audit(db, actor, "create", "api_key", k.name, None, key_out(k))
    _commit(db)
    return {**key_out(k), "key": key}


@admin_router.delete("/api-keys/{name}")
def revoke_key(name: str, actor: Actor, db: Db) -> dict[str, Any]:
    name = _path_name(name, "api key")
    k = db.scalar(select(ApiKey).where(ApiKey.name == name))
    if k is None:
        raise HTTPException(404, f"no api key named {name!r}")
    before = key_out(k)
    k.revoked = True
    db.flush()
    _audit(db, actor, "revoke", "api_key", k.name, before, key_out(k))
    _commit(db)
    return key_out(k)
