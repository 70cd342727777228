"""How an event changes the rollups: the one fold of a batch's new rows.

Both ways of storing a batch's interactions — the COPY fast path (``copy_text``) and the
``ON CONFLICT`` path (``write``) — put the rows they actually inserted and that count
(primary calls in an experiment arm), narrowed to what the rollups read, into the session
temp table ``lg_fold``; :func:`fold_interactions` then folds ``lg_fold`` into
``unit_rollups``, ``segment_rollups``, ``rl_rollups``, ``latency_histograms`` and ``latency_samples``.
Feedback attributed by the batch is in ``lg_new_f``, folded by :func:`fold_feedback`.
Nothing else defines how an event changes a rollup: the formulas are the two tables
``INTERACTION_DELTAS`` and ``FEEDBACK_DELTAS`` (``RL_*_DELTAS`` for ``rl_rollups``), the histogram bucket is :func:`bucket_sql`,
an event's segments are :func:`segments_of`.

Segments: an event's tags whose key its experiment declares (``experiments.segment_tags``),
and ``rollout_stage`` always (the rollout controller reads it). Undeclared tags stay in
``interactions.tags`` only: a client sending many tags costs no segment rows. A batch reads
the declaration in its own transaction (:func:`declared_segments`), after taking
``segment_rollups``' ROW EXCLUSIVE lock; a change of the declaration (and a backfill,
:func:`backfill_segments`) takes SHARE ROW EXCLUSIVE on it, so it waits for the batches in
flight and every batch folds by one declaration, the one committed when it began.

Each row there is counted exactly once because it only appears when its raw row was
inserted (``ON CONFLICT DO NOTHING``, or a COPY that fails as a whole on a stored id) or
when its ``experiment_id`` went from NULL to set. Rows are grouped per key in SQL and
upserted with ``x = x + EXCLUDED.x``, in key order so that concurrent consumers lock rows
in the same order (no deadlock cycles); ``rl_rollups`` is appended to instead, a row per
counted response and per counted thumb, and its readers sum per key.

Conversations: a unit's conversations are counted exactly as distinct conversation ids:
``conv`` marks the first primary interaction of a conversation (first in its batch by
(ts, event_id), in the batch that inserts the conversation's ``conversations_counted`` row),
and every interaction without a conversation id (a stand-alone request is a one-turn
conversation); ids are scoped per experiment. A tag segment counts a conversation in the
segment of its first turn.

Yes/no feedback (``ONCE_KINDS``) counts at most once per response and kind: the first
one (by time) whose ``feedback_counted`` row this transaction inserts; a thumbs-up etc.
counts only with a value > 0 (task_success's 0 is a "no" and counts). Repeats, and a
zero, stay in ``feedback`` as sent. A thumbs-down after a thumbs-up for the same response
counts as one of each: the kinds are independent signals, never retracted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import psycopg
from psycopg import pq

from analytics.ingest import samples
from contracts.events import FEEDBACK_KINDS, ROLLOUT_STAGE_TAG
from contracts.tables import (
    BUCKETS_PER_E,
    FEEDBACK_MEASURES,
    INTERACTION_MEASURES,
    LENGTH_BINS_PER_DOUBLING,
    MIN_BUCKETED,
    RL_MEASURES,
)

_BUILTIN_KINDS: Final = "ARRAY[" + ", ".join(f"'{k}'" for k in sorted(FEEDBACK_KINDS)) + "]"
#: Feedback that says yes about a response: counted once per response, with a value > 0.
YES_KINDS: Final = ("thumbs_up", "thumbs_down", "regenerate", "copy", "edit", "continued")
#: Counted at most once per response and kind (task_success: 0 or 1, both count).
ONCE_KINDS: Final = (*YES_KINDS, "task_success")
_ONCE: Final = "ARRAY[" + ", ".join(f"'{k}'" for k in ONCE_KINDS) + "]"

#: Separates an event's segments ("key=value" per tag) in ``lg_fold.segments``: one text is
#: cheaper for Postgres to split than jsonb to expand per row.
SEGMENT_SEP: Final = "\x1f"
#: SEGMENT_SEP as an escape inside a SQL ``E'...'`` string, and as a SQL literal.
_SEP_ESCAPE: Final = f"\\x{ord(SEGMENT_SEP):02x}"
_SEP_SQL: Final = f"E'{_SEP_ESCAPE}'"

# lg_fold: one row per counted interaction. ``segments``: its segments joined by
# SEGMENT_SEP (NULL without tags). ``tags_with_sep``: its tags, only when one of them
# contains SEGMENT_SEP (segments is then NULL) — the rare case the joined text cannot
# hold, written by the ON CONFLICT path (the COPY path leaves such batches to it).
# COLLATE "C": the batch's keys are sorted and grouped byte-wise (the database's default
# collation may be a libc locale, whose strcoll comparisons cost more than the sort).
TEMP_TABLES: Final = """
CREATE TEMP TABLE IF NOT EXISTS lg_stage_i (
    event_id uuid, ts float8, request_id text, route text, experiment_id int, variant text,
    unit_id text, unit_source text, role text, pair_id text, mode text, endpoint text, model text,
    upstream text, status text, http_status int, error_type text, latency_ms float8, ttft_ms float8,
    prompt_tokens int, completion_tokens int, response_chars int, finish_reason text, stream bool,
    fallback bool, fallback_from text, conversation_id text, tags jsonb, prompt text, response text,
    category text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS lg_stage_f (doc json) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS lg_new_f (
    request_id text, kind text, value float8, ts timestamptz, experiment_id int, variant text,
    unit_id text, tags jsonb, status text, category text, completion_tokens int
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS lg_fold (
    experiment_id int, variant text COLLATE "C", unit_id text COLLATE "C", ts timestamptz, status text,
    fallback bool, latency_ms float8, ttft_ms float8, prompt_tokens int, completion_tokens int,
    response_chars int, segments text COLLATE "C", conv bool, tags_with_sep jsonb, category text COLLATE "C"
) ON COMMIT DELETE ROWS;
"""
#: The ``lg_fold`` columns both paths write (``tags_with_sep`` only the ON CONFLICT path).
FOLD_COLUMNS: Final = (
    "experiment_id, variant, unit_id, ts, status, fallback, latency_ms, ttft_ms, prompt_tokens,"
    " completion_tokens, response_chars, segments, conv, category"
)
#: What ``lg_new_f`` rows carry of their response (the RL-risk fold's key), in this order.
RESPONSE_COLUMNS: Final = ("status", "category", "completion_tokens")


#: The tag keys folded into an experiment's segments: experiment id -> keys (with
#: ``rollout_stage``), for the experiments declaring any; any other experiment: ``ALWAYS``.
Declared = Mapping[int, frozenset[str]]
ALWAYS: Final = frozenset({ROLLOUT_STAGE_TAG})
NONE_DECLARED: Final[Declared] = {}

# One round trip: the lock, then the declarations (a batch's other statements are few).
_DECLARED: Final = (
    b"LOCK TABLE segment_rollups IN ROW EXCLUSIVE MODE;"
    b" SELECT id, segment_tags FROM experiments WHERE segment_tags <> '{}'"
)


def declared_segments(pg: psycopg.Connection[Any]) -> Declared:
    """The declared segment keys, read in the caller's transaction (a batch's) under
    ``segment_rollups``' ROW EXCLUSIVE lock: a declaration change waits for this batch, and
    this batch for a change already under way (see the module's docstring)."""
    cur = pg.execute(_DECLARED)
    cur.nextset()  # past the LOCK's empty result
    rows = cur.fetchall()
    return {int(eid): frozenset((*keys, ROLLOUT_STAGE_TAG)) for eid, keys in rows}


def declared_sql(key: str, experiment: str) -> str:
    """Whether the tag key ``key`` is folded into the segments of experiment ``experiment``
    (SQL expressions): ``declared_segments``' rule, for the statements that expand tags themselves."""
    return (
        f"({key} = '{ROLLOUT_STAGE_TAG}' OR {key} = ANY(coalesce((SELECT x.segment_tags::text[]"
        f" FROM experiments x WHERE x.id = {experiment}), '{{}}')))"
    )


def segments_of(row: str) -> str:
    """The segments of an ``lg_fold`` row (or a grouping of its columns) named ``row``, one
    per output row: a set-returning SQL expression (none without tags)."""
    return (
        f"unnest(CASE WHEN {row}.tags_with_sep IS NULL THEN string_to_array({row}.segments, {_SEP_SQL})"
        f" ELSE ARRAY(SELECT key || '=' || value FROM jsonb_each_text({row}.tags_with_sep)) END)"
    )


def joined_segments_sql(tags: str, keep: str) -> str:
    """The segments of the jsonb tags ``tags`` whose key ``t.key`` satisfies ``keep``, as
    ``lg_fold`` holds them (SQL, the body of a lateral subquery, one row): ``joined`` (the
    kept tags as ``key=value`` joined by SEGMENT_SEP), ``sep`` (one of them holds the
    separator: the row then carries ``kept``, the kept tags as jsonb, in ``tags_with_sep``).
    The stored-events counterpart of ``copy_text``'s renderers."""
    return (
        f"SELECT string_agg(t.key || '=' || t.value, {_SEP_SQL}) AS joined,"
        f" coalesce(bool_or(strpos(t.key || t.value, {_SEP_SQL}) > 0), false) AS sep,"
        f" jsonb_object_agg(t.key, t.value) AS kept"
        f" FROM jsonb_each_text({tags}) t WHERE {keep}"
    )


def stage_of(row: str) -> str:
    """The rollout-stage segment (``rollout_stage=N``) of an ``lg_fold`` row named ``row`` in
    SQL: '' without one; NULL for a row whose tags hold the separator (``tags_with_sep``,
    rare: not looked into)."""
    return (
        f"CASE WHEN {row}.tags_with_sep IS NOT NULL THEN NULL"
        f" WHEN {row}.segments IS NULL OR strpos({row}.segments, '{ROLLOUT_STAGE_TAG}=') = 0 THEN ''"
        f" ELSE coalesce(substring({row}.segments FROM E'(?:^|{_SEP_ESCAPE})({ROLLOUT_STAGE_TAG}=[^{_SEP_ESCAPE}]*)'), '') END"
    )


def _has_segments(row: str) -> str:
    return f"({row}.segments IS NOT NULL OR {row}.tags_with_sep IS NOT NULL)"


def bucket_sql(column: str) -> str:
    """The histogram bucket of ``column`` in SQL: ``analytics.stats.quantile.bucket_of``'s rule
    (tests/analytics/ingest/test_histogram_buckets.py checks that both agree)."""
    return f"floor(ln(greatest({column}, {MIN_BUCKETED})) * {BUCKETS_PER_E})::int"


def _rate(kind: str) -> str:
    return f"count(*) FILTER (WHERE kind = '{kind}')::float8"


def _sum(kind: str) -> str:
    return f"coalesce(sum(value) FILTER (WHERE kind = '{kind}'), 0)"


#: Each interaction measure's delta over a group of ``lg_fold`` rows.
INTERACTION_DELTAS: Final = {
    "requests": "count(*)::float8",
    "errors": "count(*) FILTER (WHERE status = 'error')::float8",
    "fallbacks": "count(*) FILTER (WHERE fallback)::float8",
    "latency_sum": "sum(latency_ms)",
    "ttft_n": "count(ttft_ms)::float8",
    "ttft_sum": "coalesce(sum(ttft_ms), 0)",
    "prompt_tokens": "coalesce(sum(prompt_tokens), 0)::float8",
    "completion_tokens": "coalesce(sum(completion_tokens), 0)::float8",
    "response_chars": "sum(response_chars)::float8",
    "conversations": "count(*) FILTER (WHERE conv)::float8",
    "turns": "count(*)::float8",
}
#: Each feedback measure's delta over a group of ``lg_new_f`` rows of built-in kinds.
FEEDBACK_DELTAS: Final = {
    "thumbs_up": _rate("thumbs_up"),
    "thumbs_down": _rate("thumbs_down"),
    "ratings_n": _rate("rating"),
    "ratings_sum": _sum("rating"),
    "regenerates": _rate("regenerate"),
    "copies": _rate("copy"),
    "edits": _rate("edit"),
    "continued": _rate("continued"),
    "task_success_n": _rate("task_success"),
    "task_success_sum": _sum("task_success"),
}
#: The RL-risk detectors' rollup (``rl_rollups``): per (experiment, variant, unit, category,
#: length bin) of primary ``ok`` responses, their count and completion tokens (from
#: ``lg_fold``) and their counted thumbs (from ``lg_new_f``, once per response and kind).
#: Unlike the other rollups ingest **appends** to it: each counted response and each counted
#: thumb adds a row of its own (its key and these values), and readers sum per key
#: (``analytics.report.risks``). Nearly every response has a (unit, category, length bin) of
#: its own, so an upsert per key was an index probe and an insert per response all the same,
#: and costlier than the append (its cost: bench/ingest/README.md). ``compact_rl_rollups``
#: later sums the appended rows into one row per key, out of the ingest path. Each entry is
#: a row's value, summed by readers.
RL_INTERACTION_DELTAS: Final = {
    "responses": "1::float8",
    "tokens": "greatest(coalesce(completion_tokens, 0), 0)::float8",
}
#: First key of the compaction's two-int advisory lock (the second: the experiment id).
RL_COMPACT_LOCK: Final = 0x4C47524C  # "LGRL"; the rollout's namespace is control.locking's
RL_FEEDBACK_DELTAS: Final = {
    "thumbs_up": "(kind = 'thumbs_up')::int::float8",
    "thumbs_down": "(kind = 'thumbs_down')::int::float8",
}


def length_bin_sql(tokens: str) -> str:
    """The length bin of ``tokens`` completion tokens in SQL: ``analytics.risks.curve.length_bin``'s
    rule, ``LENGTH_BINS_PER_DOUBLING`` (tests/analytics/ingest/test_rl_rollups.py checks both agree)."""
    return (
        f"floor({LENGTH_BINS_PER_DOUBLING} * ln(1 + greatest(coalesce({tokens}, 0), 0)::float8)"
        " / ln(2.0::float8))::int"
    )


def _rl_append(deltas: dict[str, str], source: str) -> str:
    """One ``rl_rollups`` row per ``source`` row of an ``ok`` response: no grouping, no
    conflict check, no lock (concurrent consumers append side by side)."""
    return f"""
INSERT INTO rl_rollups (experiment_id, variant, unit_id, category, lbin, {", ".join(deltas)})
SELECT experiment_id, variant, unit_id, coalesce(category, 'other'), {length_bin_sql("completion_tokens")},
    {", ".join(deltas.values())}
FROM {source} WHERE status = 'ok'
"""


RL_FOLD: Final = _rl_append(RL_INTERACTION_DELTAS, "lg_fold").encode()
RL_FEEDBACK_FOLD: Final = _rl_append(
    RL_FEEDBACK_DELTAS, "(SELECT * FROM lg_new_f WHERE kind IN ('thumbs_up', 'thumbs_down')) f"
).encode()

# Compaction (``compact_rl_rollups``): up to ``n`` of an experiment's appended rows are deleted
# and their sums per key added to the key's compacted row, in one statement. Rows appended by
# transactions that commit later are not seen (they wait for the next run), so no sum is lost
# or counted twice; readers see the rows before or after, summing per key either way.
# ctid = ANY(ARRAY(...)): a TID scan of the chosen rows, whatever the experiment's size.
RL_COMPACT: Final = f"""
WITH d AS (
    DELETE FROM rl_rollups WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM rl_rollups WHERE experiment_id = %(e)s AND NOT compacted LIMIT %(n)s))
    RETURNING variant, unit_id, category, lbin, {", ".join(RL_MEASURES)}
), g AS (
    SELECT variant, unit_id, category, lbin, {", ".join(f"sum({m}) AS {m}" for m in RL_MEASURES)}
    FROM d GROUP BY variant, unit_id, category, lbin
), ins AS (
    INSERT INTO rl_rollups AS t (experiment_id, variant, unit_id, category, lbin, {", ".join(RL_MEASURES)}, compacted)
    SELECT %(e)s, variant, unit_id, category, lbin, {", ".join(RL_MEASURES)}, true FROM g
    ORDER BY variant, unit_id, category, lbin
    ON CONFLICT (experiment_id, variant, unit_id, category, lbin) WHERE compacted
    DO UPDATE SET {", ".join(f"{m} = t.{m} + EXCLUDED.{m}" for m in RL_MEASURES)}
)
SELECT count(*) FROM d
""".encode()

#: Experiments with appended (not yet compacted) rows: one index probe per experiment.
RL_PENDING: Final = (
    b"SELECT e.id FROM experiments e WHERE EXISTS"
    b" (SELECT 1 FROM rl_rollups r WHERE r.experiment_id = e.id AND NOT r.compacted) ORDER BY e.id"
)

#: Rows moved per transaction: a bounded delete, sort and upsert, committed before the next.
RL_COMPACT_CHUNK: Final = 200_000


def compact_rl_rollups(
    pg: psycopg.Connection[Any],
    experiment_id: int,
    chunk: int = RL_COMPACT_CHUNK,
    deadline: float | None = None,
) -> int:
    """Move an experiment's appended ``rl_rollups`` rows into its compacted rows (one per key),
    ``chunk`` rows per transaction, until none is left or ``time.monotonic()`` passes
    ``deadline``. Returns the rows moved; 0 when another process holds the experiment's
    compaction lock. ``pg`` must not be in a transaction (each chunk commits its own)."""
    if pg.info.transaction_status != pq.TransactionStatus.IDLE:
        raise RuntimeError("compact_rl_rollups commits per chunk: call it outside a transaction")
    moved = 0
    while True:
        with pg.transaction():
            locked = pg.execute(
                b"SELECT pg_try_advisory_xact_lock(%s, %s)", (RL_COMPACT_LOCK, experiment_id)
            ).fetchone()
            if not (locked and locked[0]):
                return moved
            row = pg.execute(RL_COMPACT, {"e": experiment_id, "n": chunk}).fetchone()
        n = int(row[0]) if row else 0
        moved += n
        if n < chunk or (deadline is not None and time.monotonic() > deadline):
            return moved


def compact_all_rl_rollups(pg: psycopg.Connection[Any], deadline: float | None = None) -> int:
    """Compact every experiment with appended rows (``compact_rl_rollups``); the rows moved."""
    experiments = [int(r[0]) for r in pg.execute(RL_PENDING).fetchall()]
    pg.commit()
    moved = 0
    for e in experiments:
        if deadline is not None and time.monotonic() > deadline:
            break
        moved += compact_rl_rollups(pg, e, deadline=deadline)
    return moved


#: The same rollup defined on the stored rows: one experiment's primary ``ok`` responses,
#: each with its counted thumbs (the first attributed one with a value > 0 per kind, as
#: ``feedback_counted`` keeps). The migration backfills with it; the report's per-row
#: check (tests) and the benchmark read it in place of ``rl_rollups``.
RL_ROWS: Final = f"""
SELECT i.experiment_id, i.variant, i.unit_id, coalesce(i.category, 'other') AS category,
    {length_bin_sql("i.completion_tokens")} AS lbin, count(*)::float8 AS responses,
    sum(greatest(coalesce(i.completion_tokens, 0), 0))::float8 AS tokens,
    count(*) FILTER (WHERE f.up)::float8 AS thumbs_up, count(*) FILTER (WHERE f.down)::float8 AS thumbs_down
FROM interactions i LEFT JOIN (
    SELECT request_id, bool_or(kind = 'thumbs_up') AS up, bool_or(kind = 'thumbs_down') AS down
    FROM feedback WHERE experiment_id = :e AND kind IN ('thumbs_up', 'thumbs_down') AND value > 0
    GROUP BY request_id
) f USING (request_id)
WHERE i.experiment_id = :e AND i.role = 'primary' AND i.status = 'ok' AND i.variant IS NOT NULL
GROUP BY 1, 2, 3, 4, 5
"""

# A measure added to contracts.tables without its formula here fails at import, not later.
assert set(RL_INTERACTION_DELTAS) | set(RL_FEEDBACK_DELTAS) == set(RL_MEASURES), "rl_rollups' measures"
assert tuple(INTERACTION_DELTAS) == INTERACTION_MEASURES, "one delta per interaction measure, in order"
assert tuple(FEEDBACK_DELTAS) == FEEDBACK_MEASURES, "one delta per feedback measure, in order"

_TS_SET: Final = (
    "first_ts = least(t.first_ts, EXCLUDED.first_ts), last_ts = greatest(t.last_ts, EXCLUDED.last_ts)"
)


def _segment_upsert(deltas: dict[str, str], segment_source: str) -> str:
    """Upsert the deltas of ``segment_source`` rows (one per segment, with a ``segment``
    column) per segment and unit."""
    cols = ", ".join(deltas)
    sums = "min(ts), max(ts), " + ", ".join(deltas.values())
    add = ", ".join(f"{m} = t.{m} + EXCLUDED.{m}" for m in deltas)
    return f"""
INSERT INTO segment_rollups AS t (experiment_id, segment, variant, unit_id, first_ts, last_ts, {cols})
SELECT experiment_id, segment, variant, unit_id, {sums}
FROM {segment_source}
GROUP BY experiment_id, segment, variant, unit_id
ORDER BY experiment_id, segment, variant, unit_id
ON CONFLICT (experiment_id, segment, variant, unit_id) DO UPDATE SET {_TS_SET}, {add}
"""


def _upsert(deltas: dict[str, str], source: str, segment_source: str) -> str:
    """Upsert the deltas of ``source`` rows per unit, and of ``segment_source`` rows (the
    same, one per segment, with a ``segment`` column) per segment and unit."""
    cols = ", ".join(deltas)
    sums = "min(ts), max(ts), " + ", ".join(deltas.values())
    add = ", ".join(f"{m} = t.{m} + EXCLUDED.{m}" for m in deltas)
    return f"""
WITH u AS (
    -- ORDER BY the key: concurrent consumers lock rows in the same order (no deadlock
    -- cycles), and index pages are visited in order (unit_id first was 50% slower).
    INSERT INTO unit_rollups AS t (experiment_id, variant, unit_id, first_ts, last_ts, {cols})
    SELECT experiment_id, variant, unit_id, {sums}
    FROM {source} GROUP BY experiment_id, variant, unit_id
    ORDER BY experiment_id, variant, unit_id
    ON CONFLICT (experiment_id, variant, unit_id) DO UPDATE SET {_TS_SET}, {add}
){_segment_upsert(deltas, segment_source)}"""


# Unit and segment deltas are aggregated separately, each straight from ``lg_fold``: one
# grouping of (unit rows + segment rows) sorted twice the rows. lg_fold's segments are
# the declared ones already (the renderer drops the others).
_FOLD_SEGMENTS: Final = f"lg_fold f, {segments_of('f')} segment WHERE {_has_segments('f')}"
FOLD: Final = _upsert(INTERACTION_DELTAS, "lg_fold", _FOLD_SEGMENTS).encode()
SEGMENT_FOLD: Final = _segment_upsert(INTERACTION_DELTAS, _FOLD_SEGMENTS).encode()


def _histograms(overall: bool) -> str:
    """Fold lg_fold into the latency histograms: per segment, and overall ('') when ``overall``."""
    whole = (
        """SELECT experiment_id, metric, '' AS segment, variant, bucket, n FROM g
        UNION ALL
        """
        if overall
        else ""
    )
    return f"""
WITH v AS (
    SELECT experiment_id, variant, segments, tags_with_sep, 'latency' AS metric,
        {bucket_sql("latency_ms")} AS bucket
    FROM lg_fold
    UNION ALL
    SELECT experiment_id, variant, segments, tags_with_sep, 'ttft', {bucket_sql("ttft_ms")}
    FROM lg_fold WHERE ttft_ms IS NOT NULL
), g AS (
    -- Count before expanding segments: far fewer rows to split.
    SELECT experiment_id, variant, segments, tags_with_sep, metric, bucket, count(*) AS n
    FROM v GROUP BY 1, 2, 3, 4, 5, 6
), dh AS (
    SELECT experiment_id, metric, segment, variant, bucket, sum(n) AS n FROM (
        {whole}SELECT experiment_id, metric, segment, variant, bucket, n
        FROM g, {segments_of("g")} segment WHERE {_has_segments("g")}
    ) x GROUP BY 1, 2, 3, 4, 5
)
INSERT INTO latency_histograms AS h (experiment_id, metric, segment, variant, bucket, count)
SELECT experiment_id, metric, segment, variant, bucket, n FROM dh
ORDER BY experiment_id, metric, segment, variant, bucket
ON CONFLICT (experiment_id, metric, segment, variant, bucket) DO UPDATE SET count = h.count + EXCLUDED.count
"""


# Last statement of a batch's interactions: every consumer updates the same histogram rows,
# so their locks are taken as late as possible (held until the commit that follows).
HISTOGRAMS: Final = _histograms(overall=True).encode()
SEGMENT_HISTOGRAMS: Final = _histograms(overall=False).encode()

SAMPLES: Final = samples.fold_sql("lg_fold", segments_of, stage_of).encode()

_BUILTIN_FEEDBACK: Final = f"(SELECT * FROM lg_new_f WHERE kind = ANY({_BUILTIN_KINDS}))"
_FEEDBACK_SEGMENTS: Final = (
    f"(SELECT f.*, t.key || '=' || t.value AS segment FROM {_BUILTIN_FEEDBACK} f, jsonb_each_text(f.tags) t"
    f" WHERE {declared_sql('t.key', 'f.experiment_id')}) s"
)
FEEDBACK_FOLD: Final = _upsert(FEEDBACK_DELTAS, f"{_BUILTIN_FEEDBACK} f", _FEEDBACK_SEGMENTS).encode()
SEGMENT_FEEDBACK_FOLD: Final = _segment_upsert(FEEDBACK_DELTAS, _FEEDBACK_SEGMENTS).encode()

# Custom feedback kinds: {"<kind>": sum, "<kind>:n": count} merged key by key.
_MERGE = """(SELECT coalesce(jsonb_object_agg(k, s), '{}'::jsonb) FROM (
        SELECT k, sum(v::float8) AS s FROM (
            SELECT * FROM jsonb_each_text(t.counters) UNION ALL SELECT * FROM jsonb_each_text(EXCLUDED.counters)
        ) x(k, v) GROUP BY k) y)"""


def _counters(units: bool) -> str:
    """Fold custom feedback kinds: per segment, and per unit when ``units``."""
    unit_part = f"""ua AS (
    SELECT experiment_id, variant, unit_id, min(t0) AS t0, max(t1) AS t1,
        jsonb_object_agg(kind, s) || jsonb_object_agg(kind || ':n', n) AS counters
    FROM a GROUP BY experiment_id, variant, unit_id
), u AS (
    INSERT INTO unit_rollups AS t (experiment_id, variant, unit_id, first_ts, last_ts, counters)
    SELECT * FROM ua ORDER BY experiment_id, variant, unit_id
    ON CONFLICT (experiment_id, variant, unit_id) DO UPDATE SET counters = {_MERGE}
    RETURNING 1
), """
    return f"""
WITH f AS (
    SELECT experiment_id, variant, unit_id, tags, ts, kind, value FROM lg_new_f
    WHERE NOT (kind = ANY({_BUILTIN_KINDS}))
), a AS (
    SELECT experiment_id, variant, unit_id, kind, sum(value) AS s, count(*) AS n, min(ts) AS t0, max(ts) AS t1
    FROM f GROUP BY experiment_id, variant, unit_id, kind
), {unit_part if units else ""}sa0 AS (
    SELECT f.experiment_id, t.key || '=' || t.value AS segment, f.variant, f.unit_id, f.kind,
        sum(f.value) AS s, count(*) AS n, min(f.ts) AS t0, max(f.ts) AS t1
    FROM f, jsonb_each_text(f.tags) t WHERE {declared_sql("t.key", "f.experiment_id")} GROUP BY 1, 2, 3, 4, 5
), sa AS (
    SELECT experiment_id, segment, variant, unit_id, min(t0) AS t0, max(t1) AS t1,
        jsonb_object_agg(kind, s) || jsonb_object_agg(kind || ':n', n) AS counters
    FROM sa0 GROUP BY experiment_id, segment, variant, unit_id
)
INSERT INTO segment_rollups AS t (experiment_id, segment, variant, unit_id, first_ts, last_ts, counters)
SELECT * FROM sa ORDER BY experiment_id, segment, variant, unit_id
ON CONFLICT (experiment_id, segment, variant, unit_id) DO UPDATE SET counters = {_MERGE}
"""


COUNTERS: Final = _counters(units=True).encode()
SEGMENT_COUNTERS: Final = _counters(units=False).encode()


# Of the batch's attributed feedback of ONCE_KINDS, keep in lg_new_f only the first per
# (response, kind) whose feedback_counted row is inserted now: a row already there (counted
# by an earlier batch) or a concurrent transaction's (the insert waits for it, then
# conflicts) means it was counted already. Keys are inserted in order: no deadlock cycles.
ONCE: Final = f"""
WITH cand AS (
    SELECT DISTINCT ON (request_id, kind) ctid AS row, request_id, kind FROM lg_new_f
    WHERE kind = ANY({_ONCE}) AND (value > 0 OR kind = 'task_success')
    ORDER BY request_id, kind, ts
), won AS (
    INSERT INTO feedback_counted (request_id, kind)
    SELECT request_id, kind FROM cand ORDER BY request_id, kind
    ON CONFLICT DO NOTHING
    RETURNING request_id, kind
)
DELETE FROM lg_new_f f
WHERE f.kind = ANY({_ONCE}) AND f.ctid NOT IN (SELECT c.row FROM cand c JOIN won w USING (request_id, kind))
""".encode()


def fold_interactions(pg: psycopg.Connection[Any], cuts: samples.SampleCuts | None = None) -> None:
    """Fold ``lg_fold`` into the rollups, the latency samples and histograms (caller's
    transaction). ``cuts``: the writer's known sample cuts (none: every request is looked at)."""
    pg.execute(FOLD)
    pg.execute(RL_FOLD)
    known = cuts if cuts is not None else samples.SampleCuts()
    answered = pg.execute(SAMPLES, known.params()).fetchall()
    known.learn(answered)
    pg.execute(HISTOGRAMS)


def fold_feedback(pg: psycopg.Connection[Any]) -> None:
    """Fold ``lg_new_f`` (feedback attributed by this batch) into the rollups (caller's transaction)."""
    pg.execute(ONCE)
    pg.execute(FEEDBACK_FOLD)
    pg.execute(RL_FEEDBACK_FOLD)
    pg.execute(COUNTERS)


# --- backfill of declared segments -------------------------------------------------------

# The experiment's counted interactions carrying one of the keys, into lg_fold with only
# those keys as segments. A conversation counts in the segments of its first primary turn
# by (ts, event_id) — the batch rule, over all stored turns.
_BACKFILL_FOLD: Final = f"""
INSERT INTO lg_fold ({FOLD_COLUMNS}, tags_with_sep)
SELECT experiment_id, variant, unit_id, ts, status, fallback, latency_ms, ttft_ms, prompt_tokens,
    completion_tokens, response_chars, CASE WHEN NOT s.sep THEN s.joined END, conv, category,
    CASE WHEN s.sep THEN s.kept END
FROM (
    SELECT i.*, i.conversation_id IS NULL OR row_number() OVER (
        PARTITION BY i.conversation_id ORDER BY i.ts, i.event_id) = 1 AS conv
    FROM interactions i
    WHERE i.experiment_id = %(e)s AND i.role = 'primary' AND i.variant IS NOT NULL
) c CROSS JOIN LATERAL (
    {joined_segments_sql("c.tags", "t.key = ANY(%(keys)s::text[])")}) s
WHERE c.tags ?| %(keys)s::text[]
""".encode()

# The experiment's attributed feedback on responses carrying one of the keys, into
# lg_new_f (tags: only those keys) as the batches counted it: every custom kind and rating;
# of ONCE_KINDS the first stored per (response, kind) with a value > 0 (task_success: any).
_BACKFILL_FEEDBACK: Final = f"""
INSERT INTO lg_new_f
SELECT request_id, kind, value, ts, experiment_id, variant, unit_id, kept, status, category, completion_tokens
FROM (
    SELECT f.request_id, f.kind, f.value, f.ts, f.experiment_id, f.variant, i.unit_id, i.status, i.category,
        i.completion_tokens,
        (SELECT jsonb_object_agg(t.key, t.value) FROM jsonb_each_text(i.tags) t
         WHERE t.key = ANY(%(keys)s::text[])) AS kept,
        f.kind = ANY({_ONCE}) AS once, (f.value > 0 OR f.kind = 'task_success') AS counts,
        row_number() OVER (
            PARTITION BY f.request_id, f.kind, (f.value > 0 OR f.kind = 'task_success')
            ORDER BY f.ingested_at, f.ts, f.event_id) AS nth
    FROM feedback f JOIN interactions i ON i.request_id = f.request_id AND i.experiment_id = f.experiment_id
        AND i.role = 'primary'
    WHERE f.experiment_id = %(e)s AND i.tags ?| %(keys)s::text[]
) x
WHERE NOT once OR (counts AND nth = 1)
""".encode()

_BACKFILL_DELETE: Final = (
    b"DELETE FROM segment_rollups WHERE experiment_id = %(e)s AND split_part(segment, '=', 1) = ANY(%(keys)s::text[])",
    b"DELETE FROM latency_histograms WHERE experiment_id = %(e)s AND segment <> ''"
    b" AND split_part(segment, '=', 1) = ANY(%(keys)s::text[])",
)


def backfill_segments(pg: psycopg.Connection[Any], experiment_id: int, keys: Sequence[str]) -> int:
    """Recompute the experiment's segments of the tag ``keys`` from the stored events
    (``interactions.tags``): their segment rollups and latency histograms are deleted and
    folded again, as the batches would have folded them had the keys been declared from the
    start. Returns the segment rollup rows written.

    The caller's transaction must hold ``segment_rollups`` in SHARE ROW EXCLUSIVE mode
    (no batch in flight or starting) and the keys must be declared (the segment folds keep
    declared keys only) and not ``rollout_stage`` (always folded: recomputing it would be
    the same rows). Feedback counts as the batches count it, the first stored per response
    and kind for the yes/no kinds (``feedback_counted`` keeps which responses, not which event).
    """
    keys = sorted(set(keys))
    if not keys:
        return 0
    if ROLLOUT_STAGE_TAG in keys:
        raise ValueError(f"{ROLLOUT_STAGE_TAG} is always folded: nothing to backfill")
    params = {"e": experiment_id, "keys": keys}
    pg.execute(TEMP_TABLES.encode())
    pg.execute(b"DELETE FROM lg_fold; DELETE FROM lg_new_f")
    with pg.cursor() as cur:
        for delete in _BACKFILL_DELETE:
            cur.execute(delete, params)
        cur.execute(_BACKFILL_FOLD, params)
        cur.execute(SEGMENT_FOLD)
        written = max(0, cur.rowcount)
        cur.execute(SEGMENT_HISTOGRAMS)
        cur.execute(_BACKFILL_FEEDBACK, params)
        cur.execute(SEGMENT_FEEDBACK_FOLD)
        cur.execute(SEGMENT_COUNTERS)
    pg.execute(b"DELETE FROM lg_fold; DELETE FROM lg_new_f")
    return written
