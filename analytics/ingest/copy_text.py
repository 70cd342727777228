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
   session temp table ``lg_fold`` (no WAL, no index), which the caller folds into the
   rollups with ``analytics.ingest.rollups.fold_interactions`` — the same fold as the
   ``ON CONFLICT`` path's: the deltas are aggregated in SQL (Python formats no sums, the
   consumer's GIL being its bottleneck) and upserted, each table in key order.

Only primary interactions in an experiment count; a conversation is counted on its first
primary turn (first in the batch by (ts, event_id) and none stored before), in that turn's
segments. An event's segments are its tags whose key the experiment declares
(``experiments.segment_tags``) and ``rollout_stage``; every tag stays in ``interactions.tags``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import orjson
import psycopg
from psycopg import pq

from analytics.ingest import rollups
from contracts.events import InteractionEvent

try:  # the batch's COPY rows rendered in C (binary format); built by `pip install` (setup.py)
    from analytics.ingest import _copyfmt
except ImportError:  # no C compiler at install time: the same rows as COPY text, in Python
    _copyfmt = None  # type: ignore[assignment]

INTERACTION_COLUMNS: Final = (
    "event_id, ts, request_id, route, experiment_id, variant, unit_id, unit_source, role, pair_id, mode,"
    " endpoint, model, upstream, status, http_status, error_type, latency_ms, ttft_ms, prompt_tokens,"
    " completion_tokens, response_chars, finish_reason, stream, fallback, fallback_from, conversation_id,"
    " tags, prompt, response, category"
)
_COPY_INTERACTIONS: Final = f"COPY interactions ({INTERACTION_COLUMNS}) FROM STDIN".encode()
_COPY_FOLD: Final = f"COPY lg_fold ({rollups.FOLD_COLUMNS}) FROM STDIN".encode()
_COPY_INTERACTIONS_BINARY: Final = (
    f"COPY interactions ({INTERACTION_COLUMNS}) FROM STDIN (FORMAT binary)".encode()
)
_COPY_FOLD_BINARY: Final = f"COPY lg_fold ({rollups.FOLD_COLUMNS}) FROM STDIN (FORMAT binary)".encode()
#: The frame of COPY's binary format around the C renderer's tuples: the signature, the flags
#: word and the header extension's length (both 0) before; the -1 field count after.
BINARY_HEADER: Final = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
BINARY_TRAILER: Final = b"\xff\xff"
# An event's segments arrive in lg_fold as one text joined by rollups.SEGMENT_SEP; a tag
# containing it takes the ON CONFLICT path, which writes such tags as they are.
_SEP: Final = rollups.SEGMENT_SEP


# The batch's (experiment, conversation) pairs not counted before: those this statement
# inserts (rollups' module docstring; ``feedback_counted`` is the same pattern). In key
# order, so concurrent consumers wait on each other's new rows in one order (no deadlock
# cycle); a batch holding a turn of a conversation another batch is inserting waits for it
# and counts it only if that batch rolls back.
_NEW_CONVERSATIONS: Final = (
    b"INSERT INTO conversations_counted (experiment_id, conversation_id)"
    b" SELECT exp, id FROM unnest(%s::int[], %s::text[]) c(exp, id) ORDER BY 1, 2"
    b" ON CONFLICT DO NOTHING RETURNING experiment_id, conversation_id"
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


def _segments(tags: dict[str, str], keys: Set[str]) -> str | None:
    """The event's segments ("key=value" per tag whose key is in ``keys``) joined by ``_SEP``;
    None when there are none."""
    out = _SEP.join([f"{k}={v}" for k, v in tags.items() if k in keys])
    if not out:
        return None
    if out.count(_SEP) != sum(1 for k in tags if k in keys) - 1:
        raise Unsupported("a tag contains the segment separator U+001F")
    return out


# The segments text by (the declared keys, the tags' JSON text, which the row carries
# anyway): events share few tag combinations, and a dict lookup costs a tenth of building
# the text (~0.8 µs).
_SEGMENTS_OF: dict[tuple[frozenset[str], str], str | None] = {}
_TAGS: Final = [c.strip() for c in INTERACTION_COLUMNS.split(",")].index("tags")  # in interaction_row


def _segments_cached(
    tags_json: str, tags: dict[str, str], keys: frozenset[str] = rollups.ALWAYS
) -> str | None:
    found = _SEGMENTS_OF.get((keys, tags_json), _SEP)  # _SEP: not cached (None is a valid value)
    if found == _SEP:
        found = _segments(tags, keys)
        if len(_SEGMENTS_OF) >= 10_000:
            _SEGMENTS_OF.clear()
        _SEGMENTS_OF[(keys, tags_json)] = found
    return found


def text_array(values: Sequence[str]) -> str | list[str]:
    """A text[] literal built in one join (psycopg quotes list items one by one in Python)."""
    if not values:
        return "{}"
    plain = "".join(values)
    if "\\" in plain or '"' in plain:
        return list(values)  # rare: let psycopg escape
    return '{"' + '","'.join(values) + '"}'


class CountedConversations:
    """The (experiment, conversation) pairs a writer knows are in ``conversations_counted``
    (committed), so a batch's later turns of them are not looked up again: a turn of a
    known conversation does not open it. One per writer connection; not thread-safe.

    Rows of ``conversations_counted`` are never deleted (an experiment's ids are not reused),
    so a pair once committed stays counted. A batch's pairs are learnt when the transaction
    that registered them commits, and only when nothing of that transaction was rolled back
    (no savepoint of a refused part, no fallback from the COPY path): otherwise a pair
    registered by an attempt that was taken back could be believed counted."""

    #: Pairs kept (each holds on to its conversation id): past it the memory restarts.
    MAX_PAIRS: Final = 200_000

    def __init__(self) -> None:
        self._known: set[tuple[int, str]] = set()
        self._pending: list[tuple[int, str]] = []
        self._learn = False

    def begin(self, learn: bool) -> None:
        """A transaction starts; ``learn``: the caller opened it (and will report its commit)."""
        self._pending = []
        self._learn = learn

    def __contains__(self, pair: tuple[int, str]) -> bool:
        return pair in self._known

    def registered(self, pairs: Iterable[tuple[int, str]]) -> None:
        """Pairs the transaction's statement registered or found registered."""
        if self._learn:
            self._pending.extend(pairs)

    def spoil(self) -> None:
        """Part of the transaction was rolled back: learn nothing from it."""
        self._learn = False
        self._pending = []

    def committed(self) -> None:
        """The transaction committed: its pairs are counted for good."""
        if self._learn and self._pending:
            if len(self._known) + len(self._pending) > self.MAX_PAIRS:
                self._known.clear()
            self._known.update(self._pending)
        self._pending = []
        self._learn = False

    def __len__(self) -> int:
        return len(self._known)


def _first_turns(
    pg: psycopg.Connection[Any],
    counted: list[InteractionEvent],
    known: CountedConversations | None = None,
) -> set[int]:
    """ids (``id(event)``) of the events that open a conversation not counted before
    (registered in ``conversations_counted`` by the caller's transaction: its savepoint's
    rollback, should the COPY fail, takes the registration back too). ``known``: pairs
    the writer knows are counted (not looked up: none of their turns opens them)."""
    first: dict[tuple[int, str], InteractionEvent] = {}
    for e in counted:
        if e.conversation_id is None:
            continue
        assert e.experiment_id is not None
        k = (e.experiment_id, e.conversation_id)
        cur = first.get(k)
        if cur is None:
            if known is not None and k in known:
                continue
            first[k] = e
        elif (e.ts, e.event_id) < (cur.ts, cur.event_id):
            first[k] = e
    if not first:
        return set()
    exps = "{" + ",".join([str(x) for x, _ in first]) + "}"
    convs = text_array([c for _, c in first])
    inserted = pg.execute(_NEW_CONVERSATIONS, (exps, convs)).fetchall()
    if known is not None:
        # Every pair is in the table now: inserted here, or there already (a concurrent
        # insert waited for and committed); either way counted once this transaction commits.
        known.registered(first)
    return {id(first[(exp, conv)]) for exp, conv in inserted}


def _counted(e: InteractionEvent) -> bool:
    """Whether the event feeds the rollups: a primary call attributed to an experiment arm."""
    return e.role == "primary" and e.experiment_id is not None and e.variant is not None


def python_rows(
    new: list[InteractionEvent],
    counted_ids: set[int],
    firsts: set[int],
    declared: rollups.Declared = rollups.NONE_DECLARED,
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...] | None]]:
    """Per event: its ``interactions`` row and its ``lg_fold`` row (None when not counted),
    whose segments are those of the tag keys ``declared`` for its experiment."""
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
                _segments_cached(row[_TAGS], e.tags, declared.get(e.experiment_id or 0, rollups.ALWAYS)),
                e.conversation_id is None or id(e) in firsts,
                e.category,
            ),
        )


#: Events per part of a batch's COPY rows (see ``insert_interactions``): ~0.6 MB, which
#: the socket's buffers hold while the next part is rendered.
RENDER_PART: Final = 1024


def render_c(
    new: list[InteractionEvent],
    counted_ids: set[int],
    firsts: set[int],
    declared: rollups.Declared = rollups.NONE_DECLARED,
) -> tuple[bytes, bytes]:
    """The ``interactions`` and ``lg_fold`` rows of the batch as COPY binary tuples (no
    signature or trailer), rendered in C: the values the Python loop's COPY text stores (a
    fraction of its CPU, and cheaper for the server to read: bench/ingest/README.md).
    ``Unsupported`` when a value is outside the renderer's common case (the SQL path decides);
    only when the extension is built (``_copyfmt``).
    """
    assert _copyfmt is not None, "the C renderer is not built"
    flags = bytes(
        [
            (2 if e.conversation_id is None or id(e) in firsts else 1) if id(e) in counted_ids else 0
            for e in new
        ]
    )
    try:
        return _copyfmt.render(new, flags, dict(declared), rollups.ALWAYS)
    except ValueError as exc:
        raise Unsupported(f"C renderer: {exc}") from None


def _copy_binary(cur: psycopg.Cursor[Any], statement: bytes, tuples: Iterable[bytes]) -> None:
    """COPY ``statement`` (binary format): the signature, ``tuples`` as they come, the trailer."""
    with cur.copy(statement) as copy:
        copy.write(BINARY_HEADER)
        for t in tuples:
            copy.write(t)
        copy.write(BINARY_TRAILER)


def insert_interactions(
    pg: psycopg.Connection[Any],
    events: Sequence[InteractionEvent],
    *,
    declared: rollups.Declared,
    c_renderer: bool = True,
    conversations: CountedConversations | None = None,
    part: int = RENDER_PART,
) -> Inserted:
    """COPY the batch's interactions, and its counted ones into ``lg_fold`` (caller's transaction).

    ``declared``: the tag keys folded into segments per experiment, as
    ``rollups.declared_segments`` read them in the caller's transaction.

    ``c_renderer``: COPY binary rows rendered by ``analytics.ingest._copyfmt`` when it is
    built (False, or not built: COPY text rendered by the Python loop, which stores the same
    values; tests and benchmarks compare both). ``part``: events rendered and sent at a time.

    Duplicates within the batch are dropped here; one already stored makes the COPY fail
    with ``psycopg.errors.UniqueViolation`` (a redelivery, or a concurrent transaction
    stored it meanwhile), and ``Unsupported`` flags values only the SQL path handles (for
    the C renderer: any value outside its common case, rare once ``decode`` has checked the
    event). The caller must then roll back and use the ``ON CONFLICT`` path.

    The counted rows (primary, in an experiment) are also COPYed, narrowed to what the
    rollups read, into the session temp table ``lg_fold`` for the caller's
    ``rollups.fold_interactions``: no read-back of the rows just stored (an index probe per
    event, or a scan of ``interactions`` if the planner prefers a hash join).
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
    firsts = _first_turns(pg, counted, conversations)
    with pg.cursor() as cur:
        if c_renderer and _copyfmt is not None:
            folds: list[bytes] = []

            def rendered() -> Iterator[bytes]:
                # A part at a time: the server parses and stores one part while the next is
                # rendered, where a whole batch rendered first kept it idle.
                for start in range(0, len(new), part):
                    rows, fold = render_c(new[start : start + part], counted_ids, firsts, declared)
                    folds.append(fold)
                    yield rows

            _copy_binary(cur, _COPY_INTERACTIONS_BINARY, rendered())
            if any(folds):  # lg_fold: created per session by ingest._prepare
                _copy_binary(cur, _COPY_FOLD_BINARY, folds)
        else:
            fold_rows: list[tuple[Any, ...]] = []
            with cur.copy(_COPY_INTERACTIONS) as copy:
                for row, fold_row in python_rows(new, counted_ids, firsts, declared):
                    copy.write_row(row)
                    if fold_row is not None:
                        fold_rows.append(fold_row)
            if fold_rows:
                with cur.copy(_COPY_FOLD) as copy:
                    for fold_row in fold_rows:
                        copy.write_row(fold_row)
    return Inserted(len(new), [e.request_id for e in counted])
