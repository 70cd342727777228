"""Hashed n-grams: a sample of responses reduced to the keyed hashes of their word 1–3-grams.

For experiments with content logging ``hashed``, a share ``sample_rate`` of successful
primary responses is hashed (:mod:`contracts.ngrams`: the redaction rules, lower-cased words,
1–3-grams, keyed BLAKE2b cut to 64 bits) and becomes one
:class:`contracts.events.NgramsEvent`; the text itself is never stored, shipped or logged.
The stuffing detector counts those hashes per arm as it counts phrases of stored text.

Off the hot path, in a bounded work queue like the judge sampler's (:mod:`gateway.background`):
the request path draws the sample and only offers the job after the user's response is
complete; the queue is bounded by count and by the characters of text waiting, and a job
that does not fit is dropped and counted (``liftgate_gateway_ngrams_total{outcome="dropped"}``).
One worker hashes one response at a time on the event loop, in steps of ~0.1 ms with the loop
free for other requests between them: hashing is pure CPU (0.14–1.9 ms an answer,
bench/gateway/README.md), and in one step a long answer would stall every request on the
loop for that long. A thread would not help: hashing holds the GIL, and the loop would wait
for it just as long.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Final

from contracts.events import NgramsEvent, ngrams_event_id
from contracts.ngrams import (
    TEXT_MAX,
    NgramKey,
    grams_of_words,
    kept,
    text_pieces,
    word_windows,
    words,
)
from gateway.background import Labels, WorkQueue
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


#: What one event-loop step of hashing does: tokenise this many characters, make the grams
#: of this many words, or hash this many grams — each ~0.1 ms of CPU. Every step also costs
#: a loop iteration, so the steps are no smaller than that.
CHARS: Final = 1500
WORDS: Final = 200
GRAMS: Final = 128


async def hashes(
    key: NgramKey, text: str, chars: int = CHARS, window: int = WORDS, batch: int = GRAMS
) -> list[int]:
    """``key.hashes(text)``, computed in steps of at most about ``chars`` characters,
    ``window`` words or ``batch`` grams, yielding to the event loop between them."""
    w: list[str] = []
    for piece in text_pieces(text, chars):
        w += words(piece)
        await asyncio.sleep(0)
    found: set[str] = set()
    for part in word_windows(w, window):
        found |= grams_of_words(part)
        await asyncio.sleep(0)
    todo = list(found)
    seen: set[int] = set()
    runs: list[int] = []  # each step's hashes, sorted: the last step merges runs, a shorter sort
    for i in range(0, len(todo), batch):
        digests = key.digests(todo[i : i + batch])
        seen |= digests
        runs += sorted(digests)
        await asyncio.sleep(0)
    # Distinct grams, so a hash repeats across steps only if two grams' hashes collide.
    return kept(runs if len(runs) == len(seen) else seen)


class NgramSampler(WorkQueue[NgramJob]):
    def __init__(self, config: NgramConfig, recorder: Recorder, metrics: GatewayMetrics) -> None:
        # One worker: the hashing is local CPU, and at shutdown what is queued is hashed for
        # up to 2 s.
        super().__init__(
            "ngrams",
            metrics.ngrams,
            workers=1,
            max_jobs=config.queue_size,
            max_bytes=config.queue_chars,
            drain_s=2.0,
        )
        self.config = config
        self.recorder = recorder

    @property
    def rate(self) -> float:
        return self.config.sample_rate

    def size(self, job: NgramJob) -> int:
        return len(job.text)

    def labels(self, job: NgramJob) -> Labels:
        return job.route, job.experiment, job.variant

    async def run(self, job: NgramJob) -> str:
        try:
            grams = await hashes(self.config.key, job.text)
        except Exception:  # never log the text (nor an exception that may quote it)
            log.error("hashing the n-grams of request %s failed", job.request_id)
            return "failed"
        job.text = ""  # the text is gone before the event leaves
        self.recorder.emit(
            NgramsEvent(
                request_id=job.request_id,
                unit_id=job.unit_id,
                role="primary",
                key_id=self.config.key.key_id,
                grams=grams,
                experiment_id=job.experiment_id,
                variant=job.variant,
                category=job.category,
                event_id=ngrams_event_id(job.request_id),
            )
        )
        return "hashed"
