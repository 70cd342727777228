"""Request-level latency samples: the bounded bottom-k sketch behind rank-test guardrails.

Histograms keep counts per bucket; a rank test (Mann–Whitney on per-batch quantiles, see
``analytics.stats.rank``) needs the requests' values and their units' batches. Per
(experiment, metric, segment, variant) — segment '' or a rollout stage — the sample holds the
requests with the smallest ``sample_key``, a hash of the request's identity (unit, time,
value: what both ingest paths see). So the sample is:

- uniform over the group's requests, and the same whatever the batching or the number of
  consumers (the k smallest keys of a union are the k smallest of the parts' k smallest);
- idempotent: a request is folded once (only rows actually inserted reach the fold tables)
  and its key is deterministic (``ON CONFLICT DO NOTHING`` on the key besides);
- bounded: a request is inserted only while its key is below the group's current k-th
  smallest and among its batch's k smallest for the group, so after N requests a group
  holds about k·(1 + ln(N/k)) rows (the expected number of running minima) however large
  the batches, without deletes that concurrent consumers would contend on.
  Readers take the k smallest (:func:`read_samples`).

``batch`` = hash(unit) mod ``BATCHES``: whole units per batch, so per-batch quantiles are
independent across batches even though one unit's requests are correlated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np
import psycopg
from numpy.typing import NDArray

from contracts.events import ROLLOUT_STAGE_TAG

#: k: requests kept per variant and stage (and overall). 4,000 gives 20 batches of ~200,
#: enough for a per-batch p95 and cheap to probe (an index scan of k keys per group and batch).
SAMPLE_SIZE: Final = 4000
BATCHES: Final = 20


# Hashes chained through their seeds: no text is formatted per request (a float8 and a
# timestamp rendered as text and concatenated cost more than the rest of the key).
def sample_key_sql(column: str) -> str:
    """A request's ``sample_key`` in SQL, over a row with ``unit_id``, ``ts`` (timestamptz) and ``column``."""
    return f"hashtextextended(unit_id, hashfloat8extended({column}, timestamptz_hash_extended(ts, 0)))"


_BATCH = f"abs(hashtextextended(unit_id, 1) % {BATCHES})::int"

# The cut (the group's k-th smallest key) once per group: MATERIALIZED, or the planner moves
# the subquery into the join filter and scans k index entries per request of the batch.
_INSERT: Final = f""", c AS MATERIALIZED (
    SELECT g.experiment_id, g.metric, g.segment, g.variant, (
        SELECT l.sample_key FROM latency_samples l
        WHERE l.experiment_id = g.experiment_id AND l.metric = g.metric
            AND l.segment = g.segment COLLATE "default" AND l.variant = g.variant COLLATE "default"
        ORDER BY l.sample_key OFFSET {SAMPLE_SIZE - 1} LIMIT 1) AS cut
    FROM (SELECT DISTINCT experiment_id, metric, segment, variant FROM s) g
), b AS (
    -- Of the batch's keys below the cut, its k smallest per group (the k smallest of a union
    -- are among the parts' k smallest): a batch larger than k writes k rows, not all of them.
    -- dense_rank: equal keys (one request seen twice) are kept or dropped together.
    SELECT s.*, dense_rank() OVER (
        PARTITION BY s.experiment_id, s.metric, s.segment, s.variant ORDER BY s.sample_key) AS nth
    FROM s JOIN c USING (experiment_id, metric, segment, variant)
    WHERE c.cut IS NULL OR s.sample_key < c.cut
)
INSERT INTO latency_samples (experiment_id, metric, segment, variant, sample_key, batch, value)
SELECT experiment_id, metric, segment, variant, sample_key, batch, value
FROM b WHERE nth <= {SAMPLE_SIZE}
ORDER BY 1, 2, 3, 4, 5
ON CONFLICT DO NOTHING
"""


def fold_sql(source: str, segments_of: Callable[[str], str], has_segments: Callable[[str], str]) -> str:
    """The statement adding the rows of ``source`` (the batch's counted interactions, as
    ``analytics.ingest.rollups`` keeps them) to the samples: overall and per rollout stage.

    ``segments_of(row)`` / ``has_segments(row)``: the SQL of a row's segments, and whether
    it has any (the rollups' one definition)."""
    values = f"""
    SELECT experiment_id, variant, segments, tags_with_sep, 'latency' AS metric, latency_ms AS value,
        {sample_key_sql("latency_ms")} AS sample_key, {_BATCH} AS batch
    FROM {source} WHERE latency_ms IS NOT NULL
    UNION ALL
    SELECT experiment_id, variant, segments, tags_with_sep, 'ttft', ttft_ms, {sample_key_sql("ttft_ms")},
        {_BATCH}
    FROM {source} WHERE ttft_ms IS NOT NULL"""
    return f"""WITH v AS ({values}
), s AS (
    SELECT experiment_id, metric, '' AS segment, variant, sample_key, batch, value FROM v
    UNION ALL
    SELECT experiment_id, metric, segment, variant, sample_key, batch, value
    FROM v, {segments_of("v")} segment
    WHERE (v.tags_with_sep IS NOT NULL OR strpos(v.segments, '{ROLLOUT_STAGE_TAG}=') > 0)
        AND starts_with(segment, '{ROLLOUT_STAGE_TAG}=')
){_INSERT}"""


_READ: Final = b"""
SELECT variant, batch, value FROM (
    SELECT variant, batch, value, row_number() OVER (PARTITION BY variant ORDER BY sample_key) AS rn
    FROM latency_samples WHERE experiment_id = %s AND metric = %s AND segment = %s
) x WHERE rn <= %s
"""


def read_samples(
    pg: psycopg.Connection[Any], experiment_id: int, metric: str, segment: str = "", k: int = SAMPLE_SIZE
) -> dict[str, tuple[NDArray[np.float64], NDArray[np.int64]]]:
    """{variant: (values, batches)}: the k requests with the smallest keys per variant."""
    rows = pg.execute(_READ, (experiment_id, metric, segment, k)).fetchall()
    out: dict[str, tuple[list[float], list[int]]] = {}
    for variant, batch, value in rows:
        vals, batches = out.setdefault(variant, ([], []))
        vals.append(float(value))
        batches.append(int(batch))
    return {v: (np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.int64)) for v, (a, b) in out.items()}
