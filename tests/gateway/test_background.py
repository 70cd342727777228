"""The bounded work queue behind shadow mirrors, the judge and n-gram hashing: offers never
wait, drops are counted by count and by size, a failing job does not stop its worker, and
close drains within its bound."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.background import Labels, WorkQueue


class Jobs(WorkQueue[str]):
    """Jobs are strings: their size is their length; "boom" raises, "hang" never ends."""

    def __init__(self, workers: int, max_jobs: int, max_bytes: int, drain_s: float = 0.0) -> None:
        counter = Counter("jobs", "jobs by outcome", ["route", "experiment", "variant", "outcome"],
                          registry=CollectorRegistry())  # fmt: skip
        super().__init__(
            "jobs", counter, workers=workers, max_jobs=max_jobs, max_bytes=max_bytes, drain_s=drain_s
        )
        self.done: list[str] = []

    def size(self, job: str) -> int:
        return len(job)

    def labels(self, job: str) -> Labels:
        return "r", "e", job[:1]

    async def run(self, job: str) -> str:
        if job == "boom":
            raise RuntimeError("broken job")
        if job == "hang":
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        self.done.append(job)
        return "ok"

    def counts(self) -> dict[tuple[str, str], float]:
        return {
            (s.labels["variant"], s.labels["outcome"]): s.value
            for s in self.counter.collect()[0].samples
            if s.name.endswith("_total")
        }


def test_offers_beyond_the_count_or_the_size_are_dropped_and_counted_without_waiting() -> None:
    q = Jobs(workers=1, max_jobs=2, max_bytes=10)

    async def run() -> list[bool]:
        accepted = [q.offer("a1"), q.offer("b22"), q.offer("c3")]  # no worker yet: 2 fit
        assert q.full() and q.held_bytes == 5
        q.start()
        await asyncio.wait_for(q.join(), 5)
        accepted += [q.offer("d" * 11), q.offer("e" * 10)]  # over the size, then just fits
        assert q.full()  # the size bound is reached: a caller can skip building a job
        await asyncio.wait_for(q.join(), 5)
        await q.close()
        return accepted

    assert asyncio.run(run()) == [True, True, False, False, True]
    assert q.done == ["a1", "b22", "e" * 10] and q.held_bytes == 0 and not q.full()
    assert q.counts() == {
        ("a", "queued"): 1, ("a", "ok"): 1, ("b", "queued"): 1, ("b", "ok"): 1, ("c", "dropped"): 1,
        ("d", "dropped"): 1, ("e", "queued"): 1, ("e", "ok"): 1,
    }  # fmt: skip


def test_a_job_that_raises_is_logged_and_counted_as_failed_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = Jobs(workers=1, max_jobs=10, max_bytes=100)

    async def run() -> None:
        q.start()
        for job in ("boom", "after"):
            assert q.offer(job)
        await asyncio.wait_for(q.join(), 5)
        await q.close()

    with caplog.at_level(logging.ERROR, logger="gateway.background"):
        asyncio.run(run())
    assert q.done == ["after"] and q.held_bytes == 0
    assert q.counts()[("b", "failed")] == 1 and q.counts()[("a", "ok")] == 1
    assert "jobs: a job failed unexpectedly" in caplog.text and "broken job" in caplog.text


def test_close_runs_what_is_queued_within_its_drain_bound_then_cancels_the_rest() -> None:
    q = Jobs(workers=1, max_jobs=100, max_bytes=10_000, drain_s=0.3)

    async def run() -> float:
        q.start()
        for i in range(20):
            assert q.offer(f"quick{i}")
        assert q.offer("hang") and q.offer("never")
        t0 = time.monotonic()
        await q.close()
        return time.monotonic() - t0

    took = asyncio.run(run())
    assert q.done == [f"quick{i}" for i in range(20)]  # drained, in order, up to the hanging job
    assert 0.3 <= took < 3.0, took  # the hanging job held close for its bound, not longer


def test_without_a_drain_bound_close_cancels_at_once_and_runs_nothing_more() -> None:
    q = Jobs(workers=2, max_jobs=100, max_bytes=10_000)

    async def run() -> None:
        q.start()
        assert q.offer("hang") and q.offer("hang")
        await asyncio.sleep(0)  # both workers hold a hanging job
        for i in range(5):
            assert q.offer(f"later{i}")
        await asyncio.wait_for(q.close(), 1.0)

    asyncio.run(run())
    assert q.done == [] and q.held_bytes == len("later0") * 5  # queued, never run
