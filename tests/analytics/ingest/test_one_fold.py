"""One fold: whichever way a batch's interactions are stored — the COPY fast path, or the
``ON CONFLICT`` path a redelivery sends the whole batch to — the same events give the same
rollups, segments, histograms, latency samples and feedback counts, because both paths
feed ``lg_fold`` and ``analytics.ingest.rollups`` folds it. A second fold definition that
drifted from the first (a formula, a bucket, a segment, the conversation rule) fails here."""

from __future__ import annotations

import dataclasses
import logging
import random
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from analytics.ingest.write import ingest
from contracts.events import ROLLOUT_STAGE_TAG, Event, FeedbackEvent, InteractionEvent
from tests.analytics.ingest_helpers import (
    TEST_TAG_KEYS,
    assert_rollups_equal,
    connect,
    declare,
    expected_rollups,
    feedback,
    interaction,
    random_events,
    stored_rollups,
)
from tests.conftest import fresh_database

EXP = 7
_TABLES = (
    "interactions, feedback, feedback_counted, conversations_counted, unit_rollups, segment_rollups, rl_rollups,"
    " latency_histograms, latency_samples, dead_letters, judgements"
)
# Every table the fold writes, keyed and ordered; floats rounded (sums in another order
# may differ in the last bits), times as text.
_SNAPSHOTS = {
    "unit_rollups": "SELECT * FROM unit_rollups ORDER BY experiment_id, variant, unit_id",
    "segment_rollups": "SELECT * FROM segment_rollups ORDER BY experiment_id, segment, variant, unit_id",
    "latency_histograms": "SELECT * FROM latency_histograms ORDER BY experiment_id, metric, segment, variant, bucket",
    "latency_samples": "SELECT * FROM latency_samples ORDER BY experiment_id, metric, segment, variant, sample_key",
    # appended to (a row per counted response and thumb): compared as the sums per key
    "rl_rollups": "SELECT experiment_id, variant, unit_id, category, lbin, sum(responses), sum(tokens),"
    " sum(thumbs_up), sum(thumbs_down) FROM rl_rollups GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5",
    "feedback_counted": "SELECT request_id, kind FROM feedback_counted ORDER BY 1, 2",
    "conversations_counted": "SELECT * FROM conversations_counted ORDER BY 1, 2",
    "feedback": "SELECT event_id, experiment_id, variant FROM feedback ORDER BY event_id",
    "interactions": "SELECT count(*) FROM interactions",
}


def _plain(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6)
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in sorted(v.items())}
    return v


def _snapshot(conn: psycopg.Connection[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: [tuple(_plain(v) for v in row) for row in conn.execute(sql.encode()).fetchall()]
        for name, sql in _SNAPSHOTS.items()
    }


def _batches() -> tuple[InteractionEvent, list[list[Event]]]:
    """A stored-first sentinel (outside experiments) and batches covering what the fold reads:
    feedback of every kind (repeats, custom kinds, feedback before its interaction), tags,
    rollout stages (samples per stage), conversations across batches, duplicates in a batch."""
    rng = random.Random(14)
    events = random_events(EXP, 600, rng, units=40)
    staged: list[Event] = []
    for i, e in enumerate(events):
        if isinstance(e, InteractionEvent) and i % 3 == 0:
            e = dataclasses.replace(e, tags={**e.tags, ROLLOUT_STAGE_TAG: str(i % 2)})
        if isinstance(e, InteractionEvent) and i % 5 == 0:  # a tag the experiment does not declare
            e = dataclasses.replace(e, tags={**e.tags, "free": str(i % 4)})
        staged.append(e)
    # Feedback repeats (counted once) and a thumbs-up of 0 (not counted).
    firsts = [e for e in staged if isinstance(e, InteractionEvent)][:30]
    staged += [feedback(e, "thumbs_up") for e in firsts[:10]]
    staged += [feedback(e, "thumbs_up", 0.0) for e in firsts[10:15]]
    staged += [feedback(e, "task_success", 0.0) for e in firsts[15:20]]
    batches = [staged[i : i + 200] for i in range(0, len(staged), 200)]
    # Feedback before its interaction: the last batch's feedback moved to the first batch.
    late = [e for e in batches[-1] if isinstance(e, FeedbackEvent)]
    batches[0] = late[:20] + batches[0]
    batches[-1] = [e for e in batches[-1] if e not in late[:20]]
    # The same events twice in one batch (a producer retry).
    for b in batches:
        b += b[:7]
    sentinel = interaction(None, None, "sentinel")
    return sentinel, batches


@pytest.fixture(scope="module")
def own_database(pg_admin_url: str) -> Iterator[str]:
    with fresh_database(pg_admin_url) as url:
        yield url


def _ingest_all(
    url: str, sentinel: InteractionEvent, batches: list[list[Event]], *, redelivered: bool
) -> tuple[dict[str, list[tuple[Any, ...]]], int]:
    """Ingest the batches on an emptied database; with ``redelivered``, each batch carries an
    event stored before, so its COPY fails and the whole batch takes the ON CONFLICT path."""
    with connect(url) as conn:
        conn.execute(f"TRUNCATE {_TABLES}".encode())
        conn.commit()
        declare(url, EXP)
        ingest(conn, [sentinel])
        for b in batches:
            ingest(conn, [sentinel, *b] if redelivered else b)
        ingest(conn, batches[1])  # a whole batch redelivered changes nothing
        snap = _snapshot(conn)
        n_rollups = len(stored_rollups(conn, EXP))
        unique = {e.event_id: e for b in batches for e in b}.values()
        assert_rollups_equal(stored_rollups(conn, EXP), expected_rollups(unique, declared=TEST_TAG_KEYS))
        assert not conn.execute(b"SELECT 1 FROM segment_rollups WHERE segment LIKE 'free=%%'").fetchall()
    return snap, n_rollups


def _fallbacks(caplog: pytest.LogCaptureFixture) -> int:
    return sum("COPY fast path not applicable" in r.getMessage() for r in caplog.records)


def test_the_copy_path_and_the_on_conflict_path_fold_the_same_events_into_the_same_rows(
    own_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    sentinel, batches = _batches()
    caplog.set_level(logging.INFO, logger="analytics.ingest.write")
    by_copy, n = _ingest_all(own_database, sentinel, batches, redelivered=False)
    assert _fallbacks(caplog) == 1  # only the deliberate redelivery of a whole batch
    caplog.clear()
    by_on_conflict, _ = _ingest_all(own_database, sentinel, batches, redelivered=True)
    assert _fallbacks(caplog) == len(batches) + 1
    assert n > 100  # units x segments: the comparison below is not of empty tables
    assert {k: len(v) for k, v in by_copy.items() if k != "interactions"} == {
        k: len(v) for k, v in by_on_conflict.items() if k != "interactions"
    }
    assert all(by_copy[t] for t in _SNAPSHOTS), "every table the fold writes has rows"
    assert any("rollout_stage=" in str(r) for r in by_copy["latency_samples"])
    for table in _SNAPSHOTS:
        assert by_on_conflict[table] == by_copy[table], table


def test_a_tag_holding_the_segment_separator_is_folded_by_the_same_statements(own_database: str) -> None:
    # Only the ON CONFLICT path can carry such a tag (lg_fold.tags_with_sep); the fold reads
    # it through the same segment expression, into rollups, histograms and stage samples.
    exp = declare(own_database, EXP + 1)
    evs: list[Event] = [
        interaction(exp, "control", "u1", tags={"task": "a\x1fb", ROLLOUT_STAGE_TAG: "1"}),
        interaction(exp, "control", "u1", tags={"task": "plain", ROLLOUT_STAGE_TAG: "1"}),
    ]
    with connect(own_database) as conn:
        ingest(conn, evs)
        hist = conn.execute(
            b"SELECT segment, sum(count) FROM latency_histograms WHERE experiment_id = %s AND metric = 'latency'"
            b" GROUP BY 1 ORDER BY 1",
            (exp,),
        ).fetchall()
        stage = conn.execute(
            b"SELECT count(*) FROM latency_samples WHERE experiment_id = %s AND segment = %s",
            (exp, f"{ROLLOUT_STAGE_TAG}=1"),
        ).fetchone()
        assert_rollups_equal(stored_rollups(conn, exp), expected_rollups(evs))
    assert hist == [("", 2), (f"{ROLLOUT_STAGE_TAG}=1", 2), ("task=a\x1fb", 1), ("task=plain", 1)]
    assert stage == (4,)  # latency and ttft of both requests


_PRODUCT = ("analytics", "gateway", "control", "contracts", "curation", "evals", "liftgate")
_WRITES = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(unit_rollups|segment_rollups|rl_rollups|latency_histograms|latency_samples)\b",
    re.I,
)
_FOLD_MODULES = {"analytics/ingest/rollups.py", "analytics/ingest/samples.py"}


def test_only_the_fold_modules_write_rollups_histograms_and_samples() -> None:
    root = Path(__file__).resolve().parents[3]
    writers = {
        str(p.relative_to(root))
        for pkg in _PRODUCT
        for p in (root / pkg).rglob("*.py")
        if _WRITES.search(p.read_text(encoding="utf-8"))
    }
    assert writers == _FOLD_MODULES
    # The ON CONFLICT path's own fold input (lg_new_i) and formulas are gone for good.
    for pkg in _PRODUCT:
        for p in (root / pkg).rglob("*.py"):
            assert "lg_new_i" not in p.read_text(encoding="utf-8"), p
