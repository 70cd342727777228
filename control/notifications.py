"""Notifications: webhooks, the outbox and the delivery log — the one writer of their tables.

An event is queued with :func:`emit` *in the caller's transaction*: a rollout decision and
its notification commit (or roll back) together, so a crash between the decision and the
sending loses nothing — the delivery worker (:mod:`control.webhook_sender`) finds the row
when it next looks. ``emit`` writes the event once (``notification_events``) and one
delivery per subscribed webhook (``webhook_deliveries``); a kind no webhook wants writes
nothing.

Anyone may call :func:`emit` with a kind from :data:`control.notify_payload.KINDS` — the
rollout decisions do it in :func:`control.rollout.record`, the offline gate in
:func:`control.gates.save_decision`, the RL-risk detectors with ``rl_risk.alarm``.

Delivery is at least once: a worker *claims* due deliveries (``FOR UPDATE SKIP LOCKED``,
the attempt counted and the row leased for the attempt's deadline), sends without holding a
transaction, then records the outcome; a worker that dies mid-send leaves a row whose lease
expires and is sent again. Receivers de-duplicate with ``X-Liftgate-Delivery``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson
from sqlalchemy import Connection, text

from contracts import redaction
from control import audit
from control.destinations import AddressPolicy, preview, url_problem
from control.errors import ControlError
from control.notify_payload import FORMATS, KINDS

ALL: Final = "*"
MIN_SECRET: Final = 16
MAX_ERROR: Final = 500


# --- webhooks ----------------------------------------------------------------------------


def _out(row: Any) -> dict[str, Any]:
    wid, name, url, secret, fmt, events, enabled, created, updated = row
    return {
        "id": int(wid),
        "name": str(name),
        "url": preview(str(url)),
        "signed": bool(secret),
        "format": str(fmt),
        "events": list(events),
        "enabled": bool(enabled),
        "created_at": created.isoformat(),
        "updated_at": updated.isoformat(),
    }


_COLS: Final = "id, name, url, secret, format, events, enabled, created_at, updated_at"


def list_webhooks(conn: Connection) -> list[dict[str, Any]]:
    return [_out(r) for r in conn.execute(text(f"SELECT {_COLS} FROM webhooks ORDER BY id"))]


def get_webhook(conn: Connection, name: str) -> dict[str, Any]:
    row = conn.execute(text(f"SELECT {_COLS} FROM webhooks WHERE name = :n"), {"n": name}).first()
    if row is None:
        raise ControlError(404, f"webhook {name!r} not found")
    return _out(row)


def webhook_problem(
    url: str, secret: str | None, fmt: str, events: list[str], policy: AddressPolicy
) -> str | None:
    """Why this webhook cannot be stored (a 422's reason), or None."""
    problem = url_problem(url, policy)
    if problem is not None:
        return problem
    if fmt not in FORMATS:
        return f"format must be one of {', '.join(FORMATS)}"
    if fmt == "json" and not secret:
        return "a json webhook needs a secret (--secret): its receiver verifies the signature with it"
    if secret is not None and (len(secret) < MIN_SECRET or len(secret) > 512):
        return f"secret must be {MIN_SECRET} to 512 characters"
    if secret is not None and any(ord(c) < 32 or ord(c) == 127 for c in secret):
        return "secret must not contain control characters"
    if not events:
        return f"events must name at least one kind (or {ALL!r} for all)"
    unknown = sorted({e for e in events if e != ALL and e not in KINDS})
    if unknown:
        return f"unknown event kind(s) {', '.join(unknown)}; expected {ALL!r} or some of {', '.join(KINDS)}"
    return None


def add_webhook(
    conn: Connection,
    *,
    name: str,
    url: str,
    secret: str | None,
    fmt: str,
    events: list[str],
    actor: str,
    policy: AddressPolicy,
) -> dict[str, Any]:
    redaction.remember(secret)  # masked in logs before anything can fail
    redaction.remember(url)
    problem = webhook_problem(url, secret, fmt, events, policy)
    if problem is not None:
        raise ControlError(422, problem)
    events = [ALL] if ALL in events else sorted(set(events))
    row = conn.execute(
        text(
            "INSERT INTO webhooks (name, url, secret, format, events) VALUES (:n, :u, :s, :f, CAST(:e AS jsonb))"
            f" ON CONFLICT (name) DO NOTHING RETURNING {_COLS}"
        ),
        {"n": name, "u": url, "s": secret, "f": fmt, "e": orjson.dumps(events).decode()},
    ).first()
    if row is None:
        raise ControlError(409, f"webhook {name!r} already exists")
    out = _out(row)
    audit.write(conn, actor=actor, action="create", entity="webhook", entity_id=name, before=None, after=out)
    return out


def remove_webhook(conn: Connection, name: str, actor: str) -> None:
    """Delete a webhook with its pending deliveries and its delivery log."""
    before = get_webhook(conn, name)
    conn.execute(text("DELETE FROM webhooks WHERE name = :n"), {"n": name})
    audit.write(
        conn, actor=actor, action="delete", entity="webhook", entity_id=name, before=before, after=None
    )


# --- the outbox --------------------------------------------------------------------------


def emit(
    conn: Connection,
    kind: str,
    data: dict[str, Any],
    *,
    experiment: dict[str, Any] | None = None,
    only_webhook: int | None = None,
    now: datetime | None = None,
) -> int | None:
    """Queue a notification in the caller's transaction; the event id, or None when no
    webhook subscribes to ``kind``. ``experiment`` is ``{"id", "name", "route"}``."""
    if kind not in KINDS:
        raise ValueError(f"unknown notification kind {kind!r}")
    hooks = conn.execute(
        text(
            "SELECT id FROM webhooks WHERE CASE WHEN CAST(:only AS integer) IS NULL"
            " THEN enabled AND (events @> CAST(:k AS jsonb) OR events @> CAST(:all AS jsonb))"
            " ELSE id = :only END"
        ),
        {"only": only_webhook, "k": orjson.dumps([kind]).decode(), "all": orjson.dumps([ALL]).decode()},
    ).all()
    if not hooks:
        return None
    stored = {
        "type": kind,
        "created_at": (now.isoformat() if now is not None else None),
        "experiment": experiment,
        "data": data,
    }
    eid = int(
        conn.execute(
            text(
                "INSERT INTO notification_events (kind, experiment_id, payload, created_at)"
                " VALUES (:k, :e, CAST(:p AS jsonb), coalesce(:t, now())) RETURNING id"
            ),
            {
                "k": kind,
                "e": None if experiment is None else experiment.get("id"),
                "p": orjson.dumps(stored, option=orjson.OPT_NON_STR_KEYS).decode(),
                "t": now,
            },
        ).scalar_one()
    )
    conn.execute(
        text(
            "INSERT INTO webhook_deliveries (event_id, webhook_id)"
            " SELECT :e, id FROM unnest(CAST(:ids AS integer[])) AS id"
        ),
        {"e": eid, "ids": [int(h[0]) for h in hooks]},
    )
    return eid


def rollout_decision(
    conn: Connection,
    experiment: dict[str, Any],
    decision: Any,
    *,
    actor: str,
    decision_id: int,
    now: datetime,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    """The notifications of one recorded rollout decision: ``rollout.<decision>``, and
    ``srm`` / ``guardrail.failed`` / ``offline_gate.failed`` when its evidence says so."""
    evidence = dict(decision.evidence)
    weights = (after or {}).get("weights") or {}
    control = (after or {}).get("control")
    candidate_pct = next((float(w) for n, w in weights.items() if n != control), None)
    data = {
        "decision": decision.decision,
        "decision_id": decision_id,
        "reason": decision.reason,
        "code": decision.code,
        "actor": actor,
        "stage": decision.stage,
        "to_stage": decision.to_stage,
        "stage_percent": evidence.get("stage_percent", candidate_pct),
        "status": (after or {}).get("status"),
        "weights_before": (before or {}).get("weights"),
        "weights_after": weights or None,
    }
    kind = f"rollout.{decision.decision}"
    if kind in KINDS:
        emit(conn, kind, data, experiment=experiment, now=now)
    srm = evidence.get("srm")
    if decision.code == "srm" or (isinstance(srm, dict) and srm.get("flagged")):
        emit(conn, "srm", {**data, "srm": srm}, experiment=experiment, now=now)
    if decision.code == "guardrail":
        harmed = [
            g for g in evidence.get("guardrails", []) if isinstance(g, dict) and g.get("outcome") == "harm"
        ]
        emit(conn, "guardrail.failed", {**data, "guardrails": harmed}, experiment=experiment, now=now)
    if decision.code == "offline_gate":
        emit(conn, "offline_gate.failed", {**data, "offline_gate": evidence.get("offline_gate")},
             experiment=experiment, now=now)  # fmt: skip


def queue_test(conn: Connection, name: str, actor: str, now: datetime) -> int:
    """A ``test`` event for one webhook (whatever kinds it subscribes to); its delivery id."""
    hook = get_webhook(conn, name)
    data = {"message": f"test notification sent by {actor}", "actor": actor}
    eid = emit(conn, "test", data, only_webhook=hook["id"], now=now)
    assert eid is not None
    return int(
        conn.execute(text("SELECT id FROM webhook_deliveries WHERE event_id = :e"), {"e": eid}).scalar_one()
    )


# --- delivery ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """One delivery attempt the worker now holds (its lease ends at the attempt's deadline)."""

    delivery_id: int
    attempt: int
    webhook: str
    url: str
    secret: str | None
    format: str
    body: dict[str, Any]


def claim(conn: Connection, limit: int, lease_s: float, delivery_id: int | None = None) -> list[Claimed]:
    """Take up to ``limit`` due deliveries: count the attempt and lease the row for ``lease_s``."""
    rows = conn.execute(
        text(
            "WITH due AS (SELECT id FROM webhook_deliveries WHERE status = 'pending'"
            " AND (CAST(:one AS bigint) IS NULL AND next_attempt_at <= now() OR id = :one)"
            " ORDER BY next_attempt_at, id LIMIT :n FOR UPDATE SKIP LOCKED)"
            " UPDATE webhook_deliveries d SET attempts = d.attempts + 1,"
            " next_attempt_at = now() + make_interval(secs => :lease)"
            " FROM due, webhooks w, notification_events e"
            " WHERE d.id = due.id AND w.id = d.webhook_id AND e.id = d.event_id"
            " RETURNING d.id, d.attempts, w.name, w.url, w.secret, w.format, e.id, e.payload, e.created_at"
        ),
        {"n": limit, "lease": lease_s, "one": delivery_id},
    ).all()
    out = []
    for did, attempts, name, url, secret, fmt, eid, payload, created in rows:
        redaction.remember(secret)
        redaction.remember(url)
        stored = dict(payload)
        stored["created_at"] = stored.get("created_at") or created.isoformat()
        out.append(
            Claimed(
                int(did), int(attempts), str(name), str(url), secret, str(fmt), {"id": f"evt_{eid}", **stored}
            )
        )
    return out


def backoff_s(attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """The wait after failed attempt ``attempt`` (1-based): exponential, capped, half jittered
    (so receivers that failed together are not retried in lockstep)."""
    full = min(cap_s, base_s * 2.0 ** min(attempt - 1, 60))
    return full / 2 + (rng or random).uniform(0, full / 2)


def finish(
    conn: Connection,
    claimed: Claimed,
    *,
    ok: bool,
    status_code: int | None,
    error: str | None,
    latency_ms: float | None,
    retry_in_s: float | None,
) -> str:
    """Record an attempt's outcome; the delivery's new status. ``retry_in_s`` None after a
    failure: no more attempts (bounded attempts, or a refusal retrying cannot change)."""
    status = "delivered" if ok else ("pending" if retry_in_s is not None else "failed")
    conn.execute(
        text(
            "UPDATE webhook_deliveries SET status = :st, last_status = :code, last_error = :err,"
            " latency_ms = :lat, delivered_at = CASE WHEN CAST(:ok AS boolean) THEN now() ELSE delivered_at END,"
            " next_attempt_at = CASE WHEN CAST(:retry AS double precision) IS NULL THEN next_attempt_at"
            " ELSE now() + make_interval(secs => CAST(:retry AS double precision)) END"
            # A lease that ran out let another worker take a later attempt: that one records.
            " WHERE id = :id AND attempts = :attempt AND status = 'pending'"
        ),
        {
            "st": status,
            "code": status_code,
            "err": None if error is None else redaction.redact(error)[:MAX_ERROR],
            "lat": latency_ms,
            "ok": ok,
            "retry": retry_in_s,
            "id": claimed.delivery_id,
            "attempt": claimed.attempt,
        },
    )
    return status


def deliveries(
    conn: Connection, *, webhook: str | None = None, status: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The delivery log, newest first."""
    rows = conn.execute(
        text(
            "SELECT d.id, w.name, e.id, e.kind, e.experiment_id, d.status, d.attempts, d.last_status,"
            " d.last_error, d.latency_ms, d.next_attempt_at, d.delivered_at, d.created_at"
            " FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id"
            " JOIN notification_events e ON e.id = d.event_id"
            " WHERE (CAST(:w AS text) IS NULL OR w.name = :w) AND (CAST(:s AS text) IS NULL OR d.status = :s)"
            " ORDER BY d.created_at DESC, d.id DESC LIMIT :n"
        ),
        {"w": webhook, "s": status, "n": limit},
    )
    return [
        {
            "id": int(did),
            "webhook": str(name),
            "event_id": f"evt_{eid}",
            "type": str(kind),
            "experiment_id": exp,
            "status": str(st),
            "attempts": int(attempts),
            "last_status": last_status,
            "last_error": last_error,
            "latency_ms": latency,
            "next_attempt_at": nxt.isoformat() if st == "pending" else None,
            "delivered_at": None if delivered is None else delivered.isoformat(),
            "created_at": created.isoformat(),
        }
        for did, name, eid, kind, exp, st, attempts, last_status, last_error, latency, nxt, delivered, created in rows
    ]
