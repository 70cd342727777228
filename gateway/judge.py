"""The online judge: a sample of responses scored by a judge or reward model, off the hot path.

Which calls: a share ``sample_rate`` of attributed primary calls, drawn *before* the
upstream call (so the response text is kept only for the sampled ones), and both sides of
a sampled call's shadow pairs. The judge is any OpenAI-compatible chat endpoint: it gets a
rubric (system message) and the user's first message with the response, and must answer
with a number in [score_min, score_max]; the first number in its answer is the score.

Isolation, as for shadow mirrors (:mod:`gateway.background`): the request path only offers a
job after the user's response is complete; a fixed pool of workers calls the judge; the queue
is bounded by count and by the characters of the texts queued or in flight; a job that does
not fit is dropped and counted (``liftgate_gateway_judge_total{outcome="dropped"}``). A slow
or dead judge only fills the queue — it never delays a user.

Every job that reached a worker becomes one :class:`contracts.events.JudgeEvent` — a
score, or ``status="error"`` with the reason (``connect``, ``timeout``, ``http_5xx``,
``unparseable``) — whose ``event_id`` is derived from the judged request id, so a
re-delivered judgement is stored once.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import orjson

from contracts.events import JudgeEvent, judge_event_id
from contracts.judging import DEFAULT_RUBRIC, TEXT_MAX, judge_request, parse_score, system_prompt
from gateway.background import Labels, WorkQueue
from gateway.recorder import CallInfo, Recorder
from gateway.relay import CallResult, call_json
from gateway.telemetry import GatewayMetrics
from gateway.upstreams import UpstreamClient

__all__ = ["DEFAULT_RUBRIC", "TEXT_MAX", "JudgeConfig", "JudgeSampler", "parse_score"]


@dataclass(frozen=True, slots=True)
class JudgeConfig:
    base_url: str
    model: str
    name: str = "judge"
    sample_rate: float = 0.0
    rubric: str = DEFAULT_RUBRIC
    score_min: float = 1.0
    score_max: float = 10.0
    concurrency: int = 4
    queue_size: int = 1000
    queue_bytes: int = 16 * 1024 * 1024


@dataclass(slots=True)
class JudgeJob:
    request_id: str
    unit_id: str
    role: str  # primary | shadow
    experiment_id: int | None
    experiment: str
    route: str
    variant: str
    pair_id: str | None
    category: str | None
    question: str
    answer: str


def job_for(
    info: CallInfo, variant: str, res: CallResult, role: str, pair_id: str | None = None
) -> JudgeJob | None:
    """The judge job of a finished call the sampler picked (None: not picked, or no answer)."""
    if info.judge_question is None or res.error_type is not None or not res.texts:
        return None
    return JudgeJob(
        request_id=info.request_id,
        unit_id=info.unit_id,
        role=role,
        experiment_id=info.experiment_id,
        experiment=info.experiment or "",
        route=info.route,
        variant=variant,
        pair_id=pair_id,
        category=info.category,
        question=info.judge_question,
        answer="".join(res.texts)[:TEXT_MAX],
    )


class JudgeSampler(WorkQueue[JudgeJob]):
    def __init__(
        self, config: JudgeConfig, client: UpstreamClient, recorder: Recorder, metrics: GatewayMetrics
    ) -> None:
        super().__init__(
            "judge",
            metrics.judge,
            workers=config.concurrency,
            max_jobs=config.queue_size,
            max_bytes=config.queue_bytes,
        )
        self.config = config
        self.client = client
        self.recorder = recorder
        self._system = system_prompt(config.rubric, config.score_min, config.score_max)

    @property
    def rate(self) -> float:
        return self.config.sample_rate

    def size(self, job: JudgeJob) -> int:
        return len(job.question) + len(job.answer)

    def labels(self, job: JudgeJob) -> Labels:
        return job.route, job.experiment, job.variant

    def payload(self, job: JudgeJob) -> bytes:
        return orjson.dumps(judge_request(self.config.model, self._system, job.question, job.answer))

    async def run(self, job: JudgeJob) -> str:
        cfg = self.config
        res = CallResult()
        t0 = perf_counter()
        await call_json(self.client, "chat", self.payload(job), res)
        latency_ms = (perf_counter() - t0) * 1000.0
        score = None
        error = res.error_type
        if error is None:
            score = parse_score(res.body, cfg.score_min, cfg.score_max)
            if score is None:
                error = "unparseable"
        self.recorder.emit(
            JudgeEvent(
                request_id=job.request_id,
                unit_id=job.unit_id,
                judge=cfg.name,
                role=job.role,  # type: ignore[arg-type]
                status="ok" if error is None else "error",
                latency_ms=latency_ms,
                experiment_id=job.experiment_id,
                variant=job.variant,
                pair_id=job.pair_id,
                category=job.category,
                score=score,
                error_type=error,
                event_id=judge_event_id(job.request_id, cfg.name),
            )
        )
        return "scored" if error is None else "failed"
