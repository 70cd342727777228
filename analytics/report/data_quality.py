"""Data quality of stored feedback: what never joined an interaction.

Ingest credits feedback to a variant only by joining the stored interaction of its request
id (``analytics.ingest.write``); feedback whose interaction is not stored yet waits,
unattributed, and is attributed by a later batch or the consumer's sweep. Feedback that
still has no interaction ``window_s`` after it was stored is **unjoined**: a request id the
gateway never served (a typo, another environment, an id the client made up) or an
interaction that was lost. It is kept as sent and never counted for any variant; this
module counts it, by kind, so it is visible instead of silently ignored.

The counts cover feedback stored in the last ``days`` (the partial index on unattributed
feedback's ``ingested_at`` finds it; feedback on traffic outside experiments also stays
unattributed for ever and is reported separately as ``outside_experiments``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import Connection, text

#: How long feedback may wait for its interaction before it counts as unjoined.
DEFAULT_WINDOW_S: Final = 900.0
DEFAULT_DAYS: Final = 7
MAX_KINDS: Final = 50
MAX_EXAMPLES: Final = 20

_COUNTS: Final = text(
    """
    WITH f AS (
        SELECT f.kind, f.ingested_at < now() - make_interval(secs => :window) AS settled,
               EXISTS (SELECT 1 FROM interactions i WHERE i.request_id = f.request_id) AS joined
        FROM feedback f
        WHERE f.experiment_id IS NULL AND f.ingested_at >= now() - make_interval(days => :days)
    )
    SELECT kind,
           count(*) FILTER (WHERE NOT joined AND settled) AS unjoined,
           count(*) FILTER (WHERE NOT joined AND NOT settled) AS pending,
           count(*) FILTER (WHERE joined) AS outside_experiments
    FROM f GROUP BY kind
    ORDER BY unjoined DESC, pending DESC, kind
    """
)
_EXAMPLES: Final = text(
    """
    SELECT f.request_id, f.kind, f.ingested_at FROM feedback f
    WHERE f.experiment_id IS NULL AND f.ingested_at >= now() - make_interval(days => :days)
      AND f.ingested_at < now() - make_interval(secs => :window)
      AND NOT EXISTS (SELECT 1 FROM interactions i WHERE i.request_id = f.request_id)
    ORDER BY f.ingested_at DESC LIMIT :n
    """
)


@dataclass(frozen=True, slots=True)
class KindCounts:
    kind: str
    unjoined: int
    pending: int
    outside_experiments: int


@dataclass(frozen=True, slots=True)
class Unjoined:
    request_id: str
    kind: str
    ingested_at: datetime


@dataclass(frozen=True, slots=True)
class FeedbackQuality:
    window_s: float
    days: int
    unjoined: int  # no interaction window_s after it was stored: never counted
    pending: int  # stored less than window_s ago, no interaction yet
    outside_experiments: int  # joined an interaction served outside any experiment
    by_kind: tuple[KindCounts, ...]  # the MAX_KINDS kinds with the most unjoined feedback
    examples: tuple[Unjoined, ...]  # the most recent unjoined feedback (MAX_EXAMPLES)


def feedback_quality(
    conn: Connection, window_s: float = DEFAULT_WINDOW_S, days: int = DEFAULT_DAYS
) -> FeedbackQuality:
    params = {"window": window_s, "days": days}
    rows = [KindCounts(str(k), int(u), int(p), int(o)) for k, u, p, o in conn.execute(_COUNTS, params)]
    examples = tuple(
        Unjoined(str(r), str(k), at) for r, k, at in conn.execute(_EXAMPLES, {**params, "n": MAX_EXAMPLES})
    )
    return FeedbackQuality(
        window_s=window_s,
        days=days,
        unjoined=sum(r.unjoined for r in rows),
        pending=sum(r.pending for r in rows),
        outside_experiments=sum(r.outside_experiments for r in rows),
        by_kind=tuple(rows[:MAX_KINDS]),
        examples=examples,
    )
