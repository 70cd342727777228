"""The embedded default event sink: batched in-process writes through analytics' ingest.

``emit`` only appends to a deque (a few hundred ns, no lock, no I/O). A background thread
wakes every ``interval_s`` (or as soon as ``batch_size`` events are waiting), takes up to
``batch_size`` events and writes them with ``analytics.ingest.write.ingest_raw`` — the same
idempotent function the Kafka consumer uses — in one transaction.

Memory is bounded: beyond ``max_queue`` waiting events new ones are dropped and counted
(the Direct sink has no disk spool; production deployments use Kafka). On a database
error the batch is kept and retried with exponential backoff (up to ``max_backoff_s``);
``emit`` never waits for it. ``close()`` flushes what it can within ``close_timeout_s``.

It lives in the composition root because the gateway never imports analytics.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Any

import psycopg

from analytics.ingest.write import encode_for_ingest, ingest_raw
from contracts.events import Event

log = logging.getLogger(__name__)


class DirectSink:
    def __init__(
        self,
        database_url: str,
        *,
        batch_size: int = 2000,
        interval_s: float = 0.1,
        max_queue: int = 200_000,
        max_backoff_s: float = 5.0,
        close_timeout_s: float = 10.0,
    ) -> None:
        self._url = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        self._batch_size = batch_size
        self._interval = interval_s
        self._max_queue = max_queue
        self._max_backoff = max_backoff_s
        self._close_timeout = close_timeout_s
        self._queue: deque[Event] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pg: psycopg.Connection[Any] | None = None
        self._ok = True
        self._delivered = 0
        self._dropped = 0
        self._retries = 0
        self._duplicates = 0

    # -- request path ------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        q = self._queue
        if len(q) >= self._max_queue:
            self._dropped += 1
            return
        q.append(event)
        if len(q) == self._batch_size:
            self._wake.set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.start_thread()

    def start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="direct-sink", daemon=True)
            self._thread.start()

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self._close_timeout + 5)
        if self._queue:
            log.warning(
                "direct sink closed with %s undelivered events (database unreachable)", len(self._queue)
            )

    def healthy(self) -> bool:
        return self._ok and self._thread is not None and self._thread.is_alive()

    def stats(self) -> dict[str, int]:
        return {
            "queued": len(self._queue),
            "delivered": self._delivered,
            "dropped": self._dropped,
            "retries": self._retries,
            "duplicates": self._duplicates,
        }

    # -- background thread -------------------------------------------------------------------

    def _take(self) -> list[Event]:
        batch: list[Event] = []
        q = self._queue
        while q and len(batch) < self._batch_size:
            batch.append(q.popleft())
        return batch

    def _write(self, batch: list[Event]) -> bool:
        enc = encode_for_ingest(batch)
        try:
            if self._pg is None or self._pg.closed or self._pg.broken:
                self._pg = psycopg.connect(self._url, connect_timeout=5)
            res = ingest_raw(self._pg, enc.interactions, enc.feedback, enc.dead, enc.judgements)
        except psycopg.Error as exc:
            self._ok = False
            self._retries += 1
            log.warning("direct sink write failed (%s: %s)", type(exc).__name__, exc)
            if self._pg is not None:
                self._pg.close()
                self._pg = None
            return False
        self._ok = True
        self._delivered += len(batch)
        self._duplicates += res.duplicates
        return True

    def _run(self) -> None:
        backoff = 0.1
        pending: list[Event] = []
        close_deadline: float | None = None
        try:
            while True:
                if not pending:
                    pending = self._take()
                if pending:
                    if self._write(pending):
                        pending = []
                        backoff = 0.1
                        if len(self._queue) >= self._batch_size:
                            continue  # a full batch is waiting: write it now
                    else:
                        self._stopping.wait(backoff)
                        backoff = min(backoff * 2, self._max_backoff)
                if self._stopping.is_set():
                    close_deadline = close_deadline or time.monotonic() + self._close_timeout
                    if (not pending and not self._queue) or time.monotonic() > close_deadline:
                        break
                    continue
                self._wake.wait(self._interval)
                self._wake.clear()
        finally:
            if pending:
                self._queue.extendleft(reversed(pending))
            if self._pg is not None:
                self._pg.close()
