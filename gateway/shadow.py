"""Shadow mirroring: off the hot path, in a bounded work queue (:mod:`gateway.background`).

The user's request only offers a mirror after its response is complete; a fixed pool of
``shadow_concurrency`` workers sends the mirrored calls. The queue is bounded twice: by
count (``shadow_queue_size``) and by the bytes of the mirrored bodies (and prompts) queued
*or in flight* (``shadow_queue_bytes``), so large requests cannot turn it into gigabytes. A
mirror that does not fit is dropped and counted
(``liftgate_gateway_shadow_total{outcome="dropped"}``). A hanging, failing or unreachable
candidate therefore only occupies workers and fills the queue — it never delays or changes a
user's response.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

from gateway.background import Labels, WorkQueue
from gateway.judge import JudgeSampler, job_for
from gateway.recorder import CallInfo, Recorder
from gateway.relay import CallResult, SseFilter, call_json, classify, open_stream, summarize_json
from gateway.snapshot import VariantConfig
from gateway.telemetry import GatewayMetrics
from gateway.upstreams import UpstreamPool


@dataclass(slots=True)
class ShadowJob:
    info: CallInfo  # request_id is the shadow call's own id; pair_id links it to the primary
    pair_id: str
    variant: VariantConfig
    payload: bytes
    prompt: str | None


class ShadowMirror(WorkQueue[ShadowJob]):
    def __init__(
        self,
        pool: UpstreamPool,
        recorder: Recorder,
        metrics: GatewayMetrics,
        concurrency: int,
        queue_size: int,
        queue_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        super().__init__(
            "shadow",
            metrics.shadow,
            workers=concurrency,
            max_jobs=queue_size,
            max_bytes=queue_bytes,
            accepted="sent",
        )
        self.pool = pool
        self.recorder = recorder
        # Set by the app when a judge is configured: both sides of a judged pair are scored.
        self.judge: JudgeSampler | None = None

    def size(self, job: ShadowJob) -> int:
        question = job.info.judge_question
        return len(job.payload) + (len(job.prompt) if job.prompt else 0) + (len(question) if question else 0)

    def labels(self, job: ShadowJob) -> Labels:
        return job.info.route, job.info.experiment or "", job.variant.name

    async def run(self, job: ShadowJob) -> str:
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
            self.judge.offer(judged)
        return "failed" if res.error_type else "ok"
