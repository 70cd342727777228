"""SQL that folds newly inserted events into the per-unit rollups and histograms.

Input: the session's temp tables ``lg_new_i`` (interactions inserted by this batch) and
``lg_new_f`` (feedback attributed by this batch: inserted with a known interaction, or
attributed now because its interaction just arrived). Each row there is counted exactly
once because it only appears when its raw row was inserted (``ON CONFLICT DO NOTHING``)
or when its ``experiment_id`` went from NULL to set.

Rows are grouped per key in SQL and upserted with ``x = x + EXCLUDED.x``, in key order
so that concurrent consumers lock rows in the same order (no deadlock cycles).

Conversations: a unit's conversations are counted exactly as distinct conversation ids:
``new_conv`` marks the first primary interaction of a conversation (first in its batch
by time, and none stored before the batch), plus one per interaction without a conversation
id (a stand-alone request is a one-turn conversation); ids are scoped per experiment.
A tag segment counts a
conversation in the segment of its first turn.

Yes/no feedback (``ONCE_KINDS``) counts at most once per response and kind: the first
one (by time) whose ``feedback_counted`` row this transaction inserts; a thumbs-up etc.
counts only with a value > 0 (task_success's 0 is a "no" and counts). Repeats, and a
zero, stay in ``feedback`` as sent. A thumbs-down after a thumbs-up for the same response
counts as one of each: the kinds are independent signals, never retracted.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from analytics.ingest import samples
from analytics.stats.quantile import BUCKETS_PER_E, MIN_BUCKETED
from contracts.events import FEEDBACK_KINDS
from contracts.tables import ROLLUP_MEASURES

_BUILTIN_KINDS: Final = "ARRAY[" + ", ".join(f"'{k}'" for k in sorted(FEEDBACK_KINDS)) + "]"
#: Feedback that says yes about a response: counted once per response, with a value > 0.
YES_KINDS: Final = ("thumbs_up", "thumbs_down", "regenerate", "copy", "edit", "continued")
#: Counted at most once per response and kind (task_success: 0 or 1, both count).
ONCE_KINDS: Final = (*YES_KINDS, "task_success")
_ONCE: Final = "ARRAY[" + ", ".join(f"'{k}'" for k in ONCE_KINDS) + "]"

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
CREATE TEMP TABLE IF NOT EXISTS lg_new_i (
    request_id text, ts timestamptz, experiment_id int, variant text, unit_id text, role text,
    status text, fallback bool, latency_ms float8, ttft_ms float8, prompt_tokens int,
    completion_tokens int, response_chars int, conversation_id text, new_conv bool, tags jsonb
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS lg_new_f (
    request_id text, kind text, value float8, ts timestamptz, experiment_id int, variant text,
    unit_id text, tags jsonb
) ON COMMIT DELETE ROWS;
"""

_MEASURES = ", ".join(ROLLUP_MEASURES)
_ADDITIVE = list(ROLLUP_MEASURES)

# One row per contribution: an interaction (primary, in an experiment) or a feedback.
_CONTRIB = f"""
c AS (
    SELECT experiment_id, variant, unit_id, tags, ts,
        1.0 AS requests, (status = 'error')::int::float8 AS errors, fallback::int::float8 AS fallbacks,
        latency_ms AS latency_sum, (ttft_ms IS NOT NULL)::int::float8 AS ttft_n,
        coalesce(ttft_ms, 0) AS ttft_sum, coalesce(prompt_tokens, 0)::float8 AS prompt_tokens,
        coalesce(completion_tokens, 0)::float8 AS completion_tokens,
        response_chars::float8 AS response_chars,
        (new_conv OR conversation_id IS NULL)::int::float8 AS conversations, 1.0 AS turns,
        0.0 AS thumbs_up, 0.0 AS thumbs_down, 0.0 AS ratings_n, 0.0 AS ratings_sum, 0.0 AS regenerates,
        0.0 AS copies, 0.0 AS edits, 0.0 AS continued, 0.0 AS task_success_n, 0.0 AS task_success_sum
    FROM lg_new_i WHERE role = 'primary' AND experiment_id IS NOT NULL AND variant IS NOT NULL
    UNION ALL
    SELECT experiment_id, variant, unit_id, tags, ts,
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        (kind = 'thumbs_up')::int::float8, (kind = 'thumbs_down')::int::float8,
        (kind = 'rating')::int::float8, CASE WHEN kind = 'rating' THEN value ELSE 0 END,
        (kind = 'regenerate')::int::float8, (kind = 'copy')::int::float8, (kind = 'edit')::int::float8,
        (kind = 'continued')::int::float8, (kind = 'task_success')::int::float8,
        CASE WHEN kind = 'task_success' THEN value ELSE 0 END
    FROM lg_new_f WHERE kind = ANY({_BUILTIN_KINDS})
)"""

_SUMS = ", ".join(f"sum({m})" for m in _ADDITIVE)
_SET = ", ".join(f"{m} = t.{m} + EXCLUDED.{m}" for m in _ADDITIVE)
_TS_SET = "first_ts = least(t.first_ts, EXCLUDED.first_ts), last_ts = greatest(t.last_ts, EXCLUDED.last_ts)"

ROLLUP_SQL: Final = f"""
WITH {_CONTRIB},
s AS (SELECT c.*, t.key || '=' || t.value AS segment FROM c, jsonb_each_text(c.tags) t),
u AS (
    INSERT INTO unit_rollups AS t (experiment_id, variant, unit_id, first_ts, last_ts, {_MEASURES})
    SELECT experiment_id, variant, unit_id, min(ts), max(ts), {_SUMS}
    FROM c GROUP BY experiment_id, variant, unit_id ORDER BY experiment_id, variant, unit_id
    ON CONFLICT (experiment_id, variant, unit_id) DO UPDATE SET {_TS_SET}, {_SET}
    RETURNING 1
),
g AS (
    INSERT INTO segment_rollups AS t (experiment_id, segment, variant, unit_id, first_ts, last_ts, {_MEASURES})
    SELECT experiment_id, segment, variant, unit_id, min(ts), max(ts), {_SUMS}
    FROM s GROUP BY experiment_id, segment, variant, unit_id ORDER BY experiment_id, segment, variant, unit_id
    ON CONFLICT (experiment_id, segment, variant, unit_id) DO UPDATE SET {_TS_SET}, {_SET}
    RETURNING 1
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM g)
"""


def bucket_sql(column: str) -> str:
    """The histogram bucket of ``column`` in SQL: ``analytics.stats.quantile.bucket_of``'s rule
    (tests/analytics/ingest/test_histogram_buckets.py checks that both agree)."""
    return f"floor(ln(greatest({column}, {MIN_BUCKETED})) * {BUCKETS_PER_E})::int"


# Request-level latency/TTFT histograms.
HISTOGRAM_SQL: Final = f"""
WITH v AS (
    SELECT experiment_id, variant, tags, 'latency' AS metric,
        {bucket_sql("latency_ms")} AS bucket
    FROM lg_new_i WHERE role = 'primary' AND experiment_id IS NOT NULL AND variant IS NOT NULL
    UNION ALL
    SELECT experiment_id, variant, tags, 'ttft', {bucket_sql("ttft_ms")}
    FROM lg_new_i
    WHERE role = 'primary' AND experiment_id IS NOT NULL AND variant IS NOT NULL AND ttft_ms IS NOT NULL
), g AS (
    -- Count before expanding tags: far fewer rows reach jsonb_each_text.
    SELECT experiment_id, variant, tags, metric, bucket, count(*) AS n FROM v GROUP BY 1, 2, 3, 4, 5
), b AS (
    SELECT experiment_id, metric, '' AS segment, variant, bucket, n FROM g
    UNION ALL
    SELECT experiment_id, metric, t.key || '=' || t.value, variant, bucket, n FROM g, jsonb_each_text(g.tags) t
)
INSERT INTO latency_histograms AS h (experiment_id, metric, segment, variant, bucket, count)
SELECT experiment_id, metric, segment, variant, bucket, sum(n) FROM b
GROUP BY experiment_id, metric, segment, variant, bucket ORDER BY experiment_id, metric, segment, variant, bucket
ON CONFLICT (experiment_id, metric, segment, variant, bucket) DO UPDATE SET count = h.count + EXCLUDED.count
"""

# Custom feedback kinds: {"<kind>": sum, "<kind>:n": count} merged key by key.
_MERGE = """(SELECT coalesce(jsonb_object_agg(k, s), '{}'::jsonb) FROM (
        SELECT k, sum(v::float8) AS s FROM (
            SELECT * FROM jsonb_each_text(t.counters) UNION ALL SELECT * FROM jsonb_each_text(EXCLUDED.counters)
        ) x(k, v) GROUP BY k) y)"""
COUNTERS_SQL: Final = f"""
WITH f AS (
    SELECT experiment_id, variant, unit_id, tags, ts, kind, value FROM lg_new_f
    WHERE NOT (kind = ANY({_BUILTIN_KINDS}))
), a AS (
    SELECT experiment_id, variant, unit_id, kind, sum(value) AS s, count(*) AS n, min(ts) AS t0, max(ts) AS t1
    FROM f GROUP BY experiment_id, variant, unit_id, kind
), ua AS (
    SELECT experiment_id, variant, unit_id, min(t0) AS t0, max(t1) AS t1,
        jsonb_object_agg(kind, s) || jsonb_object_agg(kind || ':n', n) AS counters
    FROM a GROUP BY experiment_id, variant, unit_id
), sa0 AS (
    SELECT f.experiment_id, t.key || '=' || t.value AS segment, f.variant, f.unit_id, f.kind,
        sum(f.value) AS s, count(*) AS n, min(f.ts) AS t0, max(f.ts) AS t1
    FROM f, jsonb_each_text(f.tags) t GROUP BY 1, 2, 3, 4, 5
), sa AS (
    SELECT experiment_id, segment, variant, unit_id, min(t0) AS t0, max(t1) AS t1,
        jsonb_object_agg(kind, s) || jsonb_object_agg(kind || ':n', n) AS counters
    FROM sa0 GROUP BY experiment_id, segment, variant, unit_id
), u AS (
    INSERT INTO unit_rollups AS t (experiment_id, variant, unit_id, first_ts, last_ts, counters)
    SELECT * FROM ua ORDER BY experiment_id, variant, unit_id
    ON CONFLICT (experiment_id, variant, unit_id) DO UPDATE SET counters = {_MERGE}
    RETURNING 1
)
INSERT INTO segment_rollups AS t (experiment_id, segment, variant, unit_id, first_ts, last_ts, counters)
SELECT * FROM sa ORDER BY experiment_id, segment, variant, unit_id
ON CONFLICT (experiment_id, segment, variant, unit_id) DO UPDATE SET counters = {_MERGE}
"""


# Of the batch's attributed feedback of ONCE_KINDS, keep in lg_new_f only the first per
# (response, kind) whose feedback_counted row is inserted now: a row already there (counted
# by an earlier batch) or a concurrent transaction's (the insert waits for it, then
# conflicts) means it was counted already. Keys are inserted in order: no deadlock cycles.
ONCE_SQL: Final = f"""
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
"""


def apply(pg: psycopg.Connection[Any], *, feedback: bool) -> None:
    """Fold ``lg_new_i`` / ``lg_new_f`` into rollups and histograms (caller's transaction)."""
    if feedback:
        pg.execute(ONCE_SQL.encode())
    pg.execute(ROLLUP_SQL.encode())
    samples.fold(pg, samples.FROM_NEW_INTERACTIONS)
    pg.execute(HISTOGRAM_SQL.encode())
    if feedback:
        pg.execute(COUNTERS_SQL.encode())
