"""Bounded background work: what the request path hands off and never waits for.

Shadow mirrors, judge calls and n-gram hashing share one shape. The request path offers a
job after the user's response is complete and never waits: a job that does not fit — by
count (``max_jobs``), or by the size of the jobs queued *or in flight* (``max_bytes``; the
bytes or characters a job holds) — is dropped and counted. A fixed number of worker tasks
run the jobs, so a slow, failing or unreachable backend only occupies the workers and fills
the queue: it never delays or changes a user's response. A job that raises is logged and
counted as ``failed``; the worker goes on with the next. ``close`` lets the workers finish
what is queued for at most ``drain_s``, then cancels them.

Each queue counts into one Prometheus counter labelled (route, experiment, variant,
outcome): ``dropped``, the accepted outcome (``sent`` for shadow mirrors, ``queued``
otherwise), and the outcome each job's :meth:`WorkQueue.run` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from prometheus_client import Counter

log = logging.getLogger(__name__)

J = TypeVar("J")
Labels = tuple[str, str, str]  # route, experiment, variant


class WorkQueue(ABC, Generic[J]):
    """A bounded queue of jobs of type ``J`` and the workers that run them; a subclass says
    what a job weighs, how it is labelled and what running it means."""

    def __init__(
        self,
        name: str,
        counter: Counter,
        *,
        workers: int,
        max_jobs: int,
        max_bytes: int,
        accepted: str = "queued",
        drain_s: float = 0.0,
    ) -> None:
        self.name = name
        self.counter = counter
        self.workers = workers
        self.max_bytes = max_bytes
        self.held_bytes = 0  # the size of the jobs queued or in flight
        self.accepted = accepted
        self.drain_s = drain_s
        self._queue: asyncio.Queue[J] = asyncio.Queue(maxsize=max_jobs)
        self._tasks: list[asyncio.Task[None]] = []
        # Pre-bound counter children: ``labels()`` is too slow to call per request.
        self._children: dict[Labels, dict[str, Any]] = {}

    @abstractmethod
    def size(self, job: J) -> int:
        """What the job holds in memory while it waits or runs (bytes, or characters)."""

    @abstractmethod
    def labels(self, job: J) -> Labels:
        """(route, experiment, variant) of the job's counts."""

    @abstractmethod
    async def run(self, job: J) -> str:
        """Do the job; the outcome to count (``ok``, ``failed``, ``scored``, …)."""

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work()) for _ in range(self.workers)]

    async def close(self) -> None:
        """Run what is queued for at most ``drain_s``, then stop the workers."""
        if self.drain_s > 0 and any(not task.done() for task in self._tasks):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), self.drain_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._queue.qsize():
            log.info("%s: %d queued jobs not run at shutdown", self.name, self._queue.qsize())

    async def join(self) -> None:
        """Wait until every accepted job has ended."""
        await self._queue.join()

    def count(self, labels: Labels, outcome: str) -> None:
        children = self._children.get(labels)
        if children is None:
            if len(self._children) > 10_000:  # bounded, whatever the routes and variants
                self._children.clear()
            children = self._children[labels] = {}
        child = children.get(outcome)
        if child is None:
            child = children[outcome] = self.counter.labels(*labels, outcome)
        child.inc()

    def full(self) -> bool:
        """True when no job could be accepted now (checked before building an expensive one)."""
        return self._queue.full() or self.held_bytes >= self.max_bytes

    def offer(self, job: J) -> bool:
        """Queue the job without waiting; False (counted as dropped) when it does not fit."""
        size = self.size(job)
        if self._queue.full() or self.held_bytes + size > self.max_bytes:
            self.count(self.labels(job), "dropped")
            return False
        self._queue.put_nowait(job)
        self.held_bytes += size
        self.count(self.labels(job), self.accepted)
        return True

    async def _work(self) -> None:
        queue = self._queue
        while True:
            job = await queue.get()
            size = self.size(job)  # before running: a job may let go of what it holds
            try:
                try:
                    outcome = await self.run(job)
                except Exception:  # one broken job must not stop the worker
                    log.exception("%s: a job failed unexpectedly", self.name)
                    outcome = "failed"
                self.count(self.labels(job), outcome)
            finally:
                self.held_bytes -= size
                queue.task_done()
