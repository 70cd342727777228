"""Ingest of the RL-risk fields: the category of each interaction and judge scores."""

from __future__ import annotations

import random
from typing import Any

import psycopg

from analytics.ingest.write import Raw, ingest, ingest_raw
from contracts.events import JudgeEvent, encode, judge_event_id
from tests.analytics.ingest_helpers import connect, declared_experiment, interaction


def _rows(conn: psycopg.Connection[tuple[Any, ...]], sql: str, *params: object) -> list[tuple[Any, ...]]:
    return conn.execute(sql.encode(), params).fetchall()


def test_the_category_is_stored_on_the_fast_copy_path_and_the_conflict_path(database_url: str) -> None:
    exp = declared_experiment(database_url)
    rng = random.Random(3)
    cats = ["code", "math", None, "writing"]
    events = [interaction(exp, "control", f"u{i}", category=cats[i % 4]) for i in range(40)]
    rng.shuffle(events)
    with connect(database_url) as conn:
        ingest_raw(conn, [Raw(encode(e), event=e) for e in events[:30]], [])  # COPY fast path
        ingest_raw(conn, [Raw(encode(e)) for e in events[25:]], [])  # ON CONFLICT path, 5 duplicates
        stored = dict(
            _rows(conn, "SELECT request_id, category FROM interactions WHERE experiment_id = %s", exp)
        )
    assert stored == {e.request_id: e.category for e in events}


def _judgement(request_id: str, exp: int, score: float | None, status: str = "ok") -> JudgeEvent:
    return JudgeEvent(
        request_id=request_id, unit_id="u1", judge="rubric-v1", role="primary", status=status,  # type: ignore[arg-type]
        latency_ms=120.0, experiment_id=exp, variant="cand", category="code", score=score,
        error_type=None if status == "ok" else "timeout", event_id=judge_event_id(request_id, "rubric-v1"),
    )  # fmt: skip


def test_judge_scores_are_stored_once_per_request_and_judge_with_errors_kept(database_url: str) -> None:
    exp = declared_experiment(database_url)
    ok = _judgement("req-a", exp, 7.5)
    failed = _judgement("req-b", exp, None, "error")
    with connect(database_url) as conn:
        ingest(conn, [ok, failed])
        ingest(conn, [ok, _judgement("req-a", exp, 7.5)])  # redelivered: same event id
        rows = _rows(
            conn,
            "SELECT request_id, judge, status, score, error_type, category, variant FROM judgements"
            " WHERE experiment_id = %s ORDER BY request_id",
            exp,
        )
        feedback = _rows(conn, "SELECT count(*) FROM feedback WHERE request_id IN ('req-a', 'req-b')")
    assert rows == [
        ("req-a", "rubric-v1", "ok", 7.5, None, "code", "cand"),
        ("req-b", "rubric-v1", "error", None, "timeout", "code", "cand"),
    ]
    assert feedback == [(0,)]
