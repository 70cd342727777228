"""Shadow mirroring: off the hot path, bounded queue + bounded concurrency, overflow dropped.

The user's request only does ``put_nowait`` (after its response is complete); a fixed pool
of worker tasks sends the mirrored calls. The queue is bounded twice: by count
(``shadow_queue_size``) and by the bytes of the mirrored bodies (and prompts) queued *or in
flight* (``shadow_queue_bytes``), so large requests cannot turn it into gigabytes. A mirror
that does not fit is dropped and counted (``liftgate_gateway_shadow_total{outcome="dropped"}``).
A hanging, failing or unreachable candidate therefore only occupies workers and fills the
queue — it never delays or changes a user's response.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from gateway.judge import JudgeSampler, job_for
from gateway.recorder import CallInfo, Recorder
from gateway.relay import CallResult, SseFilter, call_json, classify, open_stream, summarize_json
from gateway.snapshot import VariantConfig
from gateway.telemetry import GatewayMetrics
from gateway.upstreams import UpstreamPool

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ShadowJob:
    info: CallInfo  # request_id is the shadow call's own id; pair_id links it to the primary
    pair_id: str
    variant: VariantConfig
    payload: bytes
    prompt: str | None


def _size(job: ShadowJob) -> int:
    question = job.info.judge_question
    return len(job.payload) + (len(job.prompt) if job.prompt else 0) + (len(question) if question else 0)


class ShadowMirror:
    def __init__(
        self,
        pool: UpstreamPool,
        recorder: Recorder,
        metrics: GatewayMetrics,
        concurrency: int,
        queue_size: int,
        queue_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.pool = pool
        self.recorder = recorder
        self.metrics = metrics
        self.concurrency = concurrency
        self.queue: asyncio.Queue[ShadowJob] = asyncio.Queue(maxsize=queue_size)
        self.max_bytes = queue_bytes
        self.held_bytes = 0  # bodies and prompts queued or in flight
        self._workers: list[asyncio.Task[None]] = []
        self._children: dict[tuple[str, str, str, str], Any] = {}
        # Set by the app when a judge is configured: both sides of a judged pair are scored.
        self.judge: JudgeSampler | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._work()) for _ in range(self.concurrency)]

    async def close(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    def outcome(self, route: str, experiment: str, variant: str, outcome: str) -> Any:
        """The pre-bound counter child (labels() is too slow to call per request)."""
        key = (route, experiment, variant, outcome)
        child = self._children.get(key)
        if child is None:
            if len(self._children) > 10_000:
                self._children.clear()
            child = self._children[key] = self.metrics.shadow.labels(*key)
        return child

    def full(self) -> bool:
        return self.queue.full() or self.held_bytes >= self.max_bytes

    def drop(self, route: str, experiment: str, variant: str) -> None:
        self.outcome(route, experiment, variant, "dropped").inc()

    def submit(self, job: ShadowJob) -> bool:
        info = job.info
        size = _size(job)
        if self.queue.full() or self.held_bytes + size > self.max_bytes:
            self.drop(info.route, info.experiment or "", job.variant.name)
            return False
        self.queue.put_nowait(job)
        self.held_bytes += size
        self.outcome(info.route, info.experiment or "", job.variant.name, "sent").inc()
        return True

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                await self._call(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken mirror must not kill the worker
                log.exception("shadow call failed unexpectedly")
            finally:
                self.held_bytes -= _size(job)
                self.queue.task_done()

    async def _call(self, job: ShadowJob) -> None:
        info, variant = job.info, job.variant
        res = CallResult()
        t0 = perf_counter()
        keep_text = info.keep_text
        client = self.pool.clients.get(variant.upstream)
        if client is None:
            res.error_type = "connect"
        elif info.stream:
            resp = await open_stream(client, info.endpoint, job.payload, res)
            if resp is not None:
                flt = SseFilter(res, info.endpoint == "chat", True, keep_text, t0)
                try:
                    async for chunk in resp.chunks():
                        flt.feed(chunk)
                    flt.flush()
                except Exception as exc:
                    res.error_type = "stream" if classify(exc) == "protocol" else classify(exc)
                finally:
                    resp.release()
        else:
            await call_json(client, info.endpoint, job.payload, res)
            if res.error_type is None:
                summarize_json(res, info.endpoint, keep_text)
        latency = perf_counter() - t0
        outcome = "failed" if res.error_type else "ok"
        self.outcome(info.route, info.experiment or "", variant.name, outcome).inc()
        status = res.status or (504 if res.error_type == "timeout" else 502)
        self.recorder.record(
            info,
            variant.name,
            variant.model,
            variant.upstream,
            res,
            status,
            latency,
            role="shadow",
            pair_id=job.pair_id,
            prompt=job.prompt,
        )
        if self.judge is not None and (judged := job_for(info, variant.name, res, "shadow", job.pair_id)):
            self.judge.submit(judged)
