"""Run a dataset against every variant of an experiment: call, cache, score, store, resume.

For each variant's upstream (any OpenAI-compatible server) and each item × sample: the
output cache is asked first — keyed by SHA-256 of (base URL, model, item fingerprint,
parameters, sample) — and only a miss calls the model (``POST {base_url}/chat/completions``
with temperature, seed (+ sample index), max_tokens pinned), with bounded concurrency, a
per-call timeout (the upstream's) and retries with exponential backoff on connection
errors, 408, 409, 429 and 5xx. Verifiable scores are cached with the output, so a rerun of
the same run costs no call and no sandbox. Results are written as they come (batches); an
interrupted run is resumed by the next ``eval run`` with the same run key (it skips every
stored result without an error); a completed one is reused as is. One process at a time
works on a run (a PostgreSQL advisory lock).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from sqlalchemy import Engine

from contracts.offline_gate import candidate_fingerprint
from evals import store
from evals.datasets.loaders import Dataset
from evals.gate import GateParams
from evals.items import EvalItem, JudgeSpec, RewardModelSpec
from evals.scorers import SCORER_VERSION, Score, ScoringContext, score_async
from evals.store import ResultRow, Target

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
Progress = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    params: GateParams = field(default_factory=GateParams)
    samples: int = 1
    concurrency: int = 32
    retries: int = 3
    backoff_s: float = 0.5
    flush_every: int = 256
    flush_interval_s: float = 1.0
    scoring: ScoringContext = field(default_factory=ScoringContext)
    sandbox_workers: int = 2
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: int
    variant: str | None
    status: str
    reused: bool
    outputs: int
    called: int
    cached: int
    errors: int
    passed: int
    seconds: float


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def fingerprint(target: Target, params: GateParams) -> str:
    """What a gate decision vouches for (:func:`contracts.fingerprint.candidate_fingerprint`)."""
    return candidate_fingerprint(target.upstream, target.base_url, target.model, params.as_dict())


def run_key(fp: str, dataset: Dataset, samples: int, experiment_id: int | None, variant: str | None) -> str:
    """A run belongs to one experiment's variant: the gate looks for runs by experiment and
    variant, so a run of another experiment (or of another variant with the same upstream and
    model, as in an A/A test) must not be reused in their place. Outputs and scores are cached
    across runs (:func:`cache_key`), so a second run of the same target calls nothing."""
    return store.sha256(f"{fp}:{dataset.fingerprint()}:{SCORER_VERSION}:{samples}:{experiment_id}:{variant}")


def cache_key(target: Target, params: GateParams, item: EvalItem, sample: int) -> str:
    return store.sha256(_canonical({"base_url": target.base_url.rstrip("/"), "model": target.model,
                                    "item": item.fingerprint(), "params": params.as_dict(),
                                    "sample": sample}).decode())  # fmt: skip


def _judged(item: EvalItem) -> bool:
    return isinstance(item.scorer, JudgeSpec | RewardModelSpec)


class CallError(RuntimeError):
    pass


#: A reply larger than this is an error, not an answer: no scorer reads more than 100,000
#: characters, and an upstream must not be able to exhaust the runner's memory.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


async def _read_capped(resp: aiohttp.ClientResponse) -> bytes:
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise CallError(f"the reply is larger than {MAX_RESPONSE_BYTES >> 20} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


async def call_model(
    session: aiohttp.ClientSession, target: Target, params: GateParams, item: EvalItem, sample: int,
    retries: int, backoff_s: float,
) -> tuple[str, str | None, float]:  # fmt: skip
    """(content, finish reason, latency ms) of one chat completion, retried on transient errors."""
    body: dict[str, Any] = {"model": target.model, "messages": item.chat(), "temperature": params.temperature,
                            "seed": params.seed + sample, "max_tokens": params.max_tokens}  # fmt: skip
    if params.top_p is not None:
        body["top_p"] = params.top_p
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    url = target.base_url.rstrip("/") + "/chat/completions"
    timeout = aiohttp.ClientTimeout(total=target.timeout_s)
    last = "no attempt"
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
        started = time.monotonic()
        try:
            async with session.post(url, data=orjson.dumps(body), headers={**headers, "Content-Type": "application/json"},
                                    timeout=timeout) as resp:  # fmt: skip
                raw = await _read_capped(resp)
                if resp.status in RETRY_STATUS:
                    last = f"HTTP {resp.status}"
                    continue
                if resp.status != 200:
                    raise CallError(f"HTTP {resp.status}: {raw[:200].decode(errors='replace')}")
            data = orjson.loads(raw)
            choice = data["choices"][0]
            content = choice["message"].get("content") or ""
            if not isinstance(content, str):
                raise CallError("the reply's content is not text")
            return content, choice.get("finish_reason"), (time.monotonic() - started) * 1000
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            last = f"{type(exc).__name__}: {exc}"[:200]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            raise CallError("the reply is not a chat completion") from None
    raise CallError(f"gave up after {retries + 1} attempts ({last})")


class _Writer:
    """Buffers results and cache rows; flushes them in one transaction per batch."""

    def __init__(self, engine: Engine, run_id: int, every: int, interval_s: float) -> None:
        self.engine, self.run_id, self.every, self.interval_s = engine, run_id, every, interval_s
        self.results: list[ResultRow] = []
        self.cache: list[dict[str, Any]] = []
        self.last = time.monotonic()

    def add(self, row: ResultRow, cache: dict[str, Any] | None) -> None:
        self.results.append(row)
        if cache is not None:
            self.cache.append(cache)
        # By count for throughput, by time so that an interruption loses at most a second.
        if len(self.results) >= self.every or time.monotonic() - self.last >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        if not self.results and not self.cache:
            return
        with self.engine.begin() as conn:
            store.write_cache(conn, self.cache)
            store.write_results(conn, self.run_id, self.results)
        self.results, self.cache = [], []
        self.last = time.monotonic()


async def _evaluate(
    session: aiohttp.ClientSession, target: Target, item: EvalItem, sample: int, key: str,
    hit: store.CachedOutput | None, settings: RunnerSettings, slots: asyncio.Semaphore,
    sandbox: asyncio.Semaphore,
) -> tuple[ResultRow, dict[str, Any] | None]:  # fmt: skip
    if (
        hit is not None
        and hit.scorer_version == SCORER_VERSION
        and hit.passed is not None
        and not _judged(item)
    ):
        score = Score(hit.passed, float(hit.score or 0.0), hit.reason or "")
        return ResultRow(item.id, sample, item.category, hit.output, None, score.passed, score.score, score.reason,
                         hit.latency_ms, True), None  # fmt: skip
    if hit is not None:
        output, finish, latency = hit.output, hit.finish_reason, hit.latency_ms
    else:
        async with slots:
            try:
                output, finish, latency = await call_model(session, target, settings.params, item, sample,
                                                           settings.retries, settings.backoff_s)  # fmt: skip
            except CallError as exc:
                return ResultRow(item.id, sample, item.category, None, str(exc), False, 0.0,
                                 f"call failed: {exc}", None, False), None  # fmt: skip
    score = await score_async(item, output, settings.scoring, session, sandbox)
    verifiable = not _judged(item)
    cache = {"key": key, "output": output, "finish_reason": finish, "latency_ms": latency,
             "scorer_version": SCORER_VERSION if verifiable else None, "passed": score.passed if verifiable else None,
             "score": score.score if verifiable else None, "reason": score.reason if verifiable else None}  # fmt: skip
    row = ResultRow(item.id, sample, item.category, output, None, score.passed, score.score, score.reason, latency,
                    hit is not None)  # fmt: skip
    return row, cache


async def run_target(
    engine: Engine, dataset: Dataset, target: Target, settings: RunnerSettings, *, experiment_id: int | None,
    session: aiohttp.ClientSession, slots: asyncio.Semaphore, sandbox: asyncio.Semaphore,
    progress: Progress | None = None,
) -> RunSummary:  # fmt: skip
    started = time.monotonic()
    fp = fingerprint(target, settings.params)
    key = run_key(fp, dataset, settings.samples, experiment_id, target.variant)
    with store.run_lock(engine, key) as locked:
        if not locked:
            raise store.StoreError(
                f"another process is running this eval for {target.variant or target.model}"
            )
        with engine.begin() as conn:
            ds_id = store.save_dataset(conn, dataset)
            run_id, before = store.open_run(
                conn, run_key=key, dataset_id=ds_id, dataset_fingerprint=dataset.fingerprint(),
                experiment_id=experiment_id, target=target, params=settings.params.as_dict(), fingerprint=fp,
                samples=settings.samples, items=len(dataset.items),
            )  # fmt: skip
            if settings.fresh and before != "new":
                store.reopen_run(conn, run_id)
                before = "running"
            done = store.done_results(conn, run_id)
        if before == "completed":
            with engine.begin() as conn:
                summary = store.finish_run(conn, run_id, "completed")
            if progress:
                progress(target.variant or target.model, len(dataset.items) * settings.samples)
            return RunSummary(run_id, target.variant, "completed", True, summary["outputs"], 0, 0, summary["errors"],
                              summary["passed"], time.monotonic() - started)  # fmt: skip
        todo = [
            (item, s) for item in dataset.items for s in range(settings.samples) if (item.id, s) not in done
        ]
        if progress and done:
            progress(target.variant or target.model, len(done))
        keys = [cache_key(target, settings.params, item, s) for item, s in todo]
        with engine.connect() as conn:
            hits = {} if settings.fresh else store.cached_outputs(conn, keys)
        writer = _Writer(engine, run_id, settings.flush_every, settings.flush_interval_s)
        counts = {"called": 0, "cached": 0}
        status = "interrupted"
        try:
            tasks = [
                asyncio.ensure_future(
                    _evaluate(session, target, item, s, k, hits.get(k), settings, slots, sandbox)
                )
                for (item, s), k in zip(todo, keys, strict=True)
            ]
            try:
                for next_done in asyncio.as_completed(tasks):
                    row, cache = await next_done
                    counts["cached" if row.cached else "called"] += row.error is None
                    writer.add(row, cache)
                    if progress:
                        progress(target.variant or target.model, 1)
            finally:
                for task in tasks:
                    task.cancel()
            status = "completed"
        finally:
            writer.flush()
            with engine.begin() as conn:
                summary = store.finish_run(conn, run_id, status)
        return RunSummary(run_id, target.variant, status, False, summary["outputs"], counts["called"],
                          counts["cached"], summary["errors"], summary["passed"], time.monotonic() - started)  # fmt: skip


async def run_experiment(
    engine: Engine, dataset: Dataset, targets: tuple[Target, ...], settings: RunnerSettings, *,
    experiment_id: int | None, progress: Progress | None = None,
) -> list[RunSummary]:  # fmt: skip
    """Every target on ``dataset``, concurrently, under one concurrency bound."""
    slots = asyncio.Semaphore(settings.concurrency)
    sandbox = asyncio.Semaphore(max(1, settings.sandbox_workers))
    connector = aiohttp.TCPConnector(limit=max(settings.concurrency, 1) * 2, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector) as session:
        return list(await asyncio.gather(*(
            run_target(engine, dataset, t, settings, experiment_id=experiment_id, session=session, slots=slots,
                       sandbox=sandbox, progress=progress) for t in targets
        )))  # fmt: skip


def pass_rate(summary: RunSummary) -> float:
    return summary.passed / summary.outputs if summary.outputs else math.nan
