"""Experiment data for the dashboard tests: a few experiments whose reports exercise every
part of the page (significant wins and losses, guardrails, segments, a time series, a
rollout timeline, shadow pairs).

Experiments are rows in ``experiments``/``variants`` (what the gateway's admin API
writes); traffic is written as events (``contracts.events``) through the real ingest
function (``analytics.ingest.write.ingest``), in batches with a snapshot between batches so the
cumulative-lift series has several points.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
from sqlalchemy import Connection, Engine, text

from analytics.ingest.write import ingest
from contracts.events import Event, FeedbackEvent, InteractionEvent, new_event_id

TASKS = ("code", "math", "chat")


@dataclass(frozen=True, slots=True)
class VariantSpec:
    name: str
    weight: float
    control: bool = False
    # Behaviour relative to the baseline: multipliers on rates and means.
    thumbs_up: float = 0.20
    thumbs_down: float = 0.05
    error: float = 0.01
    latency_ms: float = 800.0
    tokens: float = 200.0
    # Per-task multiplier on thumbs-up (a candidate that regresses on one kind of task).
    task_thumbs: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExperimentSpec:
    name: str
    route: str
    mode: Literal["ab", "shadow", "rollout"]
    variants: Sequence[VariantSpec]
    status: str = "running"
    stage: int | None = None
    rollout_plan: dict[str, Any] | None = None


def create_experiment(conn: Connection, spec: ExperimentSpec) -> int:
    up = conn.execute(
        text(
            "INSERT INTO upstreams (name, base_url) VALUES (:n, 'http://127.0.0.1:9/v1')"
            " ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id"
        ),
        {"n": f"sim-{spec.name}"},
    ).scalar_one()
    started = datetime.now(UTC) - timedelta(hours=2)
    eid = conn.execute(
        text(
            "INSERT INTO experiments (name, route, mode, status, salt, rollout_plan, rollout_stage,"
            " stage_started_at, started_at, segment_tags) VALUES (:n, :r, :m, :s, :salt, CAST(:plan AS jsonb),"
            " :stage, :ss, :st, '{task}') RETURNING id"
        ),
        {
            "n": spec.name,
            "r": spec.route,
            "m": spec.mode,
            "s": spec.status,
            "salt": secrets.token_hex(8),
            "plan": None if spec.rollout_plan is None else json.dumps(spec.rollout_plan),
            "stage": spec.stage,
            "ss": started if spec.mode == "rollout" else None,
            "st": None if spec.status == "draft" else started,
        },
    ).scalar_one()
    for v in spec.variants:
        conn.execute(
            text(
                "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                " VALUES (:e, :n, :u, :m, :w, :c)"
            ),
            {"e": eid, "n": v.name, "u": up, "m": f"model-{v.name}", "w": v.weight, "c": v.control},
        )
    return int(eid)


def _interaction(
    spec: ExperimentSpec, eid: int, v: VariantSpec, unit: str, **fields: Any
) -> InteractionEvent:
    return InteractionEvent(
        route=spec.route, unit_id=unit, unit_source="header", mode=spec.mode, endpoint="chat",
        model=f"model-{v.name}", upstream=f"sim-{spec.name}", experiment_id=eid, experiment=spec.name,
        variant=v.name, **fields,
    )  # fmt: skip


def unit_events(
    spec: ExperimentSpec, eid: int, v: VariantSpec, unit: str, rng: np.random.Generator
) -> list[Event]:
    """One unit's conversation: a few chat calls (some streamed) and the feedback on them."""
    task = TASKS[int(rng.integers(0, len(TASKS)))]
    p_up = min(0.95, v.thumbs_up * v.task_thumbs.get(task, 1.0))
    conversation = f"{unit}-c{int(rng.integers(0, 3))}"
    events: list[Event] = []
    for _ in range(int(rng.integers(1, 8))):
        failed = bool(rng.random() < v.error)
        latency = float(rng.lognormal(math.log(v.latency_ms), 0.35))
        streamed = bool(rng.random() < 0.5)
        tokens = 0 if failed else int(rng.poisson(v.tokens))
        call = _interaction(
            spec, eid, v, unit, request_id=new_event_id(), role="primary",
            status="error" if failed else "ok", http_status=502 if failed else 200,
            error_type="http_5xx" if failed else None, latency_ms=latency,
            ttft_ms=latency * 0.2 if streamed and not failed else None, stream=streamed,
            prompt_tokens=50, completion_tokens=tokens, response_chars=tokens * 4,
            finish_reason=None if failed else "stop", conversation_id=conversation, tags={"task": task},
        )  # fmt: skip
        events.append(call)
        if failed:
            continue
        for kind, chance, value in (
            ("thumbs_up", p_up, 1.0),
            ("thumbs_down", v.thumbs_down, 1.0),
            ("regenerate", 0.05, 1.0),
            ("copy", 0.1, 1.0),
            ("continued", 0.5, 1.0),
            ("rating", 0.3, float(rng.integers(3, 6)) if rng.random() < 0.5 + p_up else 2.0),
            ("task_success", 0.3, 1.0 if rng.random() < 0.5 + p_up else 0.0),
        ):
            if rng.random() < chance:
                events.append(FeedbackEvent(request_id=call.request_id, unit_id=unit, kind=kind, value=value))
    return events


def add_units(
    engine: Engine, eid: int, spec: ExperimentSpec, units: int, batch: int, rng: np.random.Generator
) -> int:
    """``units`` new units split by weight, written by the real ingest function."""
    total_w = sum(v.weight for v in spec.variants)
    events: list[Event] = []
    for v in spec.variants:
        for i in range(round(units * v.weight / total_w)):
            events += unit_events(spec, eid, v, f"u{batch}-{v.name}-{i}", rng)
    result = ingest(engine, events)
    assert result.dead_lettered == 0
    return result.interactions


def add_shadow_pairs(
    engine: Engine, eid: int, spec: ExperimentSpec, pairs: int, rng: np.random.Generator
) -> None:
    """Primary calls on the control, each mirrored once to the candidate (same prompt)."""
    control = next(v for v in spec.variants if v.control)
    cand = next(v for v in spec.variants if not v.control)
    events: list[Event] = []
    for i in range(pairs):
        primary_id = new_event_id()
        answer = int(rng.integers(0, 3))
        for v, role in ((control, "primary"), (cand, "shadow")):
            failed = bool(rng.random() < v.error)
            tokens = 0 if failed else int(rng.poisson(v.tokens))
            events.append(
                _interaction(
                    spec,
                    eid,
                    v,
                    f"su{i % 300}",
                    request_id=primary_id if role == "primary" else new_event_id(),
                    role=role,
                    pair_id=None if role == "primary" else primary_id,
                    status="error" if failed else "ok",
                    http_status=502 if failed else 200,
                    error_type="http_5xx" if failed else None,
                    latency_ms=float(rng.lognormal(math.log(v.latency_ms), 0.3)),
                    prompt_tokens=50,
                    completion_tokens=tokens,
                    response_chars=tokens * 4,
                    finish_reason=None if failed else "stop",
                    response="answer-a" if answer == 0 or role == "primary" else f"answer-{answer}",
                )
            )
    assert ingest(engine, events).dead_lettered == 0


def add_decisions(
    conn: Connection, eid: int, decisions: Sequence[tuple[int | None, int | None, str, str]]
) -> None:
    """Rollout decisions (stage, to_stage, decision, reason), one minute apart."""
    start = datetime.now(UTC) - timedelta(minutes=len(decisions) * 10)
    for k, (stage, to_stage, decision, reason) in enumerate(decisions):
        conn.execute(
            text(
                "INSERT INTO rollout_decisions (experiment_id, stage, to_stage, decision, reason, actor,"
                " evidence, created_at) VALUES (:e, :s, :t, :d, :r, 'controller', '{}', :at)"
            ),
            {
                "e": eid,
                "s": stage,
                "t": to_stage,
                "d": decision,
                "r": reason,
                "at": start + timedelta(minutes=10 * k),
            },
        )
