"""The COPY fast path for a batch of interactions (the common case: no redelivery).

``INSERT … SELECT … ON CONFLICT DO NOTHING`` from a staging table cannot use COPY's
multi-insert path and writes every row twice. Instead:

1. duplicates within the batch are dropped in Python;
2. the rows are COPYed straight into ``interactions``. An event already stored (a redelivery after a crash or a rebalance, or a concurrent consumer's
   uncommitted insert) raises ``UniqueViolation`` from the primary key: the caller rolls
   back to its savepoint and redoes the batch on the ``ON CONFLICT`` path, so every
   event is still stored and counted exactly once. Redeliveries are rare, so no
   existence probe is paid on every batch (it costs more than the COPY it guards);
3. the counted rows, narrowed to the columns the rollups read, are COPYed into the
   session temp table ``lg_fold`` (no WAL, no index); one statement aggregates the rollup
   and histogram deltas from it in SQL (Python formats no sums, the consumer's GIL being
   its bottleneck) and upserts them, each table in key order (so concurrent consumers
   lock rows in the same order).

The result is the same as ``analytics.ingest.rollups`` computes from ``lg_new_i``: only primary
interactions in an experiment count; a conversation is counted on its first primary turn
(first in the batch by (ts, event_id) and none stored before), in that turn's segments.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson
import psycopg
from psycopg import pq

from analytics.ingest import samples
from analytics.ingest.rollups import bucket_sql
from contracts.events import InteractionEvent
from contracts.tables import INTERACTION_MEASURES

try:  # the batch's COPY text rendered in C; built by `pip install` (setup.py)
    from analytics.ingest import _copyfmt
except ImportError:  # no C compiler at install time: the same rows rendered in Python
    _copyfmt = None  # type: ignore[assignment]

# COLLATE "C": the batch's keys are sorted and grouped byte-wise (the database's default
# collation may be a libc locale, whose strcoll comparisons cost more than the sort).
TEMP_TABLES: Final = """
CREATE TEMP TABLE IF NOT EXISTS lg_fold (
    experiment_id int, variant text COLLATE "C", unit_id text COLLATE "C", ts timestamptz, status text,
    fallback bool, latency_ms float8, ttft_ms float8, prompt_tokens int, completion_tokens int,
    response_chars int, segments text COLLATE "C", conv bool
) ON COMMIT DELETE ROWS;
"""
_COPY_FOLD: Final = (
    b"COPY lg_fold (experiment_id, variant, unit_id, ts, status, fallback, latency_ms, ttft_ms, prompt_tokens,"
    b" completion_tokens, response_chars, segments, conv) FROM STDIN"
)

INTERACTION_COLUMNS: Final = (
    "event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source, role, pair_id, mode,"
    " endpoint, model, upstream, status, http_status, error_type, latency_ms, ttft_ms, prompt_tokens,"
    " completion_tokens, response_chars, finish_reason, stream, fallback, fallback_from, conversation_id,"
    " tags, prompt, response, category"
)
_COPY_INTERACTIONS: Final = f"COPY interactions ({INTERACTION_COLUMNS}) FROM STDIN".encode()
_M: Final = ", ".join(INTERACTION_MEASURES)
_SET: Final = ", ".join(f"{m} = t.{m} + EXCLUDED.{m}" for m in INTERACTION_MEASURES)
_TS_SET: Final = (
    "first_ts = least(t.first_ts, EXCLUDED.first_ts), last_ts = greatest(t.last_ts, EXCLUDED.last_ts)"
)
# The deltas of the batch's counted rows, computed by Postgres from the rows just COPYed
# into ``lg_fold``: no per-event number is formatted in Python, where the consumer's GIL is
# the bottleneck. Same formulas as ``analytics.ingest.rollups``.
# The segments of an event ("key=value" per tag) arrive as one text joined by _SEP (cheaper
# for Postgres than expanding jsonb per row); a tag containing _SEP takes the SQL path.
# Unit and segment deltas are aggregated separately, each straight from ``lg_fold``: one
# grouping of (unit rows + segment rows) sorted twice the rows, and the planner, expecting
# 1,000 rows per string_to_table call, sorted instead of hashing (EXPLAIN ANALYZE of a
# 20,000-event batch: 374 → 300 ms). unnest(string_to_array()) is estimated at 10 per row.
_SEP: Final = "\x1f"
# Each interaction measure's delta over a group of lg_fold rows (a measure added to
# INTERACTION_MEASURES without one here fails at import, not silently out of order).
_DELTA_OF: Final = {
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
_DELTAS: Final = "min(ts), max(ts), " + ", ".join(_DELTA_OF[m] for m in INTERACTION_MEASURES)
FOLD: Final = f"""
WITH u AS (
    -- ORDER BY the key: concurrent consumers lock rows in the same order (no deadlock
    -- cycles), and index pages are visited in order (unit_id first was 50% slower).
    INSERT INTO unit_rollups AS t (experiment_id, variant, unit_id, first_ts, last_ts, {_M})
    SELECT experiment_id, variant, unit_id, {_DELTAS}
    FROM lg_fold GROUP BY experiment_id, variant, unit_id
    ORDER BY experiment_id, variant, unit_id
    ON CONFLICT (experiment_id, variant, unit_id) DO UPDATE SET {_TS_SET}, {_SET}
)
INSERT INTO segment_rollups AS t (experiment_id, segment, variant, unit_id, first_ts, last_ts, {_M})
SELECT experiment_id, segment, variant, unit_id, {_DELTAS}
FROM lg_fold, unnest(string_to_array(segments, E'\\x1f')) segment
WHERE segments IS NOT NULL
GROUP BY experiment_id, segment, variant, unit_id
ORDER BY experiment_id, segment, variant, unit_id
ON CONFLICT (experiment_id, segment, variant, unit_id) DO UPDATE SET {_TS_SET}, {_SET}
""".encode()
# Last statement of the batch: every consumer updates the same histogram rows, so their
# locks are taken as late as possible (held until the commit that follows).
HISTOGRAMS: Final = f"""
WITH v AS (
    SELECT experiment_id, variant, segments, 'latency' AS metric,
        {bucket_sql("latency_ms")} AS bucket
    FROM lg_fold
    UNION ALL
    SELECT experiment_id, variant, segments, 'ttft', {bucket_sql("ttft_ms")}
    FROM lg_fold WHERE ttft_ms IS NOT NULL
), g AS (
    -- Count before expanding segments: far fewer rows to split.
    SELECT experiment_id, variant, segments, metric, bucket, count(*) AS n FROM v GROUP BY 1, 2, 3, 4, 5
), dh AS (
    SELECT experiment_id, metric, segment, variant, bucket, sum(n) AS n FROM (
        SELECT experiment_id, metric, '' AS segment, variant, bucket, n FROM g
        UNION ALL
        SELECT experiment_id, metric, t.segment, variant, bucket, n
        FROM g, string_to_table(g.segments, E'\\x1f') t(segment) WHERE g.segments IS NOT NULL
    ) x GROUP BY 1, 2, 3, 4, 5
)
INSERT INTO latency_histograms AS h (experiment_id, metric, segment, variant, bucket, count)
SELECT experiment_id, metric, segment, variant, bucket, n FROM dh
ORDER BY experiment_id, metric, segment, variant, bucket
ON CONFLICT (experiment_id, metric, segment, variant, bucket) DO UPDATE SET count = h.count + EXCLUDED.count
""".encode()

# Which (experiment, conversation) pairs of the batch have a primary turn stored already:
# one index probe per pair that stops at the first such row (LIMIT 1 inside LATERAL: not
# flattened into a join, where the planner may hash all of ``interactions``). Reading every
# stored turn instead (DISTINCT) made a conversation's n-th turn cost O(n) rows.
# The probe reads the conversation's index only (see analytics.ingest.write on OFFSET 0): with
# the experiment condition in the scan, the planner may AND in a bitmap of every row of the
# experiment when its statistics are missing (a new database) or stale (a new experiment).
_STORED_CONVERSATIONS: Final = (
    b"SELECT c.exp, c.id FROM unnest(%s::int[], %s::text[]) c(exp, id) CROSS JOIN LATERAL ("
    b" SELECT 1 FROM (SELECT i.experiment_id, i.role FROM interactions i WHERE i.conversation_id = c.id OFFSET 0) t"
    b" WHERE t.experiment_id = c.exp AND t.role = 'primary' LIMIT 1) x"
)


@contextmanager
def index_probes(pg: psycopg.Connection[Any]) -> Iterator[None]:
    """Plan the statements run inside (in the caller's transaction) without sequential scans.

    Every probe of ``interactions`` or ``feedback`` looks rows up by one key per input row;
    only an index scan is right, whatever the planner believes about the table's size. After
    an ANALYZE of an empty table (reltuples = 0, e.g. autovacuum running right after a
    TRUNCATE) the planner costs a sequential scan of a table with no pages at zero and picks
    it; if other consumers' COPYs fill the table meanwhile (their rows, even uncommitted, are
    read), each of the batch's probes reads all of them: the ingest bench's 600,000-event
    runs stalled ~25 s that way in one conversation probe. Tables without an index (the temp
    tables) are still read sequentially: there is no other plan.
    """
    pg.execute(b"SET LOCAL enable_seqscan = off")
    try:
        yield
    finally:
        if pg.info.transaction_status == pq.TransactionStatus.INTRANS:
            pg.execute(b"SET LOCAL enable_seqscan TO DEFAULT")


@dataclass(frozen=True, slots=True)
class Inserted:
    rows: int  # interaction rows inserted
    attributable: list[str]  # request ids of new primary interactions in an experiment


class Unsupported(Exception):
    """The batch holds a value this path cannot render (e.g. a ts out of datetime's range)."""


_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)  # PostgreSQL's epoch
_PG_EPOCH_S: Final = int(_PG_EPOCH.timestamp())  # 946,684,800
_SECOND_TEXT: dict[int, str] = {}  # whole seconds since _PG_EPOCH -> "YYYY-MM-DD HH:MM:SS"


def ts_text(t: float) -> str:
    """Unix time ``t`` as timestamptz text, the instant PostgreSQL's ``to_timestamp(t)`` gives.

    Cheaper than a datetime (building one costs ~0.4 µs and psycopg's tz-aware dumper
    ~1 µs, twice per event); a batch's events share few distinct seconds, so the
    "YYYY-MM-DD HH:MM:SS" part is cached per second. Rounding as ``to_timestamp``:
    rint((t - 946684800) · 10⁶) microseconds since 2000-01-01, the same double arithmetic
    (Python's round() of a float is round-half-even, like rint), so both ingest paths store
    the same instant (the SQL path stores ``to_timestamp(ts)``). Outside datetime's years
    1–9999 (or NaN/inf) raises ``Unsupported``: the SQL path then decides.
    """
    try:
        sec, micro = divmod(round((t - _PG_EPOCH_S) * 1e6), 1_000_000)
        head = _SECOND_TEXT.get(sec)
        if head is None:
            d = _PG_EPOCH + timedelta(seconds=sec)
            head = f"{d.year:04d}-{d.month:02d}-{d.day:02d} {d.hour:02d}:{d.minute:02d}:{d.second:02d}"
            if len(_SECOND_TEXT) >= 100_000:
                _SECOND_TEXT.clear()
            _SECOND_TEXT[sec] = head
    except (ValueError, OverflowError) as exc:
        raise Unsupported(f"ts {t!r}: {exc}") from None
    return f"{head}.{micro:06d}+00"


def interaction_row(e: InteractionEvent, ts: Any) -> tuple[Any, ...]:
    """The columns of ``interactions`` in table order (``ts`` as the caller's COPY wants it)."""
    return (
        e.event_id,
        ts,
        e.request_id,
        e.route,
        e.experiment_id,
        e.variant,
        e.unit_id,
        e.unit_source,
        e.role,
        e.pair_id,
        e.mode,
        e.endpoint,
        e.model,
        e.upstream,
        e.status,
        e.http_status,
        e.error_type,
        e.latency_ms,
        e.ttft_ms,
        e.prompt_tokens,
        e.completion_tokens,
        e.response_chars,
        e.finish_reason,
        e.stream,
        e.fallback,
        e.fallback_from,
        e.conversation_id,
        orjson.dumps(e.tags).decode(),
        e.prompt,
        e.response,
        e.category,
    )


def _segments(tags: dict[str, str]) -> str | None:
    """The event's segments ("key=value" per tag) joined by ``_SEP``; None without tags."""
    if not tags:
        return None
    out = _SEP.join([f"{k}={v}" for k, v in tags.items()])
    if out.count(_SEP) != len(tags) - 1:
        raise Unsupported("a tag contains the segment separator U+001F")
    return out


# The segments text by the tags' JSON text (which the row carries anyway): events share few
# tag combinations, and a dict lookup costs a tenth of building the text (~0.8 µs).
_SEGMENTS_OF: dict[str, str | None] = {}
_TAGS: Final = [c.strip() for c in INTERACTION_COLUMNS.split(",")].index("tags")  # in interaction_row


def _segments_cached(tags_json: str, tags: dict[str, str]) -> str | None:
    found = _SEGMENTS_OF.get(tags_json, _SEP)  # _SEP: not cached (None is a valid value)
    if found == _SEP:
        found = _segments(tags)
        if len(_SEGMENTS_OF) >= 10_000:
            _SEGMENTS_OF.clear()
        _SEGMENTS_OF[tags_json] = found
    return found


def text_array(values: Sequence[str]) -> str | list[str]:
    """A text[] literal built in one join (psycopg quotes list items one by one in Python)."""
    if not values:
        return "{}"
    plain = "".join(values)
    if "\\" in plain or '"' in plain:
        return list(values)  # rare: let psycopg escape
    return '{"' + '","'.join(values) + '"}'


def _first_turns(pg: psycopg.Connection[Any], counted: list[InteractionEvent]) -> set[int]:
    """ids (``id(event)``) of the events that open a conversation not stored before."""
    first: dict[tuple[int, str], InteractionEvent] = {}
    for e in counted:
        if e.conversation_id is None:
            continue
        assert e.experiment_id is not None
        k = (e.experiment_id, e.conversation_id)
        cur = first.get(k)
        if cur is None or (e.ts, e.event_id) < (cur.ts, cur.event_id):
            first[k] = e
    if not first:
        return set()
    exps = "{" + ",".join([str(x) for x, _ in first]) + "}"
    convs = text_array([c for _, c in first])
    with index_probes(pg):
        stored = pg.execute(_STORED_CONVERSATIONS, (exps, convs)).fetchall()
    for exp, conv in stored:
        first.pop((exp, conv), None)
    return {id(e) for e in first.values()}


def _counted(e: InteractionEvent) -> bool:
    """Whether the event feeds the rollups: a primary call attributed to an experiment arm."""
    return e.role == "primary" and e.experiment_id is not None and e.variant is not None


def python_rows(
    new: list[InteractionEvent], counted_ids: set[int], firsts: set[int]
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...] | None]]:
    """Per event: its ``interactions`` row and its ``lg_fold`` row (None when not counted)."""
    for e in new:
        ts = ts_text(e.ts)
        row = interaction_row(e, ts)
        if id(e) not in counted_ids:
            yield row, None
            continue
        yield (
            row,
            (
                e.experiment_id,
                e.variant,
                e.unit_id,
                ts,
                e.status,
                e.fallback,
                e.latency_ms,
                e.ttft_ms,
                e.prompt_tokens,
                e.completion_tokens,
                e.response_chars,
                _segments_cached(row[_TAGS], e.tags),
                e.conversation_id is None or id(e) in firsts,
            ),
        )


def render_c(
    new: list[InteractionEvent], counted_ids: set[int], firsts: set[int]
) -> tuple[bytes, bytes] | None:
    """The COPY text of ``interactions`` and ``lg_fold`` rows of the batch, rendered in C.

    The same bytes as the Python loop of ``insert_interactions`` writes through psycopg
    (about a tenth of its CPU, bench/ingest/README.md); None when the extension is not built,
    or when a value is outside its common case (the Python loop then decides).
    """
    if _copyfmt is None:
        return None
    flags = bytes(
        [
            (2 if e.conversation_id is None or id(e) in firsts else 1) if id(e) in counted_ids else 0
            for e in new
        ]
    )
    try:
        return _copyfmt.render(new, flags)
    except ValueError:
        return None


def insert_interactions(
    pg: psycopg.Connection[Any], events: Sequence[InteractionEvent], *, c_renderer: bool = True
) -> Inserted:
    """COPY the batch's interactions and fold them into the rollups (caller's transaction).

    ``c_renderer``: render the COPY text with ``analytics.ingest._copyfmt`` when it is built
    (False: the Python loop, which writes the same bytes; tests and benchmarks compare both).

    Duplicates within the batch are dropped here; one already stored makes the COPY fail
    with ``psycopg.errors.UniqueViolation`` (a redelivery, or a concurrent transaction
    stored it meanwhile), and ``Unsupported`` flags values only the SQL path handles. The
    caller must then roll back and use the ``ON CONFLICT`` path.

    The counted rows (primary, in an experiment) are also COPYed, narrowed to what the
    rollups read, into the session temp table ``lg_fold``, from which one statement
    computes the rollup and histogram deltas and upserts them: no read-back of the rows
    just stored (an index probe per event, or a scan of ``interactions`` if the planner
    prefers a hash join).
    """
    seen: set[str] = set()
    new: list[InteractionEvent] = []
    for e in events:
        if e.event_id not in seen:
            seen.add(e.event_id)
            new.append(e)
    if not new:
        return Inserted(0, [])
    counted = [e for e in new if _counted(e)]
    counted_ids = {id(e) for e in counted}
    firsts = _first_turns(pg, counted)
    rendered = render_c(new, counted_ids, firsts) if c_renderer else None
    fold_rows: list[tuple[Any, ...]] = []
    fold_text = b""
    with pg.cursor() as cur:
        with cur.copy(_COPY_INTERACTIONS) as copy:
            if rendered is not None:
                copy.write(rendered[0])
                fold_text = rendered[1]
            else:
                for row, fold_row in python_rows(new, counted_ids, firsts):
                    copy.write_row(row)
                    if fold_row is not None:
                        fold_rows.append(fold_row)
        if fold_text or fold_rows:  # lg_fold: created per session by ingest._prepare
            with cur.copy(_COPY_FOLD) as copy:
                copy.write(fold_text)
                for row in fold_rows:
                    copy.write_row(row)
            cur.execute(FOLD)
            samples.fold(pg, samples.FROM_FOLD)
            cur.execute(HISTOGRAMS)
    return Inserted(len(new), [e.request_id for e in counted])
