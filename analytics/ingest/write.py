"""Idempotent ingest of a batch of events: raw rows + per-unit rollups, one transaction.

The steps of a batch (``_batch``):

1. Store the interactions, one of two ways. The COPY fast path (``copy_text``: COPY
   straight into ``interactions``) in a savepoint; if a stored event makes it fail (a
   redelivery), the ``ON CONFLICT`` path: the rows are COPYed into a session temp table
   and ``INSERT … SELECT … ON CONFLICT (event_id) DO NOTHING`` stores them. Either way only
   the rows actually inserted, and of those the counted ones, reach the session temp table
   ``lg_fold``, so a redelivered event is never counted twice.
   An event's segments are its tags of the keys its experiment declares (and
   ``rollout_stage``), read at the start of the batch's transaction
   (``rollups.declared_segments``).
2. ``analytics.ingest.rollups.fold_interactions`` folds ``lg_fold`` into ``unit_rollups``,
   ``segment_rollups``, ``latency_histograms`` and ``latency_samples``: one fold for both paths.
3. Feedback stored before its interaction is attributed now (the UPDATE only touches rows
   whose ``experiment_id`` is still NULL, so that happens exactly once), into ``lg_new_f``.
4. Feedback, much rarer, is COPYed as JSON documents (parsed by ``json_to_record``) and
   stored ``ON CONFLICT DO NOTHING``, attributed to its interaction (experiment, variant,
   unit, tags) by request id when that interaction is already stored (into ``lg_new_f``);
   otherwise it waits for step 3 of a later batch.
5. ``analytics.ingest.rollups.fold_feedback`` folds ``lg_new_f`` into the rollups.

Events ``contracts.events.decode`` refuses never get here (the consumer dead-letters them
at decode). Should the database still refuse a batch for some events' values (a class 22
or 23 error: a value it cannot hold, a constraint), the refused events are isolated in
savepoints (``_isolating``): the batch is screened once in Python and written without its
suspects, each suspect alone; what the screen misses is found by bisection, O(log n)
attempts per refused event. An event refused alone goes to ``dead_letters`` with its raw
bytes and the database's reason (the primary message only: no row values, no bound
parameters); every other event is written exactly once, in its batch's transaction.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

import orjson
import psycopg
from psycopg import pq
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from analytics.ingest import copy_text, rollups
from analytics.ingest.copy_text import CountedConversations
from analytics.ingest.dead_letters import DeadLetterRow, write_dead_letters
from analytics.ingest.samples import SampleCuts
from contracts import redaction
from contracts.events import DecodeError, Event, InteractionEvent, JudgeEvent, NgramsEvent, decode, topic_for

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Raw:
    """One encoded event and where it came from (for the dead-letter table).

    Not frozen: one is built per consumed record, and a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) costs 0.7 µs against 0.2.
    """

    payload: bytes
    topic: str = ""
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None
    event: Event | None = None  # the decoding of ``payload``, when the caller has it already


@dataclass(frozen=True, slots=True)
class IngestResult:
    interactions: int = 0  # raw interaction rows inserted (duplicates excluded)
    feedback: int = 0  # raw feedback rows inserted
    duplicates: int = 0  # events already stored (redeliveries)
    attributed: int = 0  # feedback attributed to an experiment by this batch
    dead_lettered: int = 0  # all dead letters written, those given and those refused
    refused: tuple[str, ...] = ()  # the topic of each event the database refused

    def __add__(self, o: IngestResult) -> IngestResult:
        return IngestResult(
            self.interactions + o.interactions,
            self.feedback + o.feedback,
            self.duplicates + o.duplicates,
            self.attributed + o.attributed,
            self.dead_lettered + o.dead_lettered,
            self.refused + o.refused,
        )


_INTERACTION_INSERT: Final = f"""
WITH src AS (
    SELECT * FROM lg_stage_i
), ins AS (
    INSERT INTO interactions (event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source,
        role, pair_id, mode, endpoint, model, upstream, status, http_status, error_type, latency_ms, ttft_ms,
        prompt_tokens, completion_tokens, response_chars, finish_reason, stream, fallback, fallback_from,
        conversation_id, tags, prompt, response, category)
    SELECT event_id, to_timestamp(ts), request_id, route, experiment_id, variant, unit_id, unit_source,
        role, pair_id, mode, endpoint, model, upstream, status, http_status, error_type, latency_ms, ttft_ms,
        prompt_tokens, completion_tokens, coalesce(response_chars, 0), finish_reason, coalesce(stream, false),
        coalesce(fallback, false), fallback_from, conversation_id, coalesce(tags, '{{}}'), prompt, response,
        category
    FROM src
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, request_id, ts, experiment_id, variant, unit_id, role, status, fallback, latency_ms,
        ttft_ms, prompt_tokens, completion_tokens, response_chars, conversation_id, tags, category
), counted AS (
    SELECT * FROM ins WHERE role = 'primary' AND experiment_id IS NOT NULL AND variant IS NOT NULL
), new_conv AS (  -- the batch's conversations not counted before (copy_text._NEW_CONVERSATIONS)
    INSERT INTO conversations_counted (experiment_id, conversation_id)
    SELECT DISTINCT experiment_id, conversation_id FROM counted WHERE conversation_id IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING
    RETURNING experiment_id, conversation_id
), fold AS (
    -- The same lg_fold rows as the COPY path writes (analytics.ingest.rollups folds them):
    -- conv on a conversation's first turn in the batch, when the batch counts it (new_conv).
    INSERT INTO lg_fold ({rollups.FOLD_COLUMNS}, tags_with_sep)
    SELECT c.experiment_id, variant, unit_id, ts, status, fallback, latency_ms, ttft_ms, prompt_tokens,
        completion_tokens, response_chars, CASE WHEN NOT s.sep THEN s.joined END,
        c.conversation_id IS NULL OR (
            row_number() OVER (PARTITION BY c.experiment_id, c.conversation_id ORDER BY ts, event_id) = 1
            AND n.conversation_id IS NOT NULL),
        category, CASE WHEN s.sep THEN s.kept END
    FROM counted c LEFT JOIN new_conv n  -- a join, not EXISTS: one hash, not a scan per row
        ON n.experiment_id = c.experiment_id AND n.conversation_id = c.conversation_id
    CROSS JOIN LATERAL (  -- the declared tags only
        {rollups.joined_segments_sql("c.tags", rollups.declared_sql("t.key", "c.experiment_id"))}) s
)
SELECT (SELECT count(*) FROM ins), (SELECT coalesce(array_agg(request_id), '{{}}') FROM counted)
"""


# Probes of ``interactions`` by one key (a request id) read only that key's
# index: ``(SELECT … WHERE key = $x OFFSET 0)`` keeps the other conditions out of the scan.
# Given ``experiment_id`` conditions too, the planner may AND a bitmap of the key's index
# with one of ix_interactions_experiment_variant_ts — every row of the experiment, per
# probe — whenever its statistics do not show how unselective the experiment is (before
# the first ANALYZE of a new database, or for a new experiment): a 20,000-event batch then
# took tens of seconds (the ingest bench's first run stalled ~60 s, until autovacuum).
def _primary_of(request_id: str) -> str:
    """LATERAL body: the primary interaction in an experiment of ``request_id`` (an SQL expression)."""
    return (
        "SELECT x.experiment_id, x.variant, x.unit_id, x.tags, x.status, x.category, x.completion_tokens"
        f" FROM (SELECT * FROM interactions y WHERE y.request_id = {request_id} OFFSET 0) x"
        " WHERE x.role = 'primary' AND x.experiment_id IS NOT NULL AND x.variant IS NOT NULL LIMIT 1"
    )


_FEEDBACK_INSERT: Final = f"""
WITH src AS (
    SELECT r.* FROM lg_stage_f s, json_to_record(s.doc) AS r(
        event_id uuid, ts float8, request_id text, unit_id text, kind text, value float8, tags jsonb)
), ins AS (
    INSERT INTO feedback (event_id, ts, request_id, unit_id, kind, value, experiment_id, variant, tags)
    SELECT src.event_id, to_timestamp(src.ts), src.request_id, src.unit_id, src.kind,
        coalesce(src.value, 1.0), i.experiment_id, i.variant, coalesce(src.tags, '{{}}')
    FROM src LEFT JOIN LATERAL ({_primary_of("src.request_id")}) i ON true
    ON CONFLICT (event_id) DO NOTHING
    RETURNING request_id, kind, value, ts, experiment_id, variant
), attributed AS (
    INSERT INTO lg_new_f
    SELECT ins.request_id, ins.kind, ins.value, ins.ts, ins.experiment_id, ins.variant, i.unit_id, i.tags,
        i.status, i.category, i.completion_tokens
    FROM ins LEFT JOIN LATERAL (
        SELECT x.unit_id, x.tags, x.status, x.category, x.completion_tokens
        FROM (SELECT * FROM interactions y WHERE y.request_id = ins.request_id OFFSET 0) x
        WHERE x.role = 'primary' AND x.experiment_id = ins.experiment_id
        LIMIT 1) i ON true
    WHERE ins.experiment_id IS NOT NULL
)
SELECT count(*) FROM ins
"""

# Feedback stored earlier, whose interaction this batch inserted, in two steps. First the
# batch's request ids that have unattributed feedback: one probe of the partial index per
# id (OFFSET 0 keeps the LATERAL a per-row probe; as a join the planner hashed the whole
# unattributed feedback, a sequential scan of ``feedback`` per batch: 80 ms with 300,000
# rows, growing with every feedback on traffic outside experiments). Usually none.
_AWAITING_FEEDBACK: Final = (
    b"SELECT f.event_id FROM unnest(%s::text[]) r(request_id) CROSS JOIN LATERAL ("
    b" SELECT x.event_id FROM feedback x WHERE x.request_id = r.request_id AND x.experiment_id IS NULL"
    b" OFFSET 0) f"
)
# Then those rows, by primary key: attributed once (only while experiment_id is NULL).
_ATTRIBUTE: Final = f"""
WITH m AS (
    SELECT f.event_id, i.experiment_id, i.variant, i.unit_id, i.tags, i.status, i.category, i.completion_tokens
    FROM feedback f CROSS JOIN LATERAL ({_primary_of("f.request_id")}) i
    WHERE f.event_id = ANY(%s::uuid[]) AND f.experiment_id IS NULL
), upd AS (
    UPDATE feedback f SET experiment_id = m.experiment_id, variant = m.variant
    FROM m WHERE f.event_id = m.event_id AND f.experiment_id IS NULL
    RETURNING f.request_id, f.kind, f.value, f.ts, m.experiment_id, m.variant, m.unit_id, m.tags, m.status,
        m.category, m.completion_tokens
)
INSERT INTO lg_new_f SELECT * FROM upd
""".encode()


def _attribute(pg: psycopg.Connection[Any], feedback_ids: Sequence[Any]) -> None:
    """Attribute these unattributed feedback rows (event ids) to their interactions, into lg_new_f.

    Run inside ``copy_text.index_probes``."""
    if feedback_ids:
        pg.execute(_ATTRIBUTE, ("{" + ",".join(str(f) for f in feedback_ids) + "}",))


def _attribute_late(pg: psycopg.Connection[Any], request_ids: Sequence[str]) -> None:
    """Attribute feedback stored before its interaction (the batch's ``request_ids``)."""
    if request_ids:
        with copy_text.index_probes(pg):
            rows = pg.execute(_AWAITING_FEEDBACK, (copy_text.text_array(request_ids),)).fetchall()
            _attribute(pg, [r[0] for r in rows])


# Safety net for a race between two consumers (feedback and its interaction committed by
# different transactions that could not see each other): attribute what is now joinable.
# Two forms on purpose. Over all unattributed feedback (a process's first sweep) one
# UPDATE … FROM, which the planner runs as a hash join: 0.4 s per million rows, where
# probing row by row takes 1.8 s. Over what was stored since a time (every later sweep)
# the partial index on ingested_at finds the rows, each probed by its request id, then
# ``_ATTRIBUTE`` on those. Feedback on traffic outside experiments stays unattributed for
# ever, so only the second form stays cheap as it accumulates.
_SWEEP_ALL: Final = b"""
WITH upd AS (
    UPDATE feedback f SET experiment_id = i.experiment_id, variant = i.variant
    FROM interactions i
    WHERE f.experiment_id IS NULL AND i.request_id = f.request_id
        AND i.role = 'primary' AND i.experiment_id IS NOT NULL AND i.variant IS NOT NULL
    RETURNING f.request_id, f.kind, f.value, f.ts, i.experiment_id, i.variant, i.unit_id, i.tags, i.status,
        i.category, i.completion_tokens
)
INSERT INTO lg_new_f SELECT * FROM upd
"""
_SWEEP_SINCE: Final = f"""
SELECT f.event_id FROM feedback f CROSS JOIN LATERAL ({_primary_of("f.request_id")}) i
WHERE f.experiment_id IS NULL AND f.ingested_at >= %s
""".encode()


def _copy_escape(payload: bytes) -> bytes:
    """COPY text format: backslash, newline, CR and tab must be escaped."""
    out = payload.replace(b"\\", b"\\\\")
    if b"\n" in out or b"\r" in out or b"\t" in out:
        out = out.replace(b"\n", b"\\n").replace(b"\r", b"\\r").replace(b"\t", b"\\t")
    return out


def _prepare(pg: psycopg.Connection[Any], nested: bool) -> None:
    row = pg.execute(b"SELECT to_regclass('pg_temp.lg_fold') IS NOT NULL").fetchone()
    if not (row and row[0]):
        pg.execute(rollups.TEMP_TABLES.encode())
    elif nested:
        # Inside a caller's transaction earlier batches' rows are still there (ON COMMIT
        # DELETE ROWS empties them only at commit).
        pg.execute(
            b"DELETE FROM lg_stage_i; DELETE FROM lg_stage_f; DELETE FROM lg_new_f; DELETE FROM lg_fold"
        )


def _copy(pg: psycopg.Connection[Any], table: str, payloads: Sequence[Raw]) -> None:
    if not payloads:
        return
    buf = b"\n".join(_copy_escape(r.payload) for r in payloads) + b"\n"
    with pg.cursor() as cur, cur.copy(f"COPY {table} (doc) FROM STDIN".encode()) as copy:
        copy.write(buf)


# Same columns, same order as ``copy_text.interaction_row`` writes them.
_STAGE_I: Final = f"COPY lg_stage_i ({copy_text.INTERACTION_COLUMNS}) FROM STDIN".encode()


def _copy_interactions(pg: psycopg.Connection[Any], raws: Sequence[Raw]) -> None:
    """Typed rows straight from the decoded events: Postgres parses no JSON but the tags."""
    if not raws:
        return
    with pg.cursor() as cur, cur.copy(_STAGE_I) as copy:
        for raw in raws:
            e = raw.event if raw.event is not None else decode(raw.payload)
            assert isinstance(e, InteractionEvent)
            copy.write_row(copy_text.interaction_row(e, e.ts))


def _count(pg: psycopg.Connection[Any], sql: bytes) -> int:
    row = pg.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _insert_by_copy(
    pg: psycopg.Connection[Any],
    raws: Sequence[Raw],
    declared: rollups.Declared,
    conversations: CountedConversations | None = None,
) -> tuple[int, list[str]]:
    """The COPY fast path: (rows inserted, request ids of the counted ones)."""
    events: list[InteractionEvent] = []
    for r in raws:
        e = r.event if r.event is not None else decode(r.payload)
        assert isinstance(e, InteractionEvent)
        events.append(e)
    ins = copy_text.insert_interactions(pg, events, declared=declared, conversations=conversations)
    return ins.rows, ins.attributable


def _insert_on_conflict(pg: psycopg.Connection[Any], raws: Sequence[Raw]) -> tuple[int, list[str]]:
    """The ON CONFLICT path: (rows inserted, request ids of the counted ones)."""
    _copy_interactions(pg, raws)
    with copy_text.index_probes(pg):
        row = pg.execute(_INTERACTION_INSERT.encode()).fetchone()
    assert row is not None
    return int(row[0]), list(row[1])


def _batch(
    pg: psycopg.Connection[Any],
    interactions: Sequence[Raw],
    feedback: Sequence[Raw],
    declared: rollups.Declared,
    nested: bool = True,
    fast: bool = False,
    cuts: SampleCuts | None = None,
    conversations: CountedConversations | None = None,
) -> IngestResult:
    _prepare(pg, nested)
    n_i = n_f = 0
    if interactions:
        # 1. store the new interactions; the counted ones also go into lg_fold
        if fast:
            n_i, counted = _insert_by_copy(pg, interactions, declared, conversations)
        else:
            n_i, counted = _insert_on_conflict(pg, interactions)
        # 2. fold lg_fold into the rollups: the one fold, whichever path stored the rows
        if counted:
            rollups.fold_interactions(pg, cuts)
        # 3. feedback stored before its interaction is attributed now (into lg_new_f)
        _attribute_late(pg, counted)
    # 4. store the feedback; what is attributed to an experiment goes into lg_new_f
    _copy(pg, "lg_stage_f", feedback)
    if feedback:
        with copy_text.index_probes(pg):
            n_f = _count(pg, _FEEDBACK_INSERT.encode())
    # 5. fold lg_new_f into the rollups
    attributed = _count(pg, b"SELECT count(*) FROM lg_new_f")
    if attributed:
        rollups.fold_feedback(pg)
    dupes = len(interactions) + len(feedback) - n_i - n_f
    return IngestResult(n_i, n_f, dupes, attributed)


def _fast_or_safe(
    pg: psycopg.Connection[Any],
    interactions: Sequence[Raw],
    feedback: Sequence[Raw],
    declared: rollups.Declared,
    nested: bool,
    cuts: SampleCuts | None,
    conversations: CountedConversations | None = None,
) -> IngestResult:
    """COPY fast path in a savepoint; on a concurrent duplicate, the ON CONFLICT path."""
    if not interactions:
        return _batch(pg, interactions, feedback, declared, nested)
    try:
        with pg.transaction():
            return _batch(
                pg,
                interactions,
                feedback,
                declared,
                nested,
                fast=True,
                cuts=cuts,
                conversations=conversations,
            )
    except (psycopg.errors.UniqueViolation, copy_text.Unsupported) as exc:
        log.info("COPY fast path not applicable (%s); batch redone with ON CONFLICT", exc)
    if conversations is not None:
        conversations.spoil()  # what the COPY path registered was rolled back
    return _batch(pg, interactions, feedback, declared, nested=True, cuts=cuts)


# What the database refuses because of the values of the events at hand: their data
# (class 22: out of range, malformed, NUL, ...) or a constraint (class 23); or a payload
# handed over undecoded that the contract refuses. Anything else (connection lost,
# deadlock, serialization failure) concerns the whole batch, which the caller retries.
_REFUSED: Final = (psycopg.DataError, psycopg.IntegrityError, DecodeError)


_Part = tuple[Sequence[Raw], Sequence[Raw]]  # (interactions, feedback) of a batch


def refusal_reason(exc: BaseException) -> str:
    """Why the database refused an event: its primary message and SQLSTATE, never the
    DETAIL (which quotes the failing row) or bound parameters; configured secrets masked."""
    diag = getattr(exc, "diag", None)
    primary = diag.message_primary if diag is not None else None
    text = primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    code = diag.sqlstate if diag is not None else None
    return redaction.redact(f"{text} (SQLSTATE {code})" if code else text)


def _halves(part: _Part) -> tuple[_Part, _Part]:
    """The batch (interactions, then feedback) cut in two halves of equal size."""
    interactions, feedback = part
    mid = (len(interactions) + len(feedback)) // 2
    if mid <= len(interactions):
        return (interactions[:mid], ()), (interactions[mid:], feedback)
    k = mid - len(interactions)
    return (interactions, feedback[:k]), ((), feedback[k:])


# What PostgreSQL reads as a uuid (the contract checks an event id's length only: a
# pattern would be paid per event on the consumer's hot loop).
_UUID: Final = re.compile(r"[0-9a-fA-F]{8}(?:-?[0-9a-fA-F]{4}){3}-?[0-9a-fA-F]{12}")


def _suspect(raw: Raw) -> bool:
    """Whether the database would likely refuse this event (checked the slow way)."""
    try:
        ev = decode(raw.payload)
    except DecodeError:
        return True
    return raw.event not in (None, ev) or not _UUID.fullmatch(ev.event_id)


def _screen(part: _Part) -> tuple[_Part, list[_Part]]:
    """The part without its suspects, and each suspect alone (interactions, then feedback)."""
    interactions, feedback = part
    bad_i = [r for r in interactions if _suspect(r)]
    bad_f = [r for r in feedback if _suspect(r)]
    out = {id(r) for r in (*bad_i, *bad_f)}
    rest = ([r for r in interactions if id(r) not in out], [r for r in feedback if id(r) not in out])
    return rest, [([r], ()) for r in bad_i] + [((), [r]) for r in bad_f]


def _isolating(
    pg: psycopg.Connection[Any],
    interactions: Sequence[Raw],
    feedback: Sequence[Raw],
    declared: rollups.Declared,
    nested: bool,
    cuts: SampleCuts | None = None,
    conversations: CountedConversations | None = None,
) -> tuple[IngestResult, list[DeadLetterRow]]:
    """Write the batch; if the database refuses it, isolate the refused events.

    Every attempt runs in a savepoint, so a refused part leaves nothing behind. After the
    first refusal the batch is screened once in Python (``_suspect``: the contract's full
    check and a strict UUID): the rest is written as one part and each suspect alone, so
    the usual bad event costs two more attempts. What the screen misses is found by
    bisection: a refused part is halved and each half written on its own (left first:
    batch order), down to the single events the database refuses, which become dead
    letters with its reason — O(log n) attempts per refused event.
    """
    total = IngestResult()
    refused: list[DeadLetterRow] = []
    todo: list[_Part] = [(interactions, feedback)]
    first, screened = True, False
    while todo:
        part = todo.pop()
        try:
            with pg.transaction():
                # After the first attempt the temp tables may hold a written part's rows.
                total += _fast_or_safe(
                    pg, *part, declared, nested=nested or not first, cuts=cuts, conversations=conversations
                )
        except _REFUSED as exc:
            if conversations is not None:
                conversations.spoil()  # the part's registrations were rolled back
            if first:
                log.warning(
                    "the database refused a batch of %s events (%s); isolating the refused ones",
                    len(interactions) + len(feedback),
                    type(exc).__name__,
                )
            if len(part[0]) + len(part[1]) == 1:
                raw = (part[0] or part[1])[0]
                reason = (
                    exc.reason
                    if isinstance(exc, DecodeError)
                    else f"rejected by the database: {refusal_reason(exc)}"
                )
                refused.append(
                    DeadLetterRow(raw.topic, raw.partition, raw.offset, raw.key, raw.payload, reason)
                )
            elif not screened and (screen := _screen(part))[1]:
                screened = True
                rest, alone = screen
                todo += [*reversed(alone), rest]  # the rest first, then the suspects in order
            else:
                screened = True
                left, right = _halves(part)
                todo += (right, left)  # left is popped first
        first = False
    return total, refused


_JUDGEMENT_INSERT: Final = b"""
INSERT INTO judgements (event_id, ts, request_id, unit_id, judge, role, status, latency_ms, experiment_id,
    variant, pair_id, category, score, error_type)
VALUES (%s, to_timestamp(%s), %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (event_id) DO NOTHING
"""


_NGRAMS_INSERT: Final = b"""
INSERT INTO response_ngrams (event_id, ts, request_id, unit_id, role, key_id, experiment_id, variant, category,
    grams)
VALUES (%s, to_timestamp(%s), %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (event_id) DO NOTHING
"""


def write_judgements(pg: psycopg.Connection[Any], judgements: Sequence[Raw]) -> int:
    """Store the sampled records of responses: judge scores, once per (request, judge), and
    hashed n-grams, once per request (their event ids are derived from those)."""
    rows, grams = [], []
    for raw in judgements:
        e = raw.event if raw.event is not None else decode(raw.payload)
        if isinstance(e, NgramsEvent):
            grams.append(
                (e.event_id, e.ts, e.request_id, e.unit_id, e.role, e.key_id, e.experiment_id, e.variant,
                 e.category, e.grams)
            )  # fmt: skip
            continue
        assert isinstance(e, JudgeEvent)
        rows.append(
            (
                e.event_id, e.ts, e.request_id, e.unit_id, e.judge, e.role, e.status, e.latency_ms,
                e.experiment_id, e.variant, e.pair_id, e.category, e.score, e.error_type,
            )
        )  # fmt: skip
    stored = 0
    with pg.cursor() as cur:
        for statement, values in ((_JUDGEMENT_INSERT, rows), (_NGRAMS_INSERT, grams)):
            if values:
                cur.executemany(statement, values)
                stored += max(0, cur.rowcount)
    return stored


def ingest_raw(
    pg: psycopg.Connection[Any],
    interactions: Sequence[Raw],
    feedback: Sequence[Raw],
    dead_letters: Sequence[DeadLetterRow] = (),
    judgements: Sequence[Raw] = (),
    cuts: SampleCuts | None = None,
    conversations: CountedConversations | None = None,
) -> IngestResult:
    """Ingest validated encoded events (and store dead letters) in one transaction.

    Commits when ``pg`` had no transaction open; inside a caller's transaction it uses a
    savepoint and leaves the commit to the caller. Events the database refuses are
    isolated (``_isolating``) and stored as dead letters with the others. Judge scores
    (already validated by ``decode`` against the table's bounds) go in the same transaction.
    ``cuts``: the writer's ``SampleCuts``, ``conversations``: its ``CountedConversations``
    (a consumer keeps one of each across its batches).
    """
    nested = pg.info.transaction_status != pq.TransactionStatus.IDLE
    if cuts is not None:
        cuts.begin(learn=not nested)
    if conversations is not None:
        conversations.begin(learn=not nested)
    with pg.transaction():
        # The declared segment keys, read once under the fold's lock (kept by this
        # transaction whatever the attempts' savepoints roll back): rollups.declared_segments.
        declared = rollups.declared_segments(pg)
        res, refused = _isolating(pg, interactions, feedback, declared, nested, cuts, conversations)
        write_judgements(pg, judgements)
        dead = [*dead_letters, *refused]
        write_dead_letters(pg, dead)
    if conversations is not None:
        conversations.committed()  # learns only when this call opened (and so committed) it
    return replace(res, dead_lettered=len(dead), refused=tuple(d.topic for d in refused))


@dataclass(frozen=True, slots=True)
class Sweep:
    attributed: int  # feedback attributed (and counted) by this sweep
    started: datetime  # the database's clock at the sweep's start (its ``now()``)


def attribute_pending(pg: psycopg.Connection[Any], since: datetime | None = None) -> Sweep:
    """Attribute feedback whose interaction is stored but which is still unattributed.

    ``since``: only feedback stored (``ingested_at``) at or after it — the race this
    sweep repairs (feedback and its interaction in concurrent transactions) involves
    recent rows only; None re-reads every unattributed row.
    """
    with pg.transaction():
        _prepare(pg, nested=True)
        rollups.declared_segments(pg)  # the fold's lock, as a batch takes it
        row = pg.execute(b"SELECT now()").fetchone()
        assert row is not None
        if since is None:
            pg.execute(_SWEEP_ALL)
        else:
            with copy_text.index_probes(pg):
                _attribute(pg, [r[0] for r in pg.execute(_SWEEP_SINCE, (since,)).fetchall()])
        n = _count(pg, b"SELECT count(*) FROM lg_new_f")
        if n:
            rollups.fold_feedback(pg)
        return Sweep(n, row[0])


@contextlib.contextmanager
def psycopg_connection(
    conn: Engine | Connection | Session | psycopg.Connection[Any],
) -> Iterator[psycopg.Connection[Any]]:
    """The psycopg connection under an SQLAlchemy engine/connection/session (or itself).

    An Engine lends a pooled connection and commits on exit; a Connection/Session keeps
    the caller's transaction.
    """
    if isinstance(conn, psycopg.Connection):
        yield conn
        return
    if isinstance(conn, Engine):
        raw = conn.raw_connection()
        try:
            pg = raw.driver_connection
            assert isinstance(pg, psycopg.Connection)
            yield pg
            if pg.info.transaction_status == pq.TransactionStatus.INTRANS:
                pg.commit()
        finally:
            raw.close()
        return
    sa_conn = conn.connection() if isinstance(conn, Session) else conn
    pg = sa_conn.connection.driver_connection
    assert isinstance(pg, psycopg.Connection)
    yield pg


@dataclass(frozen=True, slots=True)
class Encoded:
    interactions: list[Raw]
    feedback: list[Raw]
    dead: list[DeadLetterRow]  # events ``decode`` refuses, with the reason
    judgements: list[Raw] = field(default_factory=list)  # judge scores and hashed n-grams (own tables)


def encode_for_ingest(events: Sequence[Event]) -> Encoded:
    """Encode in-process events and check them as the consumer does (``decode``).

    An event the contract refuses (a NUL, a value out of range) becomes a dead letter here,
    as it would on the Kafka path, instead of making the database refuse the batch.
    """
    out = Encoded([], [], [], [])
    for ev in events:
        try:
            payload = orjson.dumps(ev)
        except orjson.JSONEncodeError as exc:  # e.g. a lone surrogate in a string
            payload = repr(ev).encode("utf-8", "backslashreplace")
            out.dead.append(DeadLetterRow(topic_for(ev), None, None, None, payload, f"cannot encode: {exc}"))
            continue
        try:
            decode(payload)
        except DecodeError as exc:
            out.dead.append(DeadLetterRow(topic_for(ev), None, None, ev.key, payload, exc.reason))
            continue
        raw = Raw(payload, topic_for(ev), event=ev)
        if isinstance(ev, (JudgeEvent, NgramsEvent)):
            out.judgements.append(raw)
        else:
            (out.interactions if isinstance(ev, InteractionEvent) else out.feedback).append(raw)
    return out


def ingest(
    conn: Engine | Connection | Session | psycopg.Connection[Any], events: Sequence[Event]
) -> IngestResult:
    """Ingest events idempotently (same batch twice = same rows and rollups)."""
    enc = encode_for_ingest(events)
    with psycopg_connection(conn) as pg:
        return ingest_raw(pg, enc.interactions, enc.feedback, enc.dead, enc.judgements)
