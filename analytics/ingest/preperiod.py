"""CUPED covariates: each unit's own history on the experiment's route before it started.

``compute_preperiod`` aggregates the raw primary interactions on the experiment's route
in ``[started_at - lookback, started_at)`` — and the feedback on them — per unit into
``preperiod_rollups``, with the same measures as ``unit_rollups``, so any metric's
expression evaluates on it unchanged (``variant_stats(..., with_covariate=True)``).
Because the window ends when the experiment starts, the covariate cannot be affected by
the treatment, which is what makes CUPED unbiased.

It runs once per experiment: ``ensure_preperiod`` computes it when no row exists yet
and remembers (per process) experiments that have no history at all, so calling it from
the periodic snapshotter costs one indexed lookup.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Final

from analytics.db import AnyConn, execute, fetch_all
from contracts.events import FEEDBACK_KINDS

_BUILTIN_KINDS: Final = "ARRAY[" + ", ".join(f"'{k}'" for k in sorted(FEEDBACK_KINDS)) + "]"

_COMPUTE: Final = f"""
WITH e AS (
    SELECT route, started_at FROM experiments WHERE id = %(e)s AND started_at IS NOT NULL
), i AS (
    SELECT x.* FROM interactions x, e
    WHERE x.route = e.route AND x.role = 'primary' AND x.ts < e.started_at
        AND x.ts >= e.started_at - %(lookback)s::interval
), ai AS (
    SELECT unit_id, count(*)::float8 AS requests, count(*) FILTER (WHERE status = 'error')::float8 AS errors,
        count(*) FILTER (WHERE fallback)::float8 AS fallbacks, sum(latency_ms) AS latency_sum,
        count(ttft_ms)::float8 AS ttft_n, coalesce(sum(ttft_ms), 0) AS ttft_sum,
        coalesce(sum(prompt_tokens), 0)::float8 AS prompt_tokens,
        coalesce(sum(completion_tokens), 0)::float8 AS completion_tokens,
        sum(response_chars)::float8 AS response_chars,
        (count(DISTINCT conversation_id) + count(*) FILTER (WHERE conversation_id IS NULL))::float8
            AS conversations,
        count(*)::float8 AS turns
    FROM i GROUP BY unit_id
), f AS (
    SELECT i.unit_id, fb.kind, fb.value FROM feedback fb JOIN i ON fb.request_id = i.request_id
), af AS (
    SELECT unit_id,
        count(*) FILTER (WHERE kind = 'thumbs_up')::float8 AS thumbs_up,
        count(*) FILTER (WHERE kind = 'thumbs_down')::float8 AS thumbs_down,
        count(*) FILTER (WHERE kind = 'rating')::float8 AS ratings_n,
        coalesce(sum(value) FILTER (WHERE kind = 'rating'), 0) AS ratings_sum,
        count(*) FILTER (WHERE kind = 'regenerate')::float8 AS regenerates,
        count(*) FILTER (WHERE kind = 'copy')::float8 AS copies,
        count(*) FILTER (WHERE kind = 'edit')::float8 AS edits,
        count(*) FILTER (WHERE kind = 'continued')::float8 AS continued,
        count(*) FILTER (WHERE kind = 'task_success')::float8 AS task_success_n,
        coalesce(sum(value) FILTER (WHERE kind = 'task_success'), 0) AS task_success_sum
    FROM f GROUP BY unit_id
), ac0 AS (
    SELECT unit_id, kind, sum(value) AS s, count(*) AS n FROM f
    WHERE NOT (kind = ANY({_BUILTIN_KINDS})) GROUP BY unit_id, kind
), ac AS (
    SELECT unit_id, jsonb_object_agg(kind, s) || jsonb_object_agg(kind || ':n', n) AS counters
    FROM ac0 GROUP BY unit_id
)
INSERT INTO preperiod_rollups (experiment_id, unit_id, requests, errors, fallbacks, latency_sum, ttft_n,
    ttft_sum, prompt_tokens, completion_tokens, response_chars, conversations, turns, thumbs_up, thumbs_down,
    ratings_n, ratings_sum, regenerates, copies, edits, continued, task_success_n, task_success_sum, counters)
SELECT %(e)s, ai.unit_id, requests, errors, fallbacks, latency_sum, ttft_n, ttft_sum, prompt_tokens,
    completion_tokens, response_chars, conversations, turns, coalesce(thumbs_up, 0), coalesce(thumbs_down, 0),
    coalesce(ratings_n, 0), coalesce(ratings_sum, 0), coalesce(regenerates, 0), coalesce(copies, 0),
    coalesce(edits, 0), coalesce(continued, 0), coalesce(task_success_n, 0), coalesce(task_success_sum, 0),
    coalesce(ac.counters, '{{}}'::jsonb)
FROM ai LEFT JOIN af USING (unit_id) LEFT JOIN ac USING (unit_id)
ON CONFLICT (experiment_id, unit_id) DO NOTHING
"""

DEFAULT_LOOKBACK = timedelta(days=28)

_no_history: set[int] = set()
_lock = threading.Lock()


def compute_preperiod(conn: AnyConn, experiment_id: int, lookback: timedelta = DEFAULT_LOOKBACK) -> int:
    """(Re)compute the experiment's pre-period rollups in the caller's transaction; return units."""
    execute(conn, "DELETE FROM preperiod_rollups WHERE experiment_id = %s", (experiment_id,))
    execute(conn, _COMPUTE, {"e": experiment_id, "lookback": lookback})
    rows = fetch_all(
        conn, "SELECT count(*) FROM preperiod_rollups WHERE experiment_id = %s", (experiment_id,)
    )
    return int(rows[0][0])


def ensure_preperiod(conn: AnyConn, experiment_id: int, lookback: timedelta = DEFAULT_LOOKBACK) -> bool:
    """Compute once if missing; True when the experiment has pre-period covariates."""
    with _lock:
        if experiment_id in _no_history:
            return False
    row = fetch_all(
        conn,
        "SELECT e.started_at IS NOT NULL, EXISTS (SELECT 1 FROM preperiod_rollups p WHERE p.experiment_id = e.id)"
        " FROM experiments e WHERE e.id = %s",
        (experiment_id,),
    )
    if not row or not row[0][0]:
        return False  # unknown or not started yet: nothing to compute (and nothing to remember)
    if row[0][1]:
        return True
    n = compute_preperiod(conn, experiment_id, lookback)
    if n == 0:
        with _lock:
            _no_history.add(experiment_id)
    return n > 0
