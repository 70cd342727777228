"""Upstreams, experiments (with their variants) and client API keys: reads and the one writer.

Each change is one transaction that ends with its audit row. Changes to an experiment take
its lock first (:mod:`control.locking`) and re-read it ``FOR UPDATE``, like the rollout
controller, so an operator's edit and a controller's decision never interleave. While a
rollout runs (or is paused) at a stage, the stage sets the weights: a PATCH that changes
them or the stage is refused (409) — the rollout actions change them instead.

Upstream API keys never appear in answers or in the audit log (masked); client API keys are
returned once and stored as SHA-256. The gateway picks changes up through its snapshot
refresh (≤ 1 s).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from contracts import offline_gate, redaction
from contracts.config_rules import key_hash
from contracts.events import ROLLOUT_STAGE_TAG
from contracts.tables import ApiKey, Experiment, Upstream, Variant
from control import audit, rollout
from control.bodies import (
    ApiKeyIn,
    ExperimentIn,
    ExperimentPatch,
    SegmentBackfillIn,
    UpstreamIn,
    UpstreamPatch,
    VariantIn,
    check_experiment,
    has_control,
)
from control.errors import ControlError
from control.locking import lock
from control.plane import SegmentBackfill

MAX_ID: Final = 2**31 - 1  # ids are 32-bit integer columns


def _audit(
    db: Session, actor: str, action: str, entity: str, entity_id: Any, before: Any, after: Any
) -> None:
    audit.write(
        db.connection(),
        actor=actor,
        action=action,
        entity=entity,
        entity_id=entity_id,
        before=before,
        after=after,
    )


@contextmanager
def _conflicts(db: Session) -> Iterator[None]:
    """A constraint the block's writes break (two experiments running on one route, a
    duplicate name) is a 422/409 with the reason, the transaction rolled back."""
    try:
        yield
    except IntegrityError as exc:
        db.rollback()
        if "uq_experiments_running_route" in str(exc.orig):
            raise ControlError(422, "another experiment is already running on this route") from None
        raise ControlError(409, "conflicts with an existing row (duplicate name?)") from None


def _commit(db: Session) -> None:
    with _conflicts(db):
        db.commit()


def path_name(value: str, what: str) -> str:
    """A name from the URL path, or 404 when no row could have it (nothing reaches the database)."""
    if not value or len(value) > 128 or has_control(value):
        raise ControlError(404, f"no {what} with that name")
    return value


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
    name = path_name(name, "upstream")
    u = db.scalar(select(Upstream).where(Upstream.name == name))
    if u is None:
        raise ControlError(404, f"no upstream named {name!r}")
    return u


def list_upstreams(db: Session) -> list[dict[str, Any]]:
    return [upstream_out(u) for u in db.scalars(select(Upstream).order_by(Upstream.id))]


def get_upstream(db: Session, name: str) -> dict[str, Any]:
    return upstream_out(_upstream(db, name))


def create_upstream(db: Session, body: UpstreamIn, actor: str) -> dict[str, Any]:
    redaction.remember(body.api_key)  # masked in logs before anything can fail
    if db.scalar(select(Upstream.id).where(Upstream.name == body.name)) is not None:
        raise ControlError(409, f"upstream {body.name!r} already exists")
    u = Upstream(**body.model_dump())
    db.add(u)
    db.flush()
    _audit(db, actor, "create", "upstream", u.name, None, upstream_out(u))
    _commit(db)
    return upstream_out(u)


def update_upstream(db: Session, name: str, body: UpstreamPatch, actor: str) -> dict[str, Any]:
    redaction.remember(body.api_key)  # masked in logs before anything can fail
    u = _upstream(db, name)
    before = upstream_out(u)
    for key, value in body.model_dump(exclude_unset=True).items():
        setattr(u, key, value)
    u.updated_at = func.now()
    db.flush()
    db.refresh(u)
    after = upstream_out(u)
    if after["base_url"] != before["base_url"]:
        _require_gates_of_users(db, u)
    _audit(db, actor, "update", "upstream", u.name, before, after)
    _commit(db)
    return after


def delete_upstream(db: Session, name: str, actor: str) -> None:
    u = _upstream(db, name)
    if db.scalar(select(func.count()).select_from(Variant).where(Variant.upstream_id == u.id)):
        raise ControlError(409, f"upstream {name!r} is used by experiment variants")
    _audit(db, actor, "delete", "upstream", u.name, upstream_out(u), None)
    db.delete(u)
    _commit(db)


# --- experiments -------------------------------------------------------------------------

_EXP_FIELDS: Final = (
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
    "blinding",
    "metrics",
    "segment_tags",
    "rollout_plan",
    "rollout_stage",
    "status_reason",
)


def experiment_out(e: Experiment) -> dict[str, Any]:
    out = {k: getattr(e, k) for k in _EXP_FIELDS}
    out["segment_tags"] = list(out["segment_tags"] or [])
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


def _experiment_id(db: Session, id_or_name: str) -> int:
    if id_or_name.isascii() and id_or_name.isdigit():
        if len(id_or_name) > 10 or int(id_or_name) > MAX_ID:
            raise ControlError(404, f"no experiment {id_or_name!r}")
        cond = Experiment.id == int(id_or_name)
    else:
        cond = Experiment.name == path_name(id_or_name, "experiment")
    eid = db.scalar(select(Experiment.id).where(cond))
    if eid is None:
        raise ControlError(404, f"no experiment {id_or_name!r}")
    return int(eid)


def _load(db: Session, eid: int, *, for_update: bool = False) -> Experiment:
    q = select(Experiment).where(Experiment.id == eid).execution_options(populate_existing=True)
    if for_update:
        # The variants first (their weights are what a racing writer changes), then the row.
        db.execute(select(Variant.id).where(Variant.experiment_id == eid).with_for_update())
        q = q.with_for_update()
    e = db.scalar(q.options(selectinload(Experiment.variants).selectinload(Variant.upstream)))
    if e is None:
        raise ControlError(404, f"no experiment {eid}")
    return e


def _locked(db: Session, id_or_name: str) -> Experiment:
    """The experiment, locked for a change: its advisory lock, then the rows ``FOR UPDATE``."""
    eid = _experiment_id(db, id_or_name)
    lock(db.connection(), eid)
    return _load(db, eid, for_update=True)


def _upstream_ids(db: Session) -> dict[str, int]:
    return {name: uid for uid, name in db.execute(select(Upstream.id, Upstream.name))}


def _set_variants(e: Experiment, variants: list[VariantIn], ids: dict[str, int]) -> None:
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


def list_experiments(db: Session) -> list[dict[str, Any]]:
    q = select(Experiment).options(selectinload(Experiment.variants).selectinload(Variant.upstream))
    return [experiment_out(e) for e in db.scalars(q.order_by(Experiment.id))]


def get_experiment(db: Session, id_or_name: str) -> dict[str, Any]:
    return experiment_out(_load(db, _experiment_id(db, id_or_name)))


def create_experiment(db: Session, body: ExperimentIn, actor: str) -> dict[str, Any]:
    fields = body.model_dump(exclude={"variants"})
    ids = _upstream_ids(db)
    reason = check_experiment(fields, body.variants, set(ids))
    if reason:
        raise ControlError(422, reason)
    if db.scalar(select(Experiment.id).where(Experiment.name == body.name)) is not None:
        raise ControlError(409, f"experiment {body.name!r} already exists")
    fields["salt"] = fields["salt"] or secrets.token_hex(8)
    e = Experiment(**fields, status="draft")
    _set_variants(e, body.variants, ids)
    db.add(e)
    db.flush()
    e = _load(db, e.id)
    _audit(db, actor, "create", "experiment", e.id, None, experiment_out(e))
    _commit(db)
    return experiment_out(e)


def _staged(e: Experiment) -> bool:
    """A rollout whose stages have begun: from now on its stage decides its weights."""
    return e.mode == "rollout" and e.status in ("running", "paused") and e.stage_started_at is not None


def _refuse_stage_edits(e: Experiment, body: ExperimentPatch, changes: dict[str, Any]) -> None:
    if not _staged(e):
        return
    touched = []
    if "rollout_stage" in changes and changes["rollout_stage"] != e.rollout_stage:
        touched.append("rollout_stage")
    if body.variants is not None:
        now = {v.name: v.weight for v in e.variants}
        if {v.name: v.weight for v in body.variants} != now:
            touched.append("variant weights")
    if touched:
        raise ControlError(
            409,
            f"rollout {e.name!r} is {e.status} at stage {e.rollout_stage}, whose percent sets the weights: "
            f"{' and '.join(touched)} cannot be edited; use the rollout actions (advance, pause, resume, "
            "rollback), or stop the rollout first",
        )


#: What a started experiment's data is recorded under: each arm's upstream, model and role
#: (the names are the set itself), the mode and unit key that assigned its units, and an A/B
#: experiment's weights.
_FIXED_ONCE_STARTED: Final = ("mode", "unit_key")
_FIXED_ARM_FIELDS: Final = ("upstream", "model", "is_control")
_FIXED_AB_ARM_FIELDS: Final = (*_FIXED_ARM_FIELDS, "weight")


def _refuse_identity_edits(
    e: Experiment, before: dict[str, Any], body: ExperimentPatch, changes: dict[str, Any]
) -> None:
    """Once an experiment has started (running, paused or stopped), its events and rollups
    are keyed by arm name and its units were assigned by its mode and unit key: a renamed,
    added or dropped arm, an arm pointed at another upstream or model, a new control, mode
    or unit key would mix two treatments under one name or leave recorded arms out of the
    report. An A/B experiment's weights are fixed too: its report tests every unit against
    them (SRM), and a mid-run ramp moves units between arms and weighs the arms' periods
    differently (Simpson's paradox); a rollout ramps through stages, each tested with its
    own weights. Coverage and the other settings stay editable."""
    if e.started_at is None:
        return
    ab = before["mode"] == "ab"
    touched = [
        f"{key} {before[key]!r} -> {changes[key]!r}"
        for key in _FIXED_ONCE_STARTED
        if key in changes and changes[key] != before[key]
    ]
    if body.variants is not None:
        now = {v["name"]: v for v in before["variants"]}
        new = {v.name: v for v in body.variants}
        touched += [f"arm {name!r} added" for name in new if name not in now]
        touched += [f"arm {name!r} dropped" for name in now if name not in new]
        touched += [
            f"arm {name!r} {field} {now[name][field]!r} -> {getattr(v, field)!r}"
            for name, v in new.items()
            if name in now
            for field in (_FIXED_AB_ARM_FIELDS if ab else _FIXED_ARM_FIELDS)
            if getattr(v, field) != now[name][field]
        ]
    if touched:
        fixed = "arms, mode, unit key and, in an A/B test, weights" if ab else "arms, mode and unit key"
        raise ControlError(
            409,
            f"experiment {e.name!r} has started ({e.status}) and its data is recorded under its {fixed}: "
            f"{'; '.join(touched)} cannot change. Coverage, targeting and the other settings can; to ramp a "
            "candidate, run a rollout (mode: rollout); for another treatment or split, stop this experiment "
            "and create a new one",
        )


def update_experiment(db: Session, id_or_name: str, body: ExperimentPatch, actor: str) -> dict[str, Any]:
    e = _locked(db, id_or_name)
    before = experiment_out(e)
    changes = body.model_dump(exclude_unset=True, exclude={"variants"})
    _refuse_identity_edits(e, before, body, changes)
    _refuse_stage_edits(e, body, changes)
    merged = {**before, **changes}
    ids = _upstream_ids(db)
    variants = body.variants if body.variants is not None else [VariantIn(**v) for v in before["variants"]]
    reason = check_experiment(merged, variants, set(ids))
    if reason:
        raise ControlError(422, reason)
    if e.status == "running" and "route" in changes and _running_elsewhere(db, changes["route"], e.id):
        raise ControlError(422, "another experiment is already running on this route")
    if "segment_tags" in changes and changes["segment_tags"] != before["segment_tags"]:
        # Ingest folds each batch by the declaration it read at its start: wait for the
        # batches in flight, and hold new ones until this commits (rollups.declared_segments).
        _lock_segment_folds(db)
    for key, value in changes.items():
        setattr(e, key, value)
    if body.variants is not None:
        _set_variants(e, body.variants, ids)
    e.updated_at = func.now()
    db.flush()
    db.expire_all()
    after = _load(db, e.id)
    if after.status == "running":
        _require_gate(db, after)
    _audit(db, actor, "update", "experiment", e.id, before, experiment_out(after))
    _commit(db)
    return experiment_out(after)


def _lock_segment_folds(db: Session) -> None:
    """Exclude ingest's segment folds until this transaction ends (they take ROW EXCLUSIVE)."""
    db.execute(text("LOCK TABLE segment_rollups IN SHARE ROW EXCLUSIVE MODE"))


def backfill_segments(
    db: Session, id_or_name: str, body: SegmentBackfillIn, actor: str, backfill: SegmentBackfill
) -> dict[str, Any]:
    """Recompute the segments of declared tag keys from the stored requests (a key declared
    after traffic began has segments only from then on). One transaction: the experiment's
    lock, ingest's segment folds held (batches in flight finish first, new ones wait), the
    keys' segment rows deleted and folded again, the audit row."""
    eid = _experiment_id(db, id_or_name)
    lock(db.connection(), eid)
    e = _load(db, eid)
    declared = list(e.segment_tags or [])
    keys = body.keys if body.keys is not None else [k for k in declared if k != ROLLOUT_STAGE_TAG]
    if ROLLOUT_STAGE_TAG in keys:
        raise ControlError(422, f"{ROLLOUT_STAGE_TAG} is always rolled up: there is nothing to backfill")
    undeclared = [k for k in keys if k not in declared]
    if undeclared:
        raise ControlError(
            422,
            f"not declared in segment_tags: {', '.join(map(repr, undeclared))}; declare them first (PATCH)",
        )
    if not keys:
        raise ControlError(422, "no segment tag keys to backfill: the experiment declares none")
    _lock_segment_folds(db)
    rows = backfill(db.connection(), eid, sorted(keys))
    result = {"experiment_id": eid, "keys": sorted(keys), "segment_rows": rows}
    _audit(db, actor, "backfill_segments", "experiment", eid, None, result)
    _commit(db)
    return result


def _require_gates_of_users(db: Session, u: Upstream) -> None:
    """An upstream's URL is part of its variants' gate fingerprints: every running
    experiment with a variant on ``u`` must still pass its offline gate (``_require_gate``)
    with the new URL, as it must when a variant is repointed. A paused one serves the
    control only and is checked when it starts again."""
    running = db.scalars(
        select(Experiment.id)
        .join(Variant, Variant.experiment_id == Experiment.id)
        .where(Variant.upstream_id == u.id, Experiment.status == "running")
        .distinct()
        .order_by(Experiment.id)
    ).all()
    for eid in running:
        lock(db.connection(), eid)
        e = _load(db, eid)
        try:
            _require_gate(db, e)
        except ControlError as exc:
            raise ControlError(
                409,
                f"upstream {u.name!r} serves running experiment {e.name!r}, whose offline gate does not vouch "
                f"for the new URL ({exc.reason}): pause the experiment, change the upstream, run its gate "
                "again, then start it",
            ) from None


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
            raise ControlError(409, f"variant {v.name!r}: {gate.reason}")


TRANSITIONS: Final = {
    "start": ({"draft", "paused"}, "running"),
    "pause": ({"running"}, "paused"),
    "stop": ({"draft", "running", "paused"}, "stopped"),
}


def transition(db: Session, id_or_name: str, action: str, actor: str) -> dict[str, Any]:
    e = _locked(db, id_or_name)
    allowed, target = TRANSITIONS[action]
    if e.status not in allowed:
        raise ControlError(409, f"cannot {action} an experiment that is {e.status}")
    if target == "running" and _running_elsewhere(db, e.route, e.id):
        raise ControlError(422, f"another experiment is already running on route {e.route!r}")
    if target == "running":
        _require_gate(db, e)
    before = experiment_out(e)
    with _conflicts(db):  # a start racing another one's on the same route
        rollout.set_status(db.connection(), e.id, target, f"{action} by {actor}", datetime.now(UTC))
    e = _load(db, e.id)
    _audit(db, actor, action, "experiment", e.id, before, experiment_out(e))
    _commit(db)
    return experiment_out(e)


# --- client API keys ---------------------------------------------------------------------


def key_out(k: ApiKey) -> dict[str, Any]:
    return {"name": k.name, "prefix": k.prefix, "revoked": k.revoked, "created_at": k.created_at.isoformat()}


def list_keys(db: Session) -> list[dict[str, Any]]:
    return [key_out(k) for k in db.scalars(select(ApiKey).order_by(ApiKey.id))]


def create_key(db: Session, body: ApiKeyIn, actor: str) -> dict[str, Any]:
    if db.scalar(select(ApiKey.id).where(ApiKey.name == body.name)) is not None:
        raise ControlError(409, f"api key {body.name!r} already exists")
    key = "lg-" + secrets.token_urlsafe(24)
    k = ApiKey(name=body.name, key_hash=key_hash(key), prefix=key[:8])
    db.add(k)
    db.flush()
    db.refresh(k)
    _audit(db, actor, "create", "api_key", k.name, None, key_out(k))
    _commit(db)
    return {**key_out(k), "key": key}


def revoke_key(db: Session, name: str, actor: str) -> dict[str, Any]:
    name = path_name(name, "api key")
    k = db.scalar(select(ApiKey).where(ApiKey.name == name))
    if k is None:
        raise ControlError(404, f"no api key named {name!r}")
    before = key_out(k)
    k.revoked = True
    db.flush()
    _audit(db, actor, "revoke", "api_key", k.name, before, key_out(k))
    _commit(db)
    return key_out(k)
