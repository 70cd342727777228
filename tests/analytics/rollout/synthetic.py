"""Rollout test helpers: a committed rollout experiment and synthetic per-unit traffic.

Traffic is synthetic but goes through the real path from the gateway's point of view:
each unit's variant comes from the gateway's assignment function with the weights
currently in the database, and the events are written with analytics' real ingest
function (raw rows + rollups). The clock is injected, so a test steps time instead of
sleeping.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from hashlib import blake2b
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from contracts.events import ROLLOUT_STAGE_TAG, Event, FeedbackEvent, InteractionEvent
from gateway.assignment import choose, layout_from_weights

if TYPE_CHECKING:
    from analytics.rollout.controller import Controller

T0 = datetime(2026, 1, 1, tzinfo=UTC)

#: Fast plan for tests: 5 stages, seconds-long minimums.
FAST_PLAN: dict[str, Any] = {
    "stages": [5, 10, 25, 50, 100],
    "min_duration_s": 10,
    "min_units": 10,
    "interval_s": 0,
    "planned_units": 2000,
}


SALT = "synthetic"


def create_rollout(
    engine: Engine, plan: dict[str, Any] | None, *, status: str = "running", salt: str | None = None
) -> tuple[int, str, str]:
    """A rollout experiment (control 100 / candidate 0), committed; returns (id, name, salt).

    The salt decides every unit's arm: it is fixed (``SALT`` unless given) so that a test
    with seeded traffic repeats exactly — a random one made outcomes that hold in 95% or
    99.9% of runs (a detection time, an SRM flag at p < 0.001) fail now and then."""
    tag = secrets.token_hex(4)
    name, salt = f"rollout-{tag}", salt or SALT
    with engine.begin() as conn:
        up = conn.execute(
            text("INSERT INTO upstreams (name, base_url) VALUES (:n, 'http://127.0.0.1:9') RETURNING id"),
            {"n": f"up-{tag}"},
        ).scalar_one()
        eid = conn.execute(
            text(
                "INSERT INTO experiments (name, route, mode, status, salt, rollout_plan, started_at)"
                " VALUES (:n, :r, 'rollout', :s, :salt, CAST(:p AS jsonb), now()) RETURNING id"
            ),
            {"n": name, "r": f"route-{tag}", "s": status, "salt": salt, "p": orjson.dumps(plan).decode()},
        ).scalar_one()
        for vname, weight, ctl in (("control", 100.0, True), ("candidate", 0.0, False)):
            conn.execute(
                text(
                    "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                    " VALUES (:e, :n, :u, 'm', :w, :c)"
                ),
                {"e": eid, "n": vname, "u": up, "w": weight, "c": ctl},
            )
    return int(eid), name, salt


def experiment_state(engine: Engine, eid: int) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT status, rollout_stage, stage_started_at, status_reason FROM experiments WHERE id = :e"
            ),
            {"e": eid},
        ).one()
        rows = conn.execute(text("SELECT name, weight FROM variants WHERE experiment_id = :e"), {"e": eid})
        weights = {str(n): float(w) for n, w in rows}
        controls = [
            r[0]
            for r in conn.execute(
                text("SELECT name FROM variants WHERE experiment_id = :e AND is_control"), {"e": eid}
            )
        ]
    return {
        "status": row[0],
        "stage": row[1],
        "stage_started_at": row[2],
        "reason": row[3],
        "weights": weights,
        "controls": controls,
    }


def decisions(engine: Engine, eid: int) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT decision, stage, to_stage, reason, actor, evidence, created_at FROM rollout_decisions"
                " WHERE experiment_id = :e ORDER BY created_at, id"
            ),
            {"e": eid},
        )
        return [dict(r._mapping) for r in rows]


@dataclass
class Profile:
    """How a variant behaves per request."""

    error_p: float = 0.05
    latency_ms: float = 400.0  # median of the lognormal request latency
    latency_sigma: float = 0.4  # its log-scale sd (a heavier tail at a larger value)
    tokens: float = 120.0
    thumbs_down_p: float = 0.05


@dataclass
class Clock:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class SyntheticTraffic:
    """Per-unit requests and feedback; each unit's variant follows the DB's current weights."""

    engine: Engine
    experiment_id: int
    salt: str
    units: list[str]
    profiles: dict[str, Profile]
    rng: np.random.Generator
    # Lognormal activity: a few heavy units send most requests, as in real products.
    activity: np.ndarray = field(init=False)
    drop_candidate_units: float = 0.0  # share of candidate units whose events are lost (SRM)
    # Every request from a unit never seen before (new users: one request per unit).
    fresh_units: bool = False
    _fresh: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        w = self.rng.lognormal(0.0, 1.0, len(self.units))
        self.activity = w / w.sum()

    def weights(self) -> list[tuple[str, float, bool]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT name, weight, is_control FROM variants WHERE experiment_id = :e ORDER BY id"),
                {"e": self.experiment_id},
            ).all()
        return [(str(n), float(w), bool(c)) for n, w, c in rows]

    def step(self, ts: datetime, requests: int) -> int:
        """Send ``requests`` requests at time ``ts``; returns how many were ingested."""
        layout = layout_from_weights(self.weights())
        with self.engine.connect() as conn:
            stage = conn.execute(
                text("SELECT rollout_stage FROM experiments WHERE id = :e"), {"e": self.experiment_id}
            ).scalar_one()
        # What the gateway does for a running rollout: tag each call with its stage.
        tags = {ROLLOUT_STAGE_TAG: str(stage)} if stage is not None else {}
        if self.fresh_units:
            first, self._fresh = self._fresh, self._fresh + requests
            names = [f"{self.units[0]}-new-{i}" for i in range(first, self._fresh)]
        else:
            picks = self.rng.choice(len(self.units), size=requests, p=self.activity)
            names = [self.units[int(i)] for i in picks]
        events: list[Event] = []
        for unit in names:
            variant = choose(self.salt, unit, layout)
            if (
                variant == "candidate"
                and self.drop_candidate_units
                and _lost(unit, self.drop_candidate_units)
            ):
                continue
            p = self.profiles[variant]
            err = bool(self.rng.random() < p.error_p)
            rid = secrets.token_hex(8)
            events.append(
                InteractionEvent(
                    request_id=rid, route="r", unit_id=unit, unit_source="header", role="primary", mode="rollout",
                    endpoint="chat", model="m", upstream="u", status="error" if err else "ok",
                    http_status=502 if err else 200, latency_ms=float(self.rng.lognormal(np.log(p.latency_ms), p.latency_sigma)),
                    experiment_id=self.experiment_id, variant=variant,
                    completion_tokens=None if err else int(self.rng.poisson(p.tokens)), ts=ts.timestamp(),
                    tags=tags,
                )
            )  # fmt: skip
            if not err and self.rng.random() < p.thumbs_down_p:
                events.append(
                    FeedbackEvent(request_id=rid, unit_id=unit, kind="thumbs_down", ts=ts.timestamp())
                )
        if events:
            ingest(self.engine, events)
        return len(events)


def _lost(unit: str, share: float) -> bool:
    return int.from_bytes(blake2b(unit.encode(), digest_size=4).digest(), "big") % 1000 < share * 1000


def make_traffic(
    engine: Engine,
    eid: int,
    salt: str,
    candidate: Profile,
    *,
    units: int = 400,
    seed: int = 0,
    control: Profile | None = None,
    fresh_units: bool = False,
) -> SyntheticTraffic:
    """``units`` recurring units with lognormal activity, or (``fresh_units``) a new unit per request."""
    rng = np.random.default_rng(seed)
    names = [f"u{seed}-{i:05d}" for i in range(units)]
    profiles = {"control": control or Profile(), "candidate": candidate}
    return SyntheticTraffic(engine, eid, salt, names, profiles, rng, fresh_units=fresh_units)


def drive(
    controller: Controller,
    clock: Clock,
    traffic: SyntheticTraffic,
    steps: int,
    requests: int,
    step_s: float = 5.0,
) -> str:
    """Traffic then a look, every ``step_s`` simulated seconds, until the rollout ends or
    ``steps`` looks were taken; the experiment's status at the end."""
    status = "running"
    for _ in range(steps):
        clock.step(step_s)
        traffic.step(clock.now, requests)
        controller.evaluate(traffic.experiment_id)
        status = experiment_state(traffic.engine, traffic.experiment_id)["status"]
        if status != "running":
            break
    return status
