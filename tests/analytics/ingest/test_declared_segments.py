"""Segments only for declared tag keys (experiments.segment_tags), rollout_stage always;
the declaration read in the batch's transaction; a key declared later backfilled."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import psycopg
import pytest

from analytics.ingest import rollups
from analytics.ingest.write import ingest
from contracts.events import ROLLOUT_STAGE_TAG, Event, FeedbackEvent, InteractionEvent
from contracts.ids import uuid7
from tests.analytics.ingest_helpers import (
    assert_rollups_equal,
    connect,
    declare,
    declared_experiment,
    expected_rollups,
    feedback,
    interaction,
    pg_url,
    random_events,
    stored_rollups,
)


def _segments(conn: psycopg.Connection[Any], exp: int, table: str = "segment_rollups") -> set[str]:
    rows = conn.execute(f"SELECT DISTINCT segment FROM {table} WHERE experiment_id = %s".encode(), (exp,))
    return {str(r[0]) for r in rows if r[0] != ""}


@pytest.mark.parametrize("redelivered", [False, True], ids=["copy path", "on conflict path"])
def test_an_undeclared_tag_writes_no_segment_row_a_declared_one_does_and_rollout_stage_always(
    database_url: str, redelivered: bool
) -> None:
    exp = declared_experiment(database_url, ["task"])
    bare = declared_experiment(database_url, [])  # declares nothing
    evs: list[Event] = []
    for e in (exp, bare):
        tags = {"task": "code", "free": "x", "client": "y", ROLLOUT_STAGE_TAG: "1"}
        first = interaction(e, "control", "u1", tags=tags)
        evs += [first, interaction(e, "candidate", "u2", tags=tags), feedback(first, "thumbs_up"),
                feedback(first, "my_signal", 2.0)]  # fmt: skip
    with connect(database_url) as conn:
        if redelivered:  # a stored event makes the whole batch take the ON CONFLICT path
            ingest(conn, evs[:1])
        ingest(conn, evs)
        for table in ("segment_rollups", "latency_histograms"):
            assert _segments(conn, exp, table) == {"task=code", f"{ROLLOUT_STAGE_TAG}=1"}, table
            assert _segments(conn, bare, table) == {f"{ROLLOUT_STAGE_TAG}=1"}, table
        assert _segments(conn, exp, "latency_samples") == {f"{ROLLOUT_STAGE_TAG}=1"}
        for e, keys in ((exp, ["task"]), (bare, [])):
            mine = [x for x in evs if isinstance(x, FeedbackEvent) or x.experiment_id == e]
            mine = [x for x in mine if not isinstance(x, FeedbackEvent) or x.request_id in
                    {i.request_id for i in mine if isinstance(i, InteractionEvent)}]  # fmt: skip
            assert_rollups_equal(stored_rollups(conn, e), expected_rollups(mine, declared=keys))
        # Every tag is still stored with its request.
        stored = conn.execute(b"SELECT tags FROM interactions WHERE experiment_id = %s LIMIT 1", (bare,))
        assert stored.fetchone() == ({"task": "code", "free": "x", "client": "y", ROLLOUT_STAGE_TAG: "1"},)


def test_a_declaration_change_is_seen_by_the_next_batch(database_url: str) -> None:
    exp = declared_experiment(database_url, [])
    with connect(database_url) as conn:
        ingest(conn, [interaction(exp, "control", "u1", tags={"task": "code", "lang": "en"})])
        assert _segments(conn, exp) == set()
        declare(database_url, exp, ["lang"])
        ingest(conn, [interaction(exp, "control", "u2", tags={"task": "code", "lang": "en"})])
        assert _segments(conn, exp) == {"lang=en"}
        declare(database_url, exp, ["task"])
        ingest(conn, [interaction(exp, "control", "u3", tags={"task": "math", "lang": "fr"})])
        assert _segments(conn, exp) == {"lang=en", "task=math"}


def test_a_batch_in_flight_holds_a_declaration_change_until_it_commits(database_url: str) -> None:
    """The batch reads the declaration under segment_rollups' ROW EXCLUSIVE lock; the control
    plane's change takes SHARE ROW EXCLUSIVE, so it cannot commit between a batch's read of
    the declaration and that batch's fold."""
    with connect(database_url) as batch, connect(database_url) as writer:
        rollups.declared_segments(batch)  # a batch's transaction, open
        writer.execute(b"SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            writer.execute(b"LOCK TABLE segment_rollups IN SHARE ROW EXCLUSIVE MODE")
        writer.rollback()
        batch.commit()
        writer.execute(b"LOCK TABLE segment_rollups IN SHARE ROW EXCLUSIVE MODE")  # now granted
        writer.rollback()


def _histograms(conn: psycopg.Connection[Any], exp: int) -> list[tuple[Any, ...]]:
    return conn.execute(
        b"SELECT metric, segment, variant, bucket, count FROM latency_histograms WHERE experiment_id = %s"
        b" AND segment <> '' ORDER BY 1, 2, 3, 4",
        (exp,),
    ).fetchall()


def test_a_key_declared_later_is_backfilled_as_if_declared_from_the_start(database_url: str) -> None:
    later = declared_experiment(database_url, [])
    start = declared_experiment(database_url, ["task"])
    rng = random.Random(15)
    events = random_events(later, 900, rng, units=60)
    for i, e in enumerate(events):  # a stage tag (always rolled up) on some requests
        if isinstance(e, InteractionEvent) and i % 4 == 0:
            events[i] = dataclasses.replace(e, tags={**e.tags, ROLLOUT_STAGE_TAG: str(i % 3)})
    # The twins get ids of their own. They were once the original's id with its last four
    # digits replaced by "beef": an original that already ended in "beef" (planted here) made
    # its twin a duplicate, which ingest dropped, and the histograms differed (~1 run in 70).
    k = next(i for i, e in enumerate(events) if isinstance(e, InteractionEvent) and i % 4 == 0 and i > 300)
    events[k] = dataclasses.replace(events[k], event_id=events[k].event_id[:-4] + "beef")
    # The same traffic in an experiment that declared "task" from the start.
    twin: list[Event] = []
    renamed: dict[str, str] = {}
    for e in events:
        if isinstance(e, InteractionEvent):
            c = dataclasses.replace(e, experiment_id=start, request_id=e.request_id + "-t", event_id=uuid7())
            renamed[e.request_id] = c.request_id
        else:
            assert isinstance(e, FeedbackEvent)
            c = dataclasses.replace(e, request_id=renamed[e.request_id], event_id=uuid7())
        twin.append(c)
    with connect(database_url) as conn:
        for i in range(0, len(events), 150):
            ingest(conn, events[i : i + 150])
            ingest(conn, twin[i : i + 150])
        assert all(s.startswith(ROLLOUT_STAGE_TAG) for s in _segments(conn, later))
        declare(database_url, later, ["task"])
        conn.execute(b"LOCK TABLE segment_rollups IN SHARE ROW EXCLUSIVE MODE")
        written = rollups.backfill_segments(conn, later, ["task"])
        conn.commit()
        assert written > 100
        assert_rollups_equal(stored_rollups(conn, later), expected_rollups(events, declared=["task"]))
        assert _histograms(conn, later) == _histograms(conn, start)
        # Twice is the same: the keys' rows are recomputed, not added to.
        rollups.backfill_segments(conn, later, ["task"])
        conn.commit()
        assert_rollups_equal(stored_rollups(conn, later), expected_rollups(events, declared=["task"]))
        with pytest.raises(ValueError, match="always"):
            rollups.backfill_segments(conn, later, [ROLLOUT_STAGE_TAG])


def test_declared_segments_read_every_declaring_experiment(database_url: str) -> None:
    a = declared_experiment(database_url, ["task", "lang"])
    b = declared_experiment(database_url, [])
    with psycopg.connect(pg_url(database_url)) as conn:
        got = rollups.declared_segments(conn)
    assert got[a] == {"task", "lang", ROLLOUT_STAGE_TAG}
    assert b not in got  # an experiment declaring nothing folds rollout_stage only (ALWAYS)
