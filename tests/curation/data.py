"""Production-like rows written straight to PostgreSQL: an experiment, calls, feedback."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert

from contracts.tables import Experiment, Feedback, Interaction, Judgement


@dataclass
class Call:
    prompt: str | None
    response: str | None = "an answer"
    category: str | None = None
    variant: str = "baseline"
    unit: str = "u1"
    status: str = "ok"
    feedback: tuple[str, ...] = ()
    rating: float | None = None
    judge: float | None = None
    minutes: int = 0
    request_id: str = field(default_factory=lambda: "req-" + secrets.token_hex(6))

    def ts(self, t0: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> datetime:
        return t0 + timedelta(minutes=self.minutes)

    def ts_after(self) -> datetime:
        """Just after this call (a ``since`` that excludes it)."""
        return self.ts() + timedelta(seconds=1)

    def ts_before(self) -> datetime:
        """Just before this call (an ``until`` that excludes it)."""
        return self.ts() - timedelta(seconds=1)


def experiment(engine: Engine, content_logging: str = "full") -> str:
    name = f"exp-{secrets.token_hex(4)}"
    with engine.begin() as conn:
        conn.execute(insert(Experiment).values(name=name, route=name, mode="ab", salt="s",
                                               content_logging=content_logging))  # fmt: skip
    return name


def store_calls(engine: Engine, exp_name: str, calls: list[Call], t0: datetime | None = None) -> None:
    t0 = t0 or datetime(2026, 1, 1, tzinfo=UTC)  # Call.ts() assumes this default
    with engine.begin() as conn:
        exp_id = conn.execute(Experiment.__table__.select().where(Experiment.name == exp_name)).first()[0]  # type: ignore[index]
        rows: list[dict[str, Any]] = []
        fb: list[dict[str, Any]] = []
        for c in calls:
            ts = t0 + timedelta(minutes=c.minutes)
            rows.append({"event_id": str(uuid.uuid4()), "ts": ts, "request_id": c.request_id, "route": exp_name,
                         "experiment_id": exp_id, "variant": c.variant, "unit_id": c.unit, "unit_source": "header",
                         "role": "primary", "mode": "ab", "endpoint": "chat", "model": "m", "upstream": "up",
                         "status": c.status, "http_status": 200 if c.status == "ok" else 502, "latency_ms": 5.0,
                         "response_chars": len(c.response or ""), "stream": False, "fallback": False,
                         "tags": {"category": c.category} if c.category else {}, "prompt": c.prompt,
                         "response": c.response})  # fmt: skip
            kinds = [(k, 1.0) for k in c.feedback]
            if c.rating is not None:
                kinds.append(("rating", c.rating))
            if c.judge is not None:
                kinds.append(("judge_score", c.judge))
            for kind, value in kinds:
                fb.append({"event_id": str(uuid.uuid4()), "ts": ts + timedelta(seconds=5), "request_id": c.request_id,
                           "unit_id": c.unit, "kind": kind, "value": value, "experiment_id": exp_id,
                           "variant": c.variant, "tags": {}})  # fmt: skip
        conn.execute(insert(Interaction), rows)
        if fb:
            conn.execute(insert(Feedback), fb)


@dataclass
class Shadow:
    """A shadow mirror of a primary call (``pair_id`` = its request id), optionally judged on
    both sides by one judge: ``scores`` = (primary's score, shadow's score)."""

    primary: Call
    response: str | None
    scores: tuple[float, float] | None = None
    variant: str = "candidate"
    status: str = "ok"
    judge_status: str = "ok"
    judge: str = "judge"
    request_id: str = field(default_factory=lambda: "shd-" + secrets.token_hex(6))


def _judgement(exp_id: int, request_id: str, unit: str, role: str, variant: str, pair_id: str | None,
               score: float | None, status: str, judge: str, ts: datetime) -> dict[str, Any]:  # fmt: skip
    return {"event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{request_id}/{judge}")), "ts": ts,
            "request_id": request_id, "unit_id": unit, "judge": judge, "role": role, "status": status,
            "latency_ms": 3.0, "experiment_id": exp_id, "variant": variant, "pair_id": pair_id,
            "score": score if status == "ok" else None, "error_type": None if status == "ok" else "timeout"}  # fmt: skip


def store_shadows(engine: Engine, exp_name: str, shadows: list[Shadow]) -> None:
    """Shadow calls and their judgements (the primary calls are stored by ``store_calls``; a
    primary judged against several mirrors gets its judgement once)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as conn:
        exp_id = conn.execute(Experiment.__table__.select().where(Experiment.name == exp_name)).first()[0]  # type: ignore[index]
        rows: list[dict[str, Any]] = []
        judged: dict[str, dict[str, Any]] = {}
        for s in shadows:
            p = s.primary
            ts = t0 + timedelta(minutes=p.minutes, seconds=1)
            rows.append({"event_id": str(uuid.uuid4()), "ts": ts, "request_id": s.request_id, "route": exp_name,
                         "experiment_id": exp_id, "variant": s.variant, "unit_id": p.unit, "unit_source": "header",
                         "role": "shadow", "mode": "shadow", "endpoint": "chat", "model": "m", "upstream": "up2",
                         "status": s.status, "http_status": 200 if s.status == "ok" else 502, "latency_ms": 5.0,
                         "response_chars": len(s.response or ""), "stream": False, "fallback": False, "tags": {},
                         "prompt": p.prompt, "response": s.response, "pair_id": p.request_id})  # fmt: skip
            if s.scores is None:
                continue
            key = f"{p.request_id}/{s.judge}"
            if key not in judged:
                judged[key] = _judgement(exp_id, p.request_id, p.unit, "primary", p.variant, None, s.scores[0],
                                         "ok", s.judge, ts)  # fmt: skip
            judged[s.request_id] = _judgement(exp_id, s.request_id, p.unit, "shadow", s.variant, p.request_id,
                                              s.scores[1], s.judge_status, s.judge, ts)  # fmt: skip
        conn.execute(insert(Interaction), rows)
        if judged:
            conn.execute(insert(Judgement), list(judged.values()))
