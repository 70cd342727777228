"""Experiment data for the dashboard tests: a few experiments whose reports exercise every
part of the page (significant wins and losses, guardrails, segments, a time series, a
rollout timeline, shadow pairs).

Rows are written with the same tables the ingest fills (``unit_rollups``,
``segment_rollups``, ``latency_histograms``, ``interactions``), in batches with a
snapshot between batches so the cumulative-lift series has several points.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, insert, text

from contracts.tables import metadata

BUCKETS_PER_E = 20.0
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
    mode: str
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
            " stage_started_at, started_at) VALUES (:n, :r, :m, :s, :salt, CAST(:plan AS jsonb), :stage,"
            " :ss, :st) RETURNING id"
        ),
        {
            "n": spec.name,
            "r": spec.route,
            "m": spec.mode,
            "s": spec.status,
            "salt": secrets.token_hex(8),
            "plan": None if spec.rollout_plan is None else __import__("json").dumps(spec.rollout_plan),
            "stage": spec.stage,
            "ss": started if spec.mode == "rollout" else None,
            "st": started,
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


def _bucket(ms: float) -> int:
    return math.floor(math.log(max(ms, 0.01)) * BUCKETS_PER_E)


def add_units(
    conn: Connection, eid: int, spec: ExperimentSpec, units: int, batch: int, rng: np.random.Generator
) -> None:
    """``units`` new units split by weight, each with a few requests and feedback."""
    rollups = metadata.tables["unit_rollups"]
    segments = metadata.tables["segment_rollups"]
    total_w = sum(v.weight for v in spec.variants)
    now = datetime.now(UTC)
    unit_rows: list[dict[str, Any]] = []
    seg_rows: list[dict[str, Any]] = []
    hist: dict[tuple[str, str, str, int], int] = {}
    for v in spec.variants:
        n = round(units * v.weight / total_w)
        for i in range(n):
            uid = f"u{batch}-{v.name}-{i}"
            task = TASKS[int(rng.integers(0, len(TASKS)))]
            requests = int(rng.integers(1, 8))
            errors = int(rng.binomial(requests, v.error))
            p_up = min(0.95, v.thumbs_up * v.task_thumbs.get(task, 1.0))
            lat = rng.lognormal(math.log(v.latency_ms), 0.35, size=requests)
            ttft = lat * 0.2
            tokens = rng.poisson(v.tokens, size=requests)
            row = {
                "experiment_id": eid,
                "variant": v.name,
                "unit_id": uid,
                "first_ts": now,
                "last_ts": now,
                "requests": float(requests),
                "errors": float(errors),
                "latency_sum": float(lat.sum()),
                "ttft_n": float(requests),
                "ttft_sum": float(ttft.sum()),
                "prompt_tokens": float(requests * 50),
                "completion_tokens": float(tokens.sum()),
                "response_chars": float(tokens.sum() * 4),
                "conversations": float(max(1, requests // 3)),
                "turns": float(requests),
                "thumbs_up": float(rng.binomial(requests, p_up)),
                "thumbs_down": float(rng.binomial(requests, v.thumbs_down)),
                "ratings_n": float(requests),
                "ratings_sum": float(rng.binomial(4 * requests, min(0.95, 0.6 + p_up / 2)) + requests),
                "regenerates": float(rng.binomial(requests, 0.05)),
                "copies": float(rng.binomial(requests, 0.1)),
                "continued": float(rng.binomial(requests, 0.5)),
                "task_success_n": float(requests),
                "task_success_sum": float(rng.binomial(requests, min(0.95, 0.5 + p_up))),
            }
            unit_rows.append(row)
            seg_rows.append({**row, "segment": f"task={task}"})
            for seg in ("", f"task={task}"):
                for metric, values in (("latency", lat), ("ttft", ttft)):
                    for ms in values:
                        key = (metric, seg, v.name, _bucket(float(ms)))
                        hist[key] = hist.get(key, 0) + 1
    conn.execute(insert(rollups), unit_rows)
    conn.execute(insert(segments), seg_rows)
    conn.execute(
        text(
            "INSERT INTO latency_histograms (experiment_id, metric, segment, variant, bucket, count)"
            " VALUES (:e, :m, :s, :v, :b, :c) ON CONFLICT (experiment_id, metric, segment, variant, bucket)"
            " DO UPDATE SET count = latency_histograms.count + EXCLUDED.count"
        ),
        [{"e": eid, "m": m, "s": s, "v": v, "b": b, "c": c} for (m, s, v, b), c in hist.items()],
    )


def add_shadow_pairs(
    conn: Connection, eid: int, spec: ExperimentSpec, pairs: int, rng: np.random.Generator
) -> None:
    """Primary calls on the control with one shadow call each on the candidate (same prompt)."""
    control = next(v for v in spec.variants if v.control)
    cand = next(v for v in spec.variants if not v.control)
    rows: list[dict[str, Any]] = []
    now = datetime.now(UTC)
    for i in range(pairs):
        rid = f"req-{eid}-{i}"
        answer = int(rng.integers(0, 3))
        for v, role, req, pair in ((control, "primary", rid, None), (cand, "shadow", f"{rid}-s", rid)):
            failed = bool(rng.random() < v.error)
            tokens = int(rng.poisson(v.tokens))
            same = answer == 0 or v is control
            rows.append(
                {
                    "event_id": __import__("uuid").uuid4().hex,
                    "ts": now - timedelta(seconds=pairs - i),
                    "request_id": req,
                    "route": spec.route,
                    "experiment_id": eid,
                    "variant": v.name,
                    "unit_id": f"su{i % 300}",
                    "unit_source": "header",
                    "role": role,
                    "pair_id": pair,
                    "mode": "shadow",
                    "endpoint": "chat",
                    "model": f"model-{v.name}",
                    "upstream": f"sim-{spec.name}",
                    "status": "error" if failed else "ok",
                    "http_status": 502 if failed else 200,
                    "error_type": "http_5xx" if failed else None,
                    "latency_ms": float(rng.lognormal(math.log(v.latency_ms), 0.3)),
                    "ttft_ms": None,
                    "prompt_tokens": 50,
                    "completion_tokens": tokens,
                    "response_chars": tokens * 4,
                    "finish_reason": "stop",
                    "stream": False,
                    "fallback": False,
                    "tags": {},
                    "response": "answer-a" if same else f"answer-{answer}",
                }
            )
    conn.execute(insert(metadata.tables["interactions"]), rows)


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
