"""Seeded traffic for the examples API and pages: experiments with content logging ``full``,
``hashed`` and ``none``, and a shadow experiment with judged pairs, written through the real
ingest function. Every seeded request is kept in :class:`Seeded` so tests compute what a
filter must return independently of the API's SQL."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, text

from analytics.ingest.write import ingest
from contracts.events import Event, FeedbackEvent, InteractionEvent, JudgeEvent, judge_event_id, new_event_id

CATEGORIES = ("code", "math", "chat")
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
#: Seeded requests start this long before the test run (time-window filters cut into them).
SPAN = timedelta(hours=2)


@dataclass
class Req:
    """One seeded call, as the tests expect the API to describe it."""

    request_id: str
    variant: str
    role: str
    ts: datetime
    category: str
    task: str
    failed: bool
    prompt: str | None
    response: str | None
    pair_id: str | None = None
    feedback: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)


@dataclass
class Seeded:
    name: str
    eid: int
    requests: list[Req]

    def where(self, **want: Any) -> list[Req]:
        return [r for r in self.requests if all(getattr(r, k) == v for k, v in want.items())]


def create(
    conn: Connection, name: str, mode: str, content_logging: str, variants: list[tuple[str, bool]]
) -> int:
    up = conn.execute(
        text(
            "INSERT INTO upstreams (name, base_url) VALUES (:n, 'http://127.0.0.1:9/v1')"
            " ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id"
        ),
        {"n": f"up-{name}"},
    ).scalar_one()
    eid = int(
        conn.execute(
            text(
                "INSERT INTO experiments (name, route, mode, status, salt, content_logging, started_at)"
                " VALUES (:n, :r, :m, 'running', :s, :c, :t) RETURNING id"
            ),
            {"n": name, "r": f"route-{name}", "m": mode, "s": secrets.token_hex(8), "c": content_logging,
             "t": datetime.now(UTC) - SPAN},
        ).scalar_one()
    )  # fmt: skip
    for vname, control in variants:
        conn.execute(
            text(
                "INSERT INTO variants (experiment_id, name, upstream_id, model, weight, is_control)"
                " VALUES (:e, :n, :u, :m, 50, :c)"
            ),
            {"e": eid, "n": vname, "u": up, "m": f"model-{vname}", "c": control},
        )
    return eid


def _content(value: str | None, logging: str) -> str | None:
    if value is None or logging == "none":
        return None
    return hashlib.sha256(value.encode()).hexdigest() if logging == "hashed" else value


def seed_ab(
    engine: Engine, name: str, content_logging: str, per_variant: int, rng: np.random.Generator
) -> Seeded:
    """An A/B test: ``per_variant`` calls per variant over the last two hours. The oldest third
    of the candidate's calls fail (so time order is not a fair sample); about a fifth of the
    successful ones get a thumbs-down, a third are judged. One candidate answer holds markup."""
    with engine.begin() as conn:
        eid = create(conn, name, "ab", content_logging, [("baseline", True), ("candidate", False)])
    start = datetime.now(UTC) - SPAN
    events: list[Event] = []
    reqs: list[Req] = []
    for variant in ("baseline", "candidate"):
        for i in range(per_variant):
            ts = start + SPAN * (i / per_variant) + timedelta(seconds=float(rng.random()))
            failed = variant == "candidate" and i < per_variant // 3
            category = CATEGORIES[i % 3]
            task = ("alpha", "beta")[int(rng.integers(0, 2))]
            prompt = f"question {i} for {variant} about {category}"
            response = (
                None if failed else f"{variant} answer {i}: " + "lorem ipsum " * int(rng.integers(1, 4))
            )
            if variant == "candidate" and i == per_variant - 1:
                response = f"candidate answer with markup {XSS}"
            if variant == "baseline" and i == 0:
                response = "long answer " + "x" * 3000
            req = Req(new_event_id(), variant, "primary", ts, category, task, failed, prompt, response)
            events.append(
                InteractionEvent(
                    request_id=req.request_id, route=f"route-{name}", unit_id=f"u{i % 40}", unit_source="header",
                    role="primary", mode="ab", endpoint="chat", model=f"model-{variant}", upstream="up",
                    status="error" if failed else "ok", http_status=502 if failed else 200,
                    error_type="http_5xx" if failed else None, latency_ms=float(rng.lognormal(6.5, 0.3)),
                    experiment_id=eid, experiment=name, variant=variant, response_chars=len(response or ""),
                    completion_tokens=None if failed else 20, prompt_tokens=10, stream=False,
                    finish_reason=None if failed else "stop", tags={"task": task},
                    prompt=_content(prompt, content_logging), response=_content(response, content_logging),
                    category=category, ts=ts.timestamp(),
                )
            )  # fmt: skip
            if not failed and rng.random() < 0.2:
                req.feedback.append("thumbs_down")
                events.append(FeedbackEvent(request_id=req.request_id, unit_id=f"u{i % 40}", kind="thumbs_down",
                                            value=1.0, ts=ts.timestamp() + 5))  # fmt: skip
            if not failed and rng.random() < 0.3:
                req.feedback.append("thumbs_up")
                events.append(FeedbackEvent(request_id=req.request_id, unit_id=f"u{i % 40}", kind="thumbs_up",
                                            value=1.0, ts=ts.timestamp() + 6))  # fmt: skip
            if not failed and rng.random() < 0.35:
                score = round(float(rng.random()), 3)
                req.scores["judge-a"] = score
                events.append(judgement(req, eid, "judge-a", score))
            reqs.append(req)
    result = ingest(engine, events)
    assert result.dead_lettered == 0
    return Seeded(name, eid, reqs)


def judgement(req: Req, eid: int, judge: str, score: float) -> JudgeEvent:
    return JudgeEvent(
        request_id=req.request_id, unit_id="u", judge=judge, role=req.role,  # type: ignore[arg-type]
        status="ok", latency_ms=100.0, experiment_id=eid, variant=req.variant, pair_id=req.pair_id,
        category=req.category, score=score, event_id=judge_event_id(req.request_id, judge),
        ts=req.ts.timestamp() + 2,
    )  # fmt: skip


def seed_shadow(engine: Engine, name: str, pairs: int, rng: np.random.Generator) -> Seeded:
    """A shadow experiment with full content: each primary call on the baseline mirrored to the
    candidate; every pair judged on both sides, some shadow calls fail."""
    with engine.begin() as conn:
        eid = create(conn, name, "shadow", "full", [("baseline", True), ("candidate", False)])
    start = datetime.now(UTC) - SPAN
    events: list[Event] = []
    reqs: list[Req] = []
    for i in range(pairs):
        ts = start + SPAN * (i / pairs)
        category = CATEGORIES[i % 3]
        prompt = f"shadow prompt {i}"
        primary = Req(
            new_event_id(), "baseline", "primary", ts, category, "alpha", False, prompt, f"baseline says {i}"
        )
        failed = i % 7 == 3
        answer = None if failed else (f"baseline says {i}" if i % 5 == 0 else f"candidate says {i} {XSS}")
        shadow = Req(new_event_id(), "candidate", "shadow", ts + timedelta(milliseconds=300), category,
                     "alpha", failed, prompt, answer, pair_id=primary.request_id)  # fmt: skip
        for r in (primary, shadow):
            events.append(
                InteractionEvent(
                    request_id=r.request_id, route=f"route-{name}", unit_id=f"s{i}", unit_source="header",
                    role=r.role, mode="shadow", endpoint="chat",  # type: ignore[arg-type]
                    model=f"model-{r.variant}", upstream="up", status="error" if r.failed else "ok",
                    http_status=502 if r.failed else 200, error_type="http_5xx" if r.failed else None,
                    latency_ms=float(rng.lognormal(6.5, 0.3)), experiment_id=eid, experiment=name,
                    variant=r.variant, pair_id=r.pair_id, response_chars=len(r.response or ""), stream=False,
                    tags={"task": "alpha"}, prompt=r.prompt, response=r.response, category=category,
                    ts=r.ts.timestamp(),
                )
            )  # fmt: skip
            if not r.failed:
                score = round(float(rng.random()), 3)
                r.scores["judge-a"] = score
                events.append(judgement(r, eid, "judge-a", score))
        reqs += [primary, shadow]
    result = ingest(engine, events)
    assert result.dead_lettered == 0
    return Seeded(name, eid, reqs)


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
