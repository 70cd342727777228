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


# mod(), not %: the statement takes parameters (psycopg's placeholders start with %).
_BATCH = f"abs(mod(hashtextextended(unit_id, 1), {BATCHES}))::int"

# The cut (the group's k-th smallest key) once per group: MATERIALIZED, or the planner moves
# the subquery into the join filter and scans k index entries per request of the batch.
# The statement answers the cuts it read (``SampleCuts`` keeps them for the next batches).
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
), ins AS (
    INSERT INTO latency_samples (experiment_id, metric, segment, variant, sample_key, batch, value)
    SELECT experiment_id, metric, segment, variant, sample_key, batch, value
    FROM b WHERE nth <= {SAMPLE_SIZE}
    ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT DO NOTHING
)
SELECT experiment_id, metric, segment, variant, cut FROM c WHERE cut IS NOT NULL
"""

# The cuts known from earlier batches (``SampleCuts.params``), one row per group.
_KNOWN: Final = """k AS (
    SELECT * FROM unnest(%(k_exp)s::int[], %(k_metric)s::text[], %(k_segment)s::text[], %(k_variant)s::text[],
        %(k_cut)s::int8[]) AS k(experiment_id, metric, segment, variant, cut)
)"""


def fold_sql(source: str, segments_of: Callable[[str], str], stage_of: Callable[[str], str]) -> str:
    """The statement adding the rows of ``source`` (the batch's counted interactions, as
    ``analytics.ingest.rollups`` keeps them) to the samples: overall and per rollout stage.
    Parameters: ``SampleCuts.params()``; answers (experiment, metric, segment, variant, cut).

    ``segments_of(row)`` / ``stage_of(row)``: the SQL of a row's segments and of its rollout
    stage segment ('' without one, NULL when unknown): the rollups' one definition.

    A known cut drops a request in the first scan: a group's cut (its k-th smallest key)
    only falls as requests arrive (nothing deletes samples), so a cut read earlier bounds
    the current one and a key at or above it would not be inserted. A request belongs to
    the '' group and, with a rollout stage, to its stage's group, whose cut is at least the
    ''-group's (k-th smallest of a subset): it is looked up by the stage group's cut when
    it has a stage, and kept when that cut is unknown.
    """

    def branch(metric: str, column: str) -> str:
        key = sample_key_sql(f"x.{column}")
        return f"""
    SELECT x.experiment_id, x.variant, x.segments, x.tags_with_sep, '{metric}' AS metric, x.{column} AS value,
        {key} AS sample_key, {_BATCH} AS batch
    FROM {source} x LEFT JOIN k ON k.experiment_id = x.experiment_id AND k.metric = '{metric}'
        AND k.variant COLLATE "C" = x.variant AND k.segment COLLATE "C" = {stage_of("x")}
    WHERE x.{column} IS NOT NULL AND (k.cut IS NULL OR {key} < k.cut)"""

    return f"""WITH {_KNOWN}, v AS ({branch("latency", "latency_ms")}
    UNION ALL{branch("ttft", "ttft_ms")}
), s AS (
    SELECT experiment_id, metric, '' AS segment, variant, sample_key, batch, value FROM v
    UNION ALL
    SELECT experiment_id, metric, segment, variant, sample_key, batch, value
    FROM v, {segments_of("v")} segment
    WHERE (v.tags_with_sep IS NOT NULL OR strpos(v.segments, '{ROLLOUT_STAGE_TAG}=') > 0)
        AND starts_with(segment, '{ROLLOUT_STAGE_TAG}=')
){_INSERT}"""


_Group = tuple[int, str, str, str]  # (experiment_id, metric, segment, variant)


class SampleCuts:
    """The groups' cuts a writer read in earlier transactions, to drop most of a batch's
    requests before the samples statement sorts them (a group past k requests keeps a few
    of each batch). One per writer connection; not thread-safe.

    A cut is learnt only from the first samples statement of a transaction the writer
    opened itself: that statement sees committed samples only, so its cuts bound the
    group's cut for good, whether the transaction then commits or not (a later statement
    of the transaction may see its own samples, which a rollback would take back)."""

    #: Groups kept (experiments × metrics × variants × stages): past it the cache restarts.
    MAX_GROUPS: Final = 50_000

    def __init__(self) -> None:
        self._cuts: dict[_Group, int] = {}
        self._learn = False

    def begin(self, learn: bool) -> None:
        """A transaction starts; ``learn``: the caller opened it (no samples of its own yet)."""
        self._learn = learn

    def params(self) -> dict[str, list[Any]]:
        groups = list(self._cuts.items())
        return {
            "k_exp": [g[0] for g, _ in groups],
            "k_metric": [g[1] for g, _ in groups],
            "k_segment": [g[2] for g, _ in groups],
            "k_variant": [g[3] for g, _ in groups],
            "k_cut": [cut for _, cut in groups],
        }

    def learn(self, rows: list[tuple[Any, ...]]) -> None:
        """The cuts the transaction's samples statement answered (kept if it was the first)."""
        if not self._learn:
            return
        self._learn = False
        if len(self._cuts) + len(rows) > self.MAX_GROUPS:
            self._cuts.clear()
        for exp, metric, segment, variant, cut in rows:
            group = (int(exp), str(metric), str(segment), str(variant))
            known = self._cuts.get(group)
            self._cuts[group] = int(cut) if known is None else min(known, int(cut))

    def __len__(self) -> int:
        return len(self._cuts)


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
