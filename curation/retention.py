"""Content retention: stored prompt and response text is cleared after its TTL, expired
datasets are deleted.

Policies (``content_retention``): ``experiment_id`` 0 is the default TTL (days) for every
experiment without its own row; no row at all means text is kept. ``enforce`` (run by the
analytics service's scheduler or ``liftgate datasets retention --enforce`` from cron):

* sets ``prompt`` and ``response`` to NULL on interactions older than their experiment's TTL
  (every other column stays: metrics and reports are unaffected), in bounded batches;
* deletes datasets whose ``expires_at`` has passed (items, versions and export records),
  audited with actor ``retention``.

Dataset items are copies made on purpose and follow their dataset's ``expires_at``, not the
interactions' TTL (set it with ``liftgate datasets create --ttl-days``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, text

from curation import store
from curation.audit import audit
from curation.spec import CurationError

log = logging.getLogger(__name__)
DEFAULT_SCOPE = 0
BATCH = 10_000
MAX_TTL_DAYS = 36_500


@dataclass(frozen=True, slots=True)
class RetentionRun:
    cleared: int
    datasets_deleted: list[str]


def set_policy(conn: Connection, experiment_id: int, ttl_days: int | None, actor: str) -> None:
    """Set (or with None remove) the TTL of one experiment, or the default (0); audited."""
    if ttl_days is not None and not 1 <= ttl_days <= MAX_TTL_DAYS:
        raise CurationError(f"ttl_days must be between 1 and {MAX_TTL_DAYS}")
    before = conn.execute(text("SELECT ttl_days FROM content_retention WHERE experiment_id = :e"),
                          {"e": experiment_id}).scalar()  # fmt: skip
    if ttl_days is None:
        conn.execute(text("DELETE FROM content_retention WHERE experiment_id = :e"), {"e": experiment_id})
    else:
        conn.execute(text(
            "INSERT INTO content_retention (experiment_id, ttl_days, updated_by) VALUES (:e, :t, :a)"
            " ON CONFLICT (experiment_id) DO UPDATE SET ttl_days = :t, updated_by = :a, updated_at = now()"),
            {"e": experiment_id, "t": ttl_days, "a": actor})  # fmt: skip
    audit(conn, actor, "set_content_retention", str(experiment_id), entity="content_retention",
          before=None if before is None else {"ttl_days": before},
          after=None if ttl_days is None else {"ttl_days": ttl_days})  # fmt: skip


def policies(conn: Connection) -> dict[int, int]:
    return {
        int(r[0]): int(r[1])
        for r in conn.execute(text("SELECT experiment_id, ttl_days FROM content_retention"))
    }


def enforce(engine: Engine, now: datetime, batch: int = BATCH, max_batches: int = 10_000) -> RetentionRun:
    """Clear text past its TTL and delete expired datasets (``now`` passed in: testable)."""
    with engine.connect() as conn:
        rules = policies(conn)
    cleared = 0
    if rules:
        default = rules.get(DEFAULT_SCOPE)
        for _ in range(max_batches):
            with engine.begin() as conn:
                # One bounded batch per transaction: short locks, progress kept if interrupted.
                n = conn.execute(text(
                    "UPDATE interactions SET prompt = NULL, response = NULL WHERE event_id IN ("
                    " SELECT i.event_id FROM interactions i"
                    " LEFT JOIN content_retention r ON r.experiment_id = i.experiment_id AND r.experiment_id <> 0"
                    " WHERE (i.prompt IS NOT NULL OR i.response IS NOT NULL)"
                    " AND COALESCE(r.ttl_days, CAST(:d AS integer)) IS NOT NULL"
                    " AND i.ts < CAST(:now AS timestamptz) - make_interval(days => COALESCE(r.ttl_days, CAST(:d AS integer)))"
                    " LIMIT :b)"), {"d": default, "now": now, "b": batch}).rowcount  # fmt: skip
            cleared += n
            if n < batch:
                break
    deleted: list[str] = []
    with engine.begin() as conn:
        names = conn.execute(
            text("SELECT name FROM datasets WHERE expires_at <= :now ORDER BY name"), {"now": now}
        )
        for (name,) in names.all():
            store.delete(conn, str(name), "retention")
            deleted.append(str(name))
        if cleared or deleted:
            audit(conn, "retention", "enforce_content_retention", None, entity="content_retention",
                  after={"cleared_interactions": cleared, "datasets_deleted": deleted})  # fmt: skip
    if cleared or deleted:
        log.info(
            "retention: cleared text of %s interactions, deleted %s expired datasets", cleared, len(deleted)
        )
    return RetentionRun(cleared, deleted)


async def run_periodically(engine: Engine, interval_s: float, clock: type[datetime] = datetime) -> None:
    """The scheduled job: ``enforce`` every ``interval_s`` until cancelled (errors are logged
    and retried at the next tick; the job never stops the service)."""
    from datetime import UTC

    while True:
        try:
            await asyncio.to_thread(enforce, engine, clock.now(UTC))
        except Exception:  # the next tick retries; the service keeps serving
            log.exception("content retention run failed")
        await asyncio.sleep(interval_s)
