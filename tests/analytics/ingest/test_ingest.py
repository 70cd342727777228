"""Ingest against the real session database: idempotency, attribution, segments, histograms."""

from __future__ import annotations

import dataclasses
import functools
import random
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from analytics.ingest import copy_text
from analytics.ingest import write as ingest_module
from analytics.ingest.write import IngestResult, Raw, attribute_pending, ingest, ingest_raw
from analytics.report.aggregate import bucket_of, histograms, segments
from contracts.events import InteractionEvent, encode
from tests.analytics.ingest_helpers import (
    assert_rollups_equal,
    connect,
    declared_experiment,
    expected_rollups,
    feedback,
    interaction,
    new_experiment_id,
    random_events,
    stored_rollups,
    while_waiting_commit,
)
from tests.conftest import fresh_database


def _count(conn: psycopg.Connection[tuple[Any, ...]], sql: str, *params: object) -> int:
    row = conn.execute(sql.encode(), params).fetchone()
    assert row is not None
    return int(row[0])


def test_same_batch_twice_gives_the_same_rows_and_rollups(database_url: str) -> None:
    exp = declared_experiment(database_url)
    events = random_events(exp, 400, random.Random(1))
    with connect(database_url) as conn:
        first = ingest(conn, events)
        before = stored_rollups(conn, exp)
        second = ingest(conn, events)
        after = stored_rollups(conn, exp)
        n_rows = _count(conn, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp)
    assert first.interactions == 400 and first.duplicates == 0
    assert second == IngestResult(duplicates=len(events))
    assert n_rows == 400
    assert before == after
    assert_rollups_equal(after, expected_rollups(events))


def test_ingest_through_an_sqlalchemy_engine_commits(engine: Engine, database_url: str) -> None:
    exp = declared_experiment(database_url)
    ev = interaction(exp, "control", "u1")
    assert ingest(engine, [ev]).interactions == 1
    with connect(database_url) as conn:
        assert _count(conn, "SELECT count(*) FROM unit_rollups WHERE experiment_id = %s", exp) == 1


def test_feedback_before_its_interaction_is_counted_once_when_the_interaction_arrives(
    database_url: str,
) -> None:
    exp = declared_experiment(database_url)
    ev = interaction(exp, "candidate", "u7", tags={"task": "code"})
    fb = [feedback(ev, "thumbs_up"), feedback(ev, "rating", 4.0), feedback(ev, "my_signal", 2.5)]
    with connect(database_url) as conn:
        early = ingest(conn, fb)
        assert early.feedback == 3 and early.attributed == 0
        assert _count(conn, "SELECT count(*) FROM unit_rollups WHERE experiment_id = %s", exp) == 0
        late = ingest(conn, [ev])
        assert late.attributed == 3
        ingest(conn, [ev, *fb])  # redelivery of everything changes nothing
        assert attribute_pending(conn).attributed == 0
        got = stored_rollups(conn, exp)
        unattributed = _count(
            conn,
            "SELECT count(*) FROM feedback WHERE request_id = %s AND experiment_id IS NULL",
            ev.request_id,
        )
    assert unattributed == 0
    overall = got[(exp, "", "candidate", "u7")]
    assert (overall["thumbs_up"], overall["ratings_n"], overall["ratings_sum"]) == (1, 1, 4.0)
    assert overall["counters"] == {"my_signal": 2.5, "my_signal:n": 1}
    assert got[(exp, "task=code", "candidate", "u7")]["thumbs_up"] == 1
    assert_rollups_equal(got, expected_rollups([ev, *fb]))


def test_feedback_after_its_interaction_is_attributed_at_insert(database_url: str) -> None:
    exp = declared_experiment(database_url)
    ev = interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [ev])
        res = ingest(conn, [feedback(ev, "thumbs_down"), feedback(ev, "task_success", 1.0)])
        row = conn.execute(
            b"SELECT thumbs_down, task_success_n, task_success_sum FROM unit_rollups WHERE experiment_id = %s",
            (exp,),
        ).fetchone()
    assert res.attributed == 2
    assert row == (1.0, 1.0, 1.0)


def test_shadow_and_unexperimented_calls_do_not_feed_rollups(database_url: str) -> None:
    exp = declared_experiment(database_url)
    primary = interaction(exp, "control", "u1")
    shadow = interaction(exp, "candidate", "u1", role="shadow", pair_id=primary.request_id)
    plain = interaction(None, None, "u1")
    with connect(database_url) as conn:
        assert ingest(conn, [primary, shadow, plain]).interactions == 3
        got = stored_rollups(conn, exp)
        pair = _count(conn, "SELECT count(*) FROM interactions WHERE pair_id = %s", primary.request_id)
    assert list(got) == [(exp, "", "control", "u1")]
    assert pair == 1


def test_tags_become_segments_and_latencies_fill_histograms(database_url: str) -> None:
    exp = declared_experiment(database_url)
    evs = [
        interaction(
            exp, "control", "u1", latency_ms=100.0, ttft_ms=10.0, tags={"task": "code", "lang": "en"}
        ),
        interaction(exp, "control", "u2", latency_ms=100.0, ttft_ms=None, tags={"task": "math"}),
        interaction(exp, "candidate", "u3", latency_ms=1000.0, ttft_ms=50.0, tags={"task": "code"}),
    ]
    with connect(database_url) as conn:
        ingest(conn, evs)
        segs = segments(conn, exp)
        lat = histograms(conn, exp, "latency")
        ttft = histograms(conn, exp, "ttft")
        code = histograms(conn, exp, "latency", "task=code")
    assert segs == ["", "lang=en", "task=code", "task=math"]
    assert lat == {"candidate": [(bucket_of(1000.0), 1)], "control": [(bucket_of(100.0), 2)]}
    assert ttft == {"candidate": [(bucket_of(50.0), 1)], "control": [(bucket_of(10.0), 1)]}
    assert code == {"candidate": [(bucket_of(1000.0), 1)], "control": [(bucket_of(100.0), 1)]}


def test_conversations_count_distinct_ids_across_batches(database_url: str) -> None:
    exp = declared_experiment(database_url)
    a1 = interaction(exp, "control", "u1", conversation_id=f"conv-{exp}-a", ts=1.0)
    a2 = interaction(exp, "control", "u1", conversation_id=f"conv-{exp}-a", ts=2.0)
    b1 = interaction(exp, "control", "u1", conversation_id=f"conv-{exp}-b", ts=3.0)
    single = interaction(exp, "control", "u1", conversation_id=None, ts=4.0)
    with connect(database_url) as conn:
        ingest(conn, [a1, a2])
        ingest(conn, [b1, single, a2])
        row = conn.execute(
            b"SELECT conversations, turns FROM unit_rollups WHERE experiment_id = %s", (exp,)
        ).fetchone()
    assert row == (3.0, 4.0)


def test_a_conversation_is_new_per_experiment_and_only_a_stored_primary_turn_continues_it(
    database_url: str,
) -> None:
    """COPY fast path (every event new): the probe asks per (experiment, conversation) pair."""
    a, b = declared_experiment(database_url), declared_experiment(database_url)
    conv = f"conv-{a}-{b}"
    first = [
        interaction(a, "control", "u1", conversation_id=conv, ts=1.0),
        interaction(b, "control", "u2", conversation_id=conv, ts=1.0, role="shadow", mode="shadow"),
    ]
    second = [
        interaction(a, "control", "u1", conversation_id=conv, ts=2.0),  # continues it in a
        interaction(b, "control", "u2", conversation_id=conv, ts=2.0),  # b stored only a shadow turn
        interaction(a, "control", "u1", conversation_id=conv + "-d", ts=3.0),
    ]
    with connect(database_url) as conn:
        assert ingest(conn, first).duplicates == 0
        assert ingest(conn, second).duplicates == 0
        rows = conn.execute(
            b"SELECT experiment_id, unit_id, conversations, turns FROM unit_rollups"
            b" WHERE experiment_id = ANY(%s)",
            ([a, b],),
        ).fetchall()
    assert sorted(rows) == sorted([(a, "u1", 2.0, 3.0), (b, "u2", 1.0, 1.0)])


def _plan_nodes(plan: Any) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _plan_nodes(child)
    return out


def test_late_attribution_probes_feedback_by_request_id_instead_of_reading_it_all(database_url: str) -> None:
    """With much unattributed feedback (e.g. on traffic outside experiments) a batch still
    reads only its own request ids' rows: the planner used to hash the whole table."""
    ids = "{" + ",".join(f"req-batch-{k}" for k in range(20_000)) + "}"
    with connect(database_url) as conn:
        conn.execute(
            b"INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, tags)"
            b" SELECT gen_random_uuid(), now(), 'req-other-' || g, 'u', 'thumbs_up', 1, '{}'"
            b" FROM generate_series(1, 100000) g"
        )
        conn.execute(b"ANALYZE feedback")
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + ingest_module._AWAITING_FEEDBACK, (ids,)).fetchone()
        conn.rollback()
    assert row is not None
    scans = [n for n in _plan_nodes(row[0][0]["Plan"]) if n.get("Relation Name") == "feedback"]
    assert scans and all(n["Node Type"] == "Index Scan" for n in scans), scans


def test_the_sweep_repairs_the_race_for_feedback_stored_since_a_time(database_url: str) -> None:
    """Feedback stored unattributed although its interaction is stored too (two concurrent
    batches that could not see each other): a sweep attributes and counts it, once."""
    exp = declared_experiment(database_url)
    i = interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [i])
        for age_s, kind in ((7200, "thumbs_up"), (0, "copy")):  # stored without seeing ``i``
            conn.execute(
                b"INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, tags, ingested_at)"
                b" VALUES (gen_random_uuid(), now(), %s, 'u1', %s, 1, '{}',"
                b" now() - make_interval(secs => %s))",
                (i.request_id, kind, age_s),
            )
        conn.commit()

        def thumbs() -> float:
            row = conn.execute(
                b"SELECT thumbs_up + copies FROM unit_rollups WHERE experiment_id = %s AND unit_id = 'u1'",
                (exp,),
            ).fetchone()
            return float(row[0]) if row else -1.0

        recent = attribute_pending(conn, since=attribute_pending(conn, since=None).started)
        assert recent.attributed == 0  # the full sweep above took both
        assert thumbs() == 2.0
        conn.execute(b"UPDATE feedback SET experiment_id = NULL, variant = NULL WHERE request_id = %s",
                     (i.request_id,))  # fmt: skip
        conn.execute(b"UPDATE unit_rollups SET thumbs_up = 0, copies = 0 WHERE experiment_id = %s", (exp,))
        conn.execute(b"DELETE FROM feedback_counted WHERE request_id = %s", (i.request_id,))
        conn.commit()
        one_hour_ago = conn.execute(b"SELECT now() - interval '1 hour'").fetchone()
        conn.commit()
        assert one_hour_ago is not None
        assert attribute_pending(conn, since=one_hour_ago[0]).attributed == 1  # the recent one only
        assert thumbs() == 1.0
        assert attribute_pending(conn).attributed == 1  # a full sweep takes the old one
        assert attribute_pending(conn).attributed == 0
        assert thumbs() == 2.0


def test_the_incremental_sweep_reads_feedback_through_the_ingested_at_index(database_url: str) -> None:
    """100,000 old unattributed rows (traffic outside experiments) and 2,000 recent ones whose
    interactions are stored: the sweep's plan reads neither table sequentially."""
    exp = declared_experiment(database_url)
    recent = [interaction(exp, "control", f"u{k}") for k in range(2000)]
    with connect(database_url) as conn:
        ingest(conn, recent)
        conn.execute(
            b"INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, tags, ingested_at)"
            b" SELECT gen_random_uuid(), now(), 'req-old-' || g, 'u', 'thumbs_up', 1, '{}', now() - interval '2 days'"
            b" FROM generate_series(1, 100000) g"
        )
        conn.execute(
            b"INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, tags)"
            b" SELECT gen_random_uuid(), now(), r, 'u', 'thumbs_up', 1, '{}' FROM unnest(%s::text[]) r",
            ([e.request_id for e in recent],),
        )
        conn.execute(b"ANALYZE feedback")
        since = conn.execute(b"SELECT now() - interval '1 hour'").fetchone()
        assert since is not None
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + ingest_module._SWEEP_SINCE, (since[0],)).fetchone()
        found = conn.execute(ingest_module._SWEEP_SINCE, (since[0],)).fetchall()
        conn.rollback()
    assert len(found) == 2000
    assert row is not None
    nodes = _plan_nodes(row[0][0]["Plan"])
    # the unattributed rows are found by their ingested_at range, not by reading them all
    assert any(n.get("Index Name") == "ix_feedback_unattributed_ingested" for n in nodes), nodes
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes


def test_probes_read_only_their_keys_index_even_without_statistics(database_url: str) -> None:
    """Before the first ANALYZE (a new database) the planner once ANDed every probe with a
    bitmap of all the experiment's rows — a batch took tens of seconds. Each probe must
    read only the index of its key (a request id)."""
    exp = declared_experiment(database_url)
    with connect(database_url) as conn:
        conn.execute(
            b"INSERT INTO interactions (event_id, ts, request_id, route, experiment_id, variant, unit_id,"
            b" unit_source, role, mode, endpoint, model, upstream, status, http_status, latency_ms,"
            b" response_chars, stream, fallback, tags, conversation_id)"
            b" SELECT gen_random_uuid(), now(), 'req-' || %s || '-' || g, 'a', %s, 'control', 'u' || g %% 500,"
            b" 'header', 'primary', 'ab', 'chat', 'm', 'u', 'ok', 200, 10, 5, false, false, '{}',"
            b" 'conv-' || %s || '-' || g FROM generate_series(1, 20000) g",
            (exp, exp, exp),
        )
        # what the planner sees in a new database: no statistics, size unknown
        conn.execute(b"DELETE FROM pg_statistic WHERE starelid = 'interactions'::regclass")
        conn.execute(b"UPDATE pg_class SET reltuples = -1 WHERE oid = 'interactions'::regclass")
        ingest_module._prepare(conn, nested=True)
        ids = [f"req-{exp}-{k}" for k in range(1, 2001)]
        plans = {
            "sweep": (ingest_module._SWEEP_SINCE, (datetime(2000, 1, 1, tzinfo=UTC),)),
            "late attribution": (
                ingest_module._ATTRIBUTE,
                ("{00000000-0000-0000-0000-000000000000}",),
            ),
            "feedback": (ingest_module._FEEDBACK_INSERT.encode(), None),
            "awaiting": (ingest_module._AWAITING_FEEDBACK, (copy_text.text_array(ids),)),
            "on conflict": (ingest_module._INTERACTION_INSERT.encode(), None),
        }
        found = {}
        for name, (sql, params) in plans.items():
            row = conn.execute(b"EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
            assert row is not None
            found[name] = {n.get("Index Name") for n in _plan_nodes(row[0][0]["Plan"])} - {None}
        conn.rollback()
    for name, indexes in found.items():
        assert "ix_interactions_experiment_variant_ts" not in indexes, (name, indexes)


def test_no_probe_reads_a_table_sequentially_after_an_analyze_of_it_empty(pg_admin_url: str) -> None:
    """After an ANALYZE of an empty table (reltuples = 0: autovacuum right after a TRUNCATE,
    as between the ingest bench's runs) the planner costs a sequential scan of the empty
    table at zero. Concurrent consumers' COPYs then filled the table while each probe of a
    batch re-read it: one conversation probe ran ~25 s. Every probe of the ingest paths
    must stay an index probe."""
    exp = new_experiment_id()
    events = [interaction(exp, "control", f"u{k}", conversation_id=f"c{k}") for k in range(20)]
    early = [feedback(e, "thumbs_up") for e in events[:10]]  # before their interactions
    with fresh_database(pg_admin_url) as url, connect(url) as conn:
        conn.autocommit = True
        conn.execute(b"ANALYZE interactions, feedback")
        conn.autocommit = False
        plan = conn.execute(
            b"EXPLAIN (FORMAT JSON) SELECT event_id FROM interactions WHERE request_id = ANY(%s::text[])",
            ("{r0}",),
        ).fetchone()
        assert plan is not None
        # the condition is real: planned as usual, the probe reads interactions sequentially
        assert "Seq Scan" in {n["Node Type"] for n in _plan_nodes(plan[0][0]["Plan"])}
        # every path in one transaction, whose per-table scan counts are read at the end
        first = ingest_raw(conn, [], [Raw(encode(f)) for f in early])  # feedback probe
        batch = ingest_raw(conn, [Raw(encode(e), event=e) for e in events], [])  # COPY path
        again = ingest_raw(conn, [Raw(encode(e)) for e in events[:5]], [])  # ON CONFLICT path
        late = [feedback(e, "copy") for e in events[10:]]
        after = ingest_raw(conn, [], [Raw(encode(f)) for f in late])
        swept = attribute_pending(conn, since=datetime(2000, 1, 1, tzinfo=UTC))
        scans = dict(
            conn.execute(
                b"SELECT relname, seq_scan FROM pg_stat_xact_user_tables"
                b" WHERE relname IN ('interactions', 'feedback')"
            ).fetchall()
        )
        conversations = _count(
            conn, "SELECT sum(conversations) FROM unit_rollups WHERE experiment_id = %s", exp
        )
        conn.rollback()
    assert (first.feedback, first.attributed) == (10, 0)
    assert (batch.interactions, batch.attributed) == (20, 10)
    assert (again.interactions, again.duplicates) == (0, 5)
    assert (after.feedback, after.attributed) == (10, 10)
    assert swept.attributed == 0
    assert conversations == 20
    assert scans == {"interactions": 0, "feedback": 0}, scans


def test_rows_the_database_rejects_are_dead_lettered_and_the_rest_ingested(database_url: str) -> None:
    exp = declared_experiment(database_url)
    good = interaction(exp, "control", "u1")
    # The contract checks an event id's length only; the database refuses this one.
    bad = interaction(exp, "control", "u2", event_id="z" * 8 + "-zzzz-zzzz-zzzz-" + "z" * 12)
    raws = [Raw(encode(good), "t", 0, 1, b"u1"), Raw(encode(bad), "t", 0, 2, b"u2")]
    with connect(database_url) as conn:
        res = ingest_raw(conn, raws, [])
        dead = conn.execute(
            b'SELECT payload, reason, "offset" FROM dead_letters WHERE payload = %s', (encode(bad),)
        ).fetchone()
        n = _count(conn, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp)
    assert (res.interactions, res.dead_lettered) == (1, 1)
    assert n == 1
    assert dead is not None and dead[2] == 2 and "rejected by the database" in str(dead[1])


@pytest.mark.parametrize("batches", [1, 7])
def test_rollups_do_not_depend_on_batching(database_url: str, batches: int) -> None:
    exp = declared_experiment(database_url)
    events = random_events(exp, 300, random.Random(batches))
    with connect(database_url) as conn:
        step = -(-len(events) // batches)
        for i in range(0, len(events), step):
            ingest(conn, events[i : i + step])
        got = stored_rollups(conn, exp)
    assert_rollups_equal(got, expected_rollups(events))


def test_keys_with_tabs_newlines_and_backslashes_survive_the_copy_path(database_url: str) -> None:
    exp = declared_experiment(database_url)
    evs = [
        interaction(exp, "con\ttrol", "u\\1\n", tags={"ta\\sk": "co\tde\r"}, conversation_id="c\\1"),
        interaction(exp, "con\ttrol", "u\\1\n", tags={"ta\\sk": "co\tde\r"}, prompt="line1\nline2\\"),
    ]
    with connect(database_url) as conn:
        assert ingest(conn, evs).interactions == 2
        got = stored_rollups(conn, exp)
        prompt = conn.execute(
            b"SELECT prompt FROM interactions WHERE event_id = %s", (evs[1].event_id,)
        ).fetchone()
    assert prompt == ("line1\nline2\\",)
    assert_rollups_equal(got, expected_rollups(evs))


def test_a_tag_containing_the_segment_separator_is_one_segment(database_url: str) -> None:
    # The COPY path joins an event's segments with U+001F; a tag containing it makes the
    # batch take the SQL path, which must count it as one segment like any other.
    exp = declared_experiment(database_url)
    evs = [
        interaction(exp, "control", "u1", tags={"task": "a\x1fb", "lang": "en"}),
        interaction(exp, "candidate", "u2", tags={"task": "code"}),
    ]
    with connect(database_url) as conn:
        assert ingest(conn, evs).interactions == 2
        segs = segments(conn, exp)
        got = stored_rollups(conn, exp)
    assert segs == ["", "lang=en", "task=a\x1fb", "task=code"]
    assert_rollups_equal(got, expected_rollups(evs))


def test_a_batch_overlapping_stored_events_is_counted_once(database_url: str) -> None:
    exp = declared_experiment(database_url)
    events = random_events(exp, 300, random.Random(5))
    with connect(database_url) as conn:
        ingest(conn, events[:200])
        res = ingest(conn, events[100:])  # the COPY hits stored ids: redone with ON CONFLICT
        got = stored_rollups(conn, exp)
    assert res.duplicates == 100
    assert_rollups_equal(got, expected_rollups(events))


def test_a_stored_event_early_in_a_copy_sent_in_parts_fails_it_as_a_unique_violation(
    database_url: str,
) -> None:
    """The server refuses the COPY at the stored id while later parts are still being sent:
    the caller must still see the UniqueViolation it answers with the ON CONFLICT path."""
    exp = declared_experiment(database_url)
    events = [e for e in random_events(exp, 4000, random.Random(13)) if isinstance(e, InteractionEvent)]
    with connect(database_url) as conn:
        ingest(conn, [events[100]])
        ingest_module._prepare(conn, nested=False)
        with pytest.raises(psycopg.errors.UniqueViolation):
            copy_text.insert_interactions(conn, events, declared={exp: frozenset({"task"})}, part=100)
        conn.rollback()
        res = ingest(conn, events)  # what the consumer does: the same batch, the ON CONFLICT path
        got = stored_rollups(conn, exp)
    assert (res.interactions, res.duplicates) == (len(events) - 1, 1)
    assert_rollups_equal(got, expected_rollups(events))


def test_a_concurrent_duplicate_waits_and_is_counted_once(database_url: str) -> None:
    """Two consumers racing on the same events (a rebalance): the second one's COPY waits on
    the first's uncommitted rows, fails on the primary key, and is redone with ON CONFLICT."""
    exp = declared_experiment(database_url)
    events = random_events(exp, 200, random.Random(6))
    first, second = events[:150], events[50:]
    with connect(database_url) as a, connect(database_url) as b:
        a.execute(b"BEGIN")
        ingest(a, first)  # nested in a's open transaction: not committed yet
        result = while_waiting_commit(a, lambda: ingest(b, second))  # b waits on a's keys
        got = stored_rollups(a, exp)
    assert result.duplicates >= 100
    assert_rollups_equal(got, expected_rollups(events))


def test_a_new_conversation_in_two_concurrent_batches_is_counted_once(database_url: str) -> None:
    """Two consumers each hold a turn of one new conversation (a rebalance, or turns keyed to
    different partitions). A probe of the stored turns cannot see the other transaction's
    uncommitted turn, so both batches counted the conversation; now the second batch's insert
    into conversations_counted waits for the first's and counts nothing. Second batch on the
    COPY path, then on the ON CONFLICT path (it also holds a stored event)."""
    exp = declared_experiment(database_url)
    stored = interaction(exp, "control", "u-stored")
    for path in ("copy", "on conflict"):
        unit = f"u-{path}"
        t1 = interaction(exp, "control", unit, conversation_id=f"c-{path}", ts=1_700_000_000.0)
        t2 = interaction(exp, "control", unit, conversation_id=f"c-{path}", ts=1_700_000_001.0)
        with connect(database_url) as a, connect(database_url) as b:
            if path == "on conflict":
                ingest(b, [stored])
            a.execute(b"BEGIN")
            ingest(a, [t1])  # nested in a's open transaction: not committed yet
            second = [t2] if path == "copy" else [t2, stored]
            result = while_waiting_commit(a, functools.partial(ingest, b, second))
            conversations = _count(
                a,
                "SELECT sum(conversations) FROM unit_rollups WHERE experiment_id = %s AND unit_id = %s",
                exp,
                unit,
            )
            requests = _count(
                a,
                "SELECT sum(requests) FROM unit_rollups WHERE experiment_id = %s AND unit_id = %s",
                exp,
                unit,
            )
        assert result.duplicates == (1 if path == "on conflict" else 0), path
        assert (requests, conversations) == (2, 1), path


def test_a_timestamp_out_of_range_is_dead_lettered_and_the_rest_ingested(database_url: str) -> None:
    exp = declared_experiment(database_url)
    good = interaction(exp, "control", "u1")
    bad = interaction(exp, "control", "u2", ts=1e20)  # no datetime for it: the SQL path rejects it
    raws = [Raw(encode(good), "t", 0, 1, b"u1", good), Raw(encode(bad), "t", 0, 2, b"u2", bad)]
    with connect(database_url) as conn:
        res = ingest_raw(conn, raws, [])
        got = stored_rollups(conn, exp)
    assert (res.interactions, res.dead_lettered) == (1, 1)
    assert_rollups_equal(got, expected_rollups([good]))


def test_a_batch_rendered_in_parts_stores_what_the_python_loop_stores(database_url: str) -> None:
    """The C renderer's binary rows go out a part at a time; the Python loop's COPY text
    (the path without the extension) stores the same rows."""
    exp = declared_experiment(database_url)
    events = [e for e in random_events(exp, 60, random.Random(11)) if isinstance(e, InteractionEvent)]
    declared = {exp: frozenset({"task"})}

    def stored(c_renderer: bool, part: int) -> tuple[list[Any], list[Any]]:
        with connect(database_url) as conn:
            ingest_module._prepare(conn, nested=False)
            ins = copy_text.insert_interactions(
                conn, events, declared=declared, c_renderer=c_renderer, part=part
            )
            assert ins.rows == len(events)
            columns = copy_text.INTERACTION_COLUMNS  # all but ingested_at, the time of the write
            rows = conn.execute(
                f"SELECT {columns} FROM interactions WHERE experiment_id = %s ORDER BY event_id".encode(),
                (exp,),
            ).fetchall()
            fold = conn.execute(b"SELECT * FROM lg_fold ORDER BY ts, unit_id").fetchall()
            conn.rollback()
        return rows, fold

    by_python = stored(False, 10**6)
    in_parts = stored(True, 7)
    assert len(by_python[0]) == len(events) and len(by_python[1]) > 0
    assert in_parts == by_python


def test_a_value_the_c_renderer_leaves_aside_sends_the_batch_to_the_sql_path(database_url: str) -> None:
    """A declared tag holding the segment separator: the COPY fails mid-stream (in the
    batch's savepoint) and the batch is stored by the ON CONFLICT path, every event once."""
    exp = declared_experiment(database_url)
    events = [e for e in random_events(exp, 40, random.Random(12)) if isinstance(e, InteractionEvent)]
    odd = 25  # in the fourth part of 7: three parts were sent before it
    events[odd] = dataclasses.replace(events[odd], tags={"task": "a\x1fb"})
    with connect(database_url) as conn:
        ingest_module._prepare(conn, nested=False)
        with pytest.raises(copy_text.Unsupported), conn.transaction():
            copy_text.insert_interactions(conn, events, declared={exp: frozenset({"task"})}, part=7)
        assert _count(conn, "SELECT count(*) FROM interactions WHERE experiment_id = %s", exp) == 0
        conn.rollback()
        raws = [Raw(encode(e), "t", 0, i, e.unit_id.encode(), e) for i, e in enumerate(events)]
        res = ingest_raw(conn, raws, [])
        got = stored_rollups(conn, exp)
    assert (res.interactions, res.dead_lettered) == (len(events), 0)
    assert_rollups_equal(got, expected_rollups(events))
