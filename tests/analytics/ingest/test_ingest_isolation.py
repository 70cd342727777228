"""One bad event never slows the rest: the database's refusals are isolated by bisection.

The cost of a batch is read off the wire (libpq's protocol trace): round trips (each ends
with the server's ReadyForQuery) and COPY bytes sent. Wall time is left to the benchmark.
"""

from __future__ import annotations

import contextlib
import math
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq

from analytics.ingest.write import Raw, ingest_raw
from contracts.events import Event, FeedbackEvent, InteractionEvent, encode
from tests.analytics.ingest_helpers import (
    assert_rollups_equal,
    connect,
    declared_experiment,
    expected_rollups,
    random_events,
    stored_rollups,
)

BATCH = 2000
# Ids of UUID length the database cannot read as a UUID (the contract checks the length only).
BAD_UUID = "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"


@dataclass
class Wire:
    round_trips: int = 0
    copy_bytes: int = 0


@contextlib.contextmanager
def traced(conn: psycopg.Connection[Any]) -> Iterator[Wire]:
    """Count the round trips and COPY bytes of what runs inside (libpq's protocol trace)."""
    wire = Wire()
    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield wire
        finally:
            conn.pgconn.untrace()
            f.seek(0)
            for line in f:
                parts = line.split("\t")
                if len(parts) >= 3 and parts[0] == "B" and parts[2].startswith("ReadyForQuery"):
                    wire.round_trips += 1
                elif len(parts) >= 3 and parts[0] == "F" and parts[2].startswith("CopyData"):
                    wire.copy_bytes += int(parts[1])


def raws(events: list[Event]) -> tuple[list[Raw], list[Raw]]:
    """The consumer's view of a batch: interactions with their decoding, feedback as bytes."""
    inter = [
        Raw(encode(e), "i", 0, n, e.key, e) for n, e in enumerate(events) if isinstance(e, InteractionEvent)
    ]
    fb = [Raw(encode(e), "f", 0, n, e.key) for n, e in enumerate(events) if isinstance(e, FeedbackEvent)]
    return inter, fb


def poison(events: list[Event], k: int, rng: random.Random) -> list[Event]:
    """k events the database refuses (it cannot hold a NUL, nor read this id as a UUID)."""
    picked = set(rng.sample(range(len(events)), k))
    for i in sorted(picked):
        e = events[i]
        if isinstance(e, InteractionEvent) and i % 2:
            e.unit_id += "\x00"  # as if a producer's contract missed it: decode refuses it today
        else:
            e.event_id = BAD_UUID[:-4] + f"{i:04d}"
    return [events[i] for i in sorted(picked)]


def write(database_url: str, events: list[Event]) -> tuple[Any, Wire]:
    inter, fb = raws(events)
    with connect(database_url) as conn:
        ingest_raw(conn, [], [])  # the session's temp tables exist before tracing, as in a consumer
        with traced(conn) as wire:
            res = ingest_raw(conn, inter, fb)
    return res, wire


def test_a_batch_with_one_or_five_refused_events_costs_about_one_more_clean_batch(database_url: str) -> None:
    rng = random.Random(21)
    _, base = write(database_url, random_events(declared_experiment(database_url), BATCH, rng)[:BATCH])
    for k in (1, 5):
        exp = declared_experiment(database_url)
        events = random_events(exp, BATCH, rng)[:BATCH]
        bad = poison(events, k, rng)
        res, wire = write(database_url, events)
        good = [e for e in events if e not in bad]
        with connect(database_url) as conn:
            got = stored_rollups(conn, exp)
            dead = conn.execute(
                b"SELECT payload, reason FROM dead_letters WHERE payload = ANY(%s)",
                ([encode(e) for e in bad],),
            ).fetchall()
        # Every good event exactly once; only the refused ones dead-lettered, with the reason.
        assert_rollups_equal(got, expected_rollups(good))
        assert res.dead_lettered == k and len(dead) == k
        assert all(str(r[1]).startswith("rejected by the database: ") for r in dead)
        assert len(res.refused) == k and set(res.refused) <= {"i", "f"}
        # The failed attempt, the rest in one part, each refused event alone (one by one:
        # ~15 round trips per event, 30,000 here).
        assert wire.round_trips <= 2 * base.round_trips + 10 * k, (k, wire, base)
        assert wire.copy_bytes <= 2.2 * base.copy_bytes, (k, wire, base)


def test_what_the_screen_misses_is_found_by_bisection_in_log_n_attempts(database_url: str) -> None:
    """A refusal only the database knows of (here a CHECK constraint added for the test):
    the Python screen finds no suspect, bisection finds the events."""
    rng = random.Random(22)
    levels = math.ceil(math.log2(BATCH))
    with connect(database_url) as conn:
        conn.execute(
            b"ALTER TABLE interactions ADD CONSTRAINT lg_test_no_poison CHECK (unit_id NOT LIKE 'poison%')"
        )
        ingest_raw(conn, [], [])
        inter, fb = raws(random_events(declared_experiment(database_url), BATCH, rng)[:BATCH])
        with traced(conn) as base:
            ingest_raw(conn, inter, fb)
        for k in (1, 5):
            exp = declared_experiment(database_url)
            events = random_events(exp, BATCH, rng)[:BATCH]
            bad = rng.sample([e for e in events if isinstance(e, InteractionEvent)], k)
            for e in bad:
                e.unit_id = "poison-" + e.unit_id
            inter, fb = raws(events)
            with traced(conn) as wire:
                res = ingest_raw(conn, inter, fb)
            got = stored_rollups(conn, exp)
            assert_rollups_equal(got, expected_rollups([e for e in events if e not in bad]))
            assert res.dead_lettered == k and res.refused == ("i",) * k
            # Per refused event two attempts per halving, ~15 round trips each (one by one:
            # ~15 per event, 30,000 here).
            assert wire.round_trips <= base.round_trips + k * 2 * levels * 16, (k, wire, base)
            assert wire.round_trips < BATCH, (k, wire, base)

            assert wire.copy_bytes <= base.copy_bytes * (3 + 2 * math.log2(2 * k)), (k, wire, base)
        conn.rollback()  # the constraint and the rows go


def test_refusal_reasons_quote_no_row_values(database_url: str) -> None:
    exp = declared_experiment(database_url)
    events = random_events(exp, 20, random.Random(3))
    secret_unit = "unit-with-a-private-value"
    target = next(e for e in events if isinstance(e, InteractionEvent))
    target.unit_id = secret_unit + "\x00"
    res, _ = write(database_url, events)
    with connect(database_url) as conn:
        row = conn.execute(
            b"SELECT reason FROM dead_letters WHERE payload = %s", (encode(target),)
        ).fetchone()
    assert res.dead_lettered == 1 and row is not None
    assert "NUL" in row[0] and secret_unit not in row[0]
