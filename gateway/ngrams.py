"""Hashed n-grams: a sample of responses reduced to the keyed hashes of their word 1–3-grams.

For experiments with content logging ``hashed``, a share ``sample_rate`` of successful
primary responses is hashed (:mod:`contracts.ngrams`: the redaction rules, lower-cased words,
1–3-grams, keyed BLAKE2b cut to 64 bits) and becomes one
:class:`contracts.events.NgramsEvent`; the text itself is never stored, shipped or logged.
The stuffing detector counts those hashes per arm as it counts phrases of stored text.

Off the hot path, like the judge sampler: the request path draws the sample and does only
``put_nowait`` after the user's response is complete; one worker hashes a job at a time
between requests (hashing is pure CPU, 0.14–1.9 ms an answer, so the default 1 % sample keeps
its share of the gateway's CPU to a few µs per request: bench/gateway/README.md); the queue is bounded by count and by the
characters of text waiting, and a job that does not fit is dropped and counted
(``liftgate_gateway_ngrams_total{outcome="dropped"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from contracts.events import NgramsEvent, ngrams_event_id
from contracts.ngrams import TEXT_MAX, NgramKey
from gateway.recorder import CallInfo, Recorder
from gateway.relay import CallResult
from gateway.telemetry import GatewayMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NgramConfig:
    key: NgramKey
    sample_rate: float = 0.01
    queue_size: int = 1000
    queue_chars: int = 4_000_000


@dataclass(slots=True)
class NgramJob:
    request_id: str
    unit_id: str
    experiment_id: int | None
    experiment: str
    route: str
    variant: str
    category: str | None
    text: str


def job_for(info: CallInfo, variant: str, res: CallResult) -> NgramJob | None:
    """The job of a finished primary call (None: failed, or no text)."""
    if res.error_type is not None or not res.texts:
        return None
    return NgramJob(
        request_id=info.request_id,
        unit_id=info.unit_id,
        experiment_id=info.experiment_id,
        experiment=info.experiment or "",
        route=info.route,
        variant=variant,
        category=info.category,
        text="".join(res.texts)[:TEXT_MAX],
    )


class NgramSampler:
    def __init__(self, config: NgramConfig, recorder: Recorder, metrics: GatewayMetrics) -> None:
        self.config = config
        self.recorder = recorder
        self.metrics = metrics
        self.queue: asyncio.Queue[NgramJob] = asyncio.Queue(maxsize=config.queue_size)
        self.held_chars = 0
        self._worker: asyncio.Task[None] | None = None

    @property
    def rate(self) -> float:
        return self.config.sample_rate

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def close(self, drain_s: float = 2.0) -> None:
        """Hash what is queued (local CPU only, so within ``drain_s``), then stop."""
        if self._worker is not None and not self._worker.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue.join(), drain_s)
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    def _count(self, job: NgramJob, outcome: str) -> None:
        self.metrics.ngrams.labels(job.route, job.experiment, job.variant, outcome).inc()

    def submit(self, job: NgramJob) -> bool:
        """Queue a response without waiting; False (counted as dropped) when full."""
        size = len(job.text)
        if self.queue.full() or self.held_chars + size > self.config.queue_chars:
            self._count(job, "dropped")
            return False
        self.queue.put_nowait(job)
        self.held_chars += size
        self._count(job, "queued")
        return True

    def event(self, job: NgramJob) -> NgramsEvent:
        return NgramsEvent(
            request_id=job.request_id,
            unit_id=job.unit_id,
            role="primary",
            key_id=self.config.key.key_id,
            grams=self.config.key.hashes(job.text),
            experiment_id=job.experiment_id,
            variant=job.variant,
            category=job.category,
            event_id=ngrams_event_id(job.request_id),
        )

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            size = len(job.text)
            try:
                event = self.event(job)
                job.text = ""  # the text is gone before the event leaves
                self.recorder.emit(event)
                self._count(job, "hashed")
            except Exception:  # a broken job must not kill the worker (never log the text)
                log.error("hashing the n-grams of request %s failed", job.request_id)
            finally:
                self.held_chars -= size
                self.queue.task_done()
