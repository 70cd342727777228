"""Rollout traffic for report tests: a unit population ramped through stages, every call
assigned the way the gateway assigns it and written by analytics' real ingest function.

Each call's variant comes from ``gateway.assignment`` with the weights in the database at
that moment, and each call is tagged ``rollout_stage=<index>`` as the gateway tags calls of
a running rollout. Stages change either by the real controller or by :meth:`Ramp.set_stage`
(plain SQL, what ``control.rollout.set_stage`` writes), so a test decides whether the
controller's policy is part of what it checks.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from hashlib import blake2b
from typing import Any

import numpy as np
import orjson
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

from analytics.ingest.write import ingest
from contracts.events import ROLLOUT_STAGE_TAG, Event, FeedbackEvent, InteractionEvent
from gateway.assignment import choose, layout_from_weights

T0 = datetime(2026, 1, 1, tzinfo=UTC)
Target = Engine | Session


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How a variant answers: per-call error chance, latency (lognormal) and length."""

    error_p: float = 0.02
    latency_ms: float = 400.0
    latency_sigma: float = 0.4
    tokens: float = 120.0
    thumbs_down_p: float = 0.05


def _write(target: Target, sql: str, params: dict[str, Any]) -> None:
    if isinstance(target, Session):
        target.connection().execute(text(sql), params)
        return
    with target.begin() as conn:
        conn.execute(text(sql), params)


def _read(target: Target, sql: str, params: dict[str, Any]) -> list[Any]:
    if isinstance(target, Session):
        return list(target.connection().execute(text(sql), params).all())
    with target.connect() as conn:
        return list(conn.execute(text(sql), params).all())


def create_rollout(
    target: Target,
    plan: dict[str, Any] | None,
    *,
    metrics: list[Any] | None = None,
    status: str = "running",
    salt: str | None = None,
) -> tuple[int, str]:
    """A rollout (control 100 / candidate 0) not yet started; returns (id, salt). A fixed
    ``salt`` makes the assignment, and with a seeded population the whole run, repeatable."""
    tag = secrets.token_hex(4)
    salt = salt or f"salt-{tag}"

    def write(conn: Connection) -> int:
        up = conn.execute(
            text("INSERT INTO upstreams (name, base_url) VALUES (:n, 'http://127.0.0.1:9') RETURNING id"),
            {"n": f"up-{tag}"},
        ).scalar_one()
        eid = int(
            conn.execute(
                text(
                    "INSERT INTO experiments (name, route, mode, status, salt, rollout_plan, metrics, started_at)"
                    " VALUES (:n, :r, 'rollout', :s, :salt, CAST(:p AS jsonb), CAST(:m AS jsonb), :t) RETURNING id"
                ),
                {"n": f"ramp-{tag}", "r": f"route-{tag}", "s": status, "salt": salt,
                 "p": orjson.dumps(plan).decode(), "m": orjson.dumps(metrics or []).decode(), "t": T0},
            ).scalar_one()
        )  # fmt: skip
        for name, weight, control in (("control", 100.0, True), ("candidate", 0.0, False)):
            conn.execute(
                text(
                    "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                    " VALUES (:e, :n, :u, 'm', :w, :c)"
                ),
                {"e": eid, "n": name, "u": up, "w": weight, "c": control},
            )
        return eid

    if isinstance(target, Session):
        return write(target.connection()), salt
    with target.begin() as conn:
        return write(conn), salt


def _lost(unit: str, share: float) -> bool:
    """A fixed share of units whose candidate events never arrive (a logging bug)."""
    return int.from_bytes(blake2b(unit.encode(), digest_size=4).digest(), "big") % 1000 < share * 1000


@dataclass
class Ramp:
    """A population of units sending calls to one rollout experiment."""

    target: Target
    experiment_id: int
    salt: str
    units: list[str]
    rng: np.random.Generator
    behaviour: dict[str, Behaviour] = field(
        default_factory=lambda: {"control": Behaviour(), "candidate": Behaviour()}
    )
    # Share of candidate units whose events are lost on the way (an SRM the report must see).
    lose_candidate: float = 0.0
    # Tag calls with their stage, as the gateway does (False: data from before the tag).
    tag_stages: bool = True
    activity: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        # Lognormal activity: a few heavy units send most calls, as in real products.
        w = self.rng.lognormal(0.0, 1.0, len(self.units))
        self.activity = w / w.sum()

    def set_stage(self, stage: int, percent: float, at: datetime) -> None:
        """Move to ``stage``: candidate ``percent``, control the rest, the stage clock at ``at``."""
        for name, weight in (("control", 100.0 - percent), ("candidate", percent)):
            _write(
                self.target,
                "UPDATE variants SET weight = :w WHERE experiment_id = :e AND name = :n",
                {"w": weight, "e": self.experiment_id, "n": name},
            )
        _write(
            self.target,
            "UPDATE experiments SET rollout_stage = :s, stage_started_at = :t WHERE id = :e",
            {"s": stage, "t": at, "e": self.experiment_id},
        )

    def send(self, start: datetime, calls: int, seconds: float = 60.0) -> int:
        """``calls`` calls spread over ``seconds`` from ``start``; returns events ingested."""
        weights = _read(
            self.target,
            "SELECT name, weight, is_control FROM variants WHERE experiment_id = :e ORDER BY id",
            {"e": self.experiment_id},
        )
        [(stage, status)] = _read(
            self.target,
            "SELECT rollout_stage, status FROM experiments WHERE id = :e",
            {"e": self.experiment_id},
        )
        if status != "running":
            return 0
        layout = layout_from_weights([(str(n), float(w), bool(c)) for n, w, c in weights])
        tags = {ROLLOUT_STAGE_TAG: str(stage)} if stage is not None and self.tag_stages else {}
        picks = self.rng.choice(len(self.units), size=calls, p=self.activity)
        offsets = np.sort(self.rng.uniform(0.0, seconds, calls))
        events: list[Event] = []
        for i, offset in zip(picks, offsets, strict=True):
            unit = self.units[int(i)]
            variant = choose(self.salt, unit, layout)
            if variant == "candidate" and self.lose_candidate and _lost(unit, self.lose_candidate):
                continue
            b = self.behaviour[variant]
            ts = (start + timedelta(seconds=float(offset))).timestamp()
            failed = bool(self.rng.random() < b.error_p)
            rid = secrets.token_hex(8)
            events.append(
                InteractionEvent(
                    request_id=rid, route="r", unit_id=unit, unit_source="header", role="primary",
                    mode="rollout", endpoint="chat", model="m", upstream="u",
                    status="error" if failed else "ok", http_status=502 if failed else 200,
                    latency_ms=float(self.rng.lognormal(np.log(b.latency_ms), b.latency_sigma)),
                    experiment_id=self.experiment_id, variant=variant,
                    completion_tokens=None if failed else int(self.rng.poisson(b.tokens)), ts=ts, tags=tags,
                )
            )  # fmt: skip
            if not failed and self.rng.random() < b.thumbs_down_p:
                events.append(FeedbackEvent(request_id=rid, unit_id=unit, kind="thumbs_down", ts=ts))
        if events:
            ingest(self.target, events)
        return len(events)


def population(target: Target, experiment_id: int, salt: str, units: int, seed: int, **kw: Any) -> Ramp:
    names = [f"u{seed}-{i:05d}" for i in range(units)]
    return Ramp(target, experiment_id, salt, names, np.random.default_rng(seed), **kw)
