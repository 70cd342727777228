"""A writer remembers the conversations it saw counted, and never one a rolled-back attempt registered.

Conversations are counted exactly as distinct ids (``analytics.ingest.rollups``): a batch
registers its conversations in ``conversations_counted`` and counts those it inserted. A
consumer keeps the pairs whose registration committed (``copy_text.CountedConversations``)
and looks only the others up; these tests hold the counts to the definition either way.
"""

from __future__ import annotations

import psycopg

from analytics.ingest.copy_text import CountedConversations
from analytics.ingest.write import Raw, ingest_raw
from contracts.events import InteractionEvent, encode
from tests.analytics.ingest_helpers import connect, declared_experiment, interaction

# An id of UUID length the database cannot read as a UUID (the contract checks the length only).
BAD_UUID = "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"


def _raws(events: list[InteractionEvent]) -> list[Raw]:
    return [Raw(encode(e), "liftgate.interactions", 0, i, e.key, e) for i, e in enumerate(events)]


def _conversations(conn: psycopg.Connection, exp: int) -> float:
    row = conn.execute(
        "SELECT sum(conversations) FROM unit_rollups WHERE experiment_id = %s", (exp,)
    ).fetchone()
    conn.commit()  # the next ingest_raw opens its own transaction (and so may learn)
    assert row is not None
    return float(row[0] or 0)


def _registered(conn: psycopg.Connection, exp: int) -> list[str]:
    """The experiment's conversation ids in conversations_counted."""
    sql = "SELECT conversation_id FROM conversations_counted WHERE experiment_id = %s ORDER BY 1"
    ids = [r[0] for r in conn.execute(sql, (exp,))]
    conn.commit()
    return ids


def test_known_conversations_are_not_looked_up_again_and_count_once(database_url: str) -> None:
    exp = declared_experiment(database_url)
    known = CountedConversations()
    first = [interaction(exp, "control", "u1", conversation_id="c1", ts=1000.0 + i) for i in range(3)]
    later = [interaction(exp, "control", "u1", conversation_id="c1", ts=2000.0 + i) for i in range(3)]
    other = [interaction(exp, "candidate", "u2", conversation_id="c2", ts=2100.0)]
    with connect(database_url) as conn:
        ingest_raw(conn, _raws(first), (), conversations=known)
        assert (exp, "c1") in known and len(known) == 1
        assert _conversations(conn, exp) == 1.0
        ingest_raw(conn, _raws(later + other), (), conversations=known)
        assert (exp, "c1") in known and (exp, "c2") in known
        assert _conversations(conn, exp) == 2.0  # c1 once, c2 once
        # A writer that knows nothing looks c1 up, finds it counted, and counts it no more.
        fresh = CountedConversations()
        again = [interaction(exp, "control", "u1", conversation_id="c1", ts=3000.0)]
        ingest_raw(conn, _raws(again), (), conversations=fresh)
        assert (exp, "c1") in fresh
        assert _conversations(conn, exp) == 2.0


def test_a_conversation_registered_by_a_refused_attempt_is_not_believed_counted(database_url: str) -> None:
    # The batch's first attempt registers c-bad (its only turn is the event the database
    # refuses), then its COPY fails and the savepoint takes the registration back. Had the
    # writer believed c-bad counted, its next turn would open nothing and the conversation
    # would never be counted.
    exp = declared_experiment(database_url)
    known = CountedConversations()
    good = interaction(exp, "control", "u1", conversation_id="c-good", ts=1000.0)
    bad = interaction(exp, "control", "u1", conversation_id="c-bad", ts=1001.0)
    bad.event_id = BAD_UUID
    with connect(database_url) as conn:
        res = ingest_raw(conn, _raws([good, bad]), (), conversations=known)
        assert res.dead_lettered == 1
        assert (exp, "c-bad") not in known
        assert _registered(conn, exp) == ["c-good"]
        assert _conversations(conn, exp) == 1.0
        retry = interaction(exp, "control", "u1", conversation_id="c-bad", ts=1002.0)
        ingest_raw(conn, _raws([retry]), (), conversations=known)
        assert _conversations(conn, exp) == 2.0
        assert (exp, "c-bad") in known


def test_a_batch_redone_on_the_conflict_path_teaches_nothing_and_counts_right(database_url: str) -> None:
    # A redelivered event makes the COPY fail on its stored id: the batch is redone with
    # ON CONFLICT, and the writer learns nothing from it (the COPY path's registrations
    # were rolled back), while the counts stay exact.
    exp = declared_experiment(database_url)
    known = CountedConversations()
    stored = interaction(exp, "control", "u1", conversation_id="c1", ts=1000.0)
    with connect(database_url) as conn:
        ingest_raw(conn, _raws([stored]), (), conversations=known)
        assert len(known) == 1
        new = interaction(exp, "control", "u1", conversation_id="c2", ts=1001.0)
        ingest_raw(conn, _raws([stored, new]), (), conversations=known)
        assert (exp, "c2") not in known
        assert _conversations(conn, exp) == 2.0


def test_nothing_is_learnt_inside_a_callers_transaction(database_url: str) -> None:
    # ingest_raw inside a transaction it did not open cannot know whether that commits.
    exp = declared_experiment(database_url)
    known = CountedConversations()
    with connect(database_url) as conn:
        with conn.transaction():
            ingest_raw(
                conn,
                _raws([interaction(exp, "control", "u1", conversation_id="c1")]),
                (),
                conversations=known,
            )
            assert len(known) == 0
        assert _conversations(conn, exp) == 1.0
    assert len(known) == 0
