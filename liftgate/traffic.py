"""The simulated-traffic driver: users from :mod:`liftgate.users` talking to a gateway.

Each worker task runs one conversation at a time: it picks a user (heavy users more
often), sends the first turn and follow-ups on the same ``X-Liftgate-Conversation``,
and posts the user's reactions to ``/v1/feedback`` with the response's ``X-Request-Id``.
Concurrency is bounded by the number of workers, the request rate by a shared pacer,
and the whole run by a duration and an optional request budget.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from liftgate import users as u

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    gateway_url: str
    route: str = "assistant"
    users: int = 100
    duration_s: float = 60.0
    max_requests: int | None = None
    rate: float | None = 10.0
    concurrency: int = 16
    seed: int = 0
    api_key: str | None = None
    stream_share: float = 0.2
    think_time_s: float = 0.0
    max_tokens: int = 512
    request_timeout_s: float = 30.0
    # Used when a response carries no quality signal (e.g. a real model server).
    quality_by_variant: dict[str, float] = field(default_factory=dict)
    default_quality: float = 0.5
    feedback: u.FeedbackModel = field(default_factory=u.FeedbackModel)
    user_prefix: str = "user"


@dataclass
class VariantStats:
    requests: int = 0
    errors: int = 0
    feedback: dict[str, int] = field(default_factory=dict)


@dataclass
class TrafficStats:
    started: float = field(default_factory=time.monotonic)
    requests: int = 0
    errors: int = 0
    conversations: int = 0
    feedback_sent: int = 0
    feedback_failed: int = 0
    feedback_retried: int = 0  # 429s from the gateway's per-client feedback rate, sent again
    requests_by_user: dict[str, int] = field(default_factory=dict)
    by_variant: dict[str, VariantStats] = field(default_factory=dict)
    last_error: str | None = None

    def variant(self, name: str) -> VariantStats:
        return self.by_variant.setdefault(name, VariantStats())

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class Answer:
    ok: bool
    request_id: str | None
    variant: str
    content: str
    quality: float | None
    error: str | None = None


class Pacer:
    """Spaces request starts evenly at ``rate`` per second across all workers."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate and rate > 0 else 0.0
        self._next = time.monotonic()

    async def wait(self) -> None:
        if not self._interval:
            return
        now = time.monotonic()
        slot = max(now, self._next)
        self._next = slot + self._interval
        if slot > now:
            await asyncio.sleep(slot - now)


def _quality(data: dict[str, object]) -> float | None:
    value = data.get("sim_quality")
    if isinstance(value, int | float):
        return float(value)
    return None


class TrafficRun:
    """One bounded run; ``run()`` returns the final statistics."""

    def __init__(self, config: TrafficConfig, on_progress: Callable[[TrafficStats], None] | None = None):
        self.config = config
        self.stats = TrafficStats()
        self._on_progress = on_progress
        self._stop = asyncio.Event()
        self._pacer = Pacer(config.rate)
        self._population = u.build_population(config.users, seed=config.seed, prefix=config.user_prefix)
        self._deadline = 0.0
        self._base = config.gateway_url.rstrip("/")
        # The gateway limits feedback per client, and all simulated users share one client: after
        # a 429 every worker holds its feedback until the Retry-After has passed, so the bucket
        # refills and the retried call is not starved by the other workers draining it.
        self._feedback_hold_until = 0.0

    def stop(self) -> None:
        self._stop.set()

    def _done(self) -> bool:
        cfg = self.config
        if self._stop.is_set() or time.monotonic() >= self._deadline:
            return True
        return cfg.max_requests is not None and self.stats.requests >= cfg.max_requests

    async def run(self) -> TrafficStats:
        cfg = self.config
        self.stats = TrafficStats()
        self._deadline = time.monotonic() + cfg.duration_s
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        connector = aiohttp.TCPConnector(limit=cfg.concurrency * 2)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            workers = [asyncio.create_task(self._worker(session, i)) for i in range(max(1, cfg.concurrency))]
            all_done = asyncio.create_task(_join(workers))
            stopper = asyncio.create_task(_join([self._stop.wait()]))
            remaining = max(0.0, self._deadline - time.monotonic())
            await asyncio.wait(
                [stopper, all_done],
                timeout=remaining + cfg.request_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            stopper.cancel()
            self._stop.set()
            if not all_done.done():
                # Stopped early: workers notice between requests; in-flight calls get a moment.
                _, pending = await asyncio.wait(workers, timeout=min(5.0, cfg.request_timeout_s))
                for task in pending:
                    task.cancel()
            await all_done
        return self.stats

    def _headers(self, user: u.SimUser, task: str | None, conversation: str | None) -> dict[str, str]:
        # Show-Variant: the simulator counts what each arm got (clients are blinded by default).
        headers = {"X-Liftgate-Unit": user.user_id, "Content-Type": "application/json",
                   "X-Liftgate-Show-Variant": "true"}  # fmt: skip
        if task:
            headers["X-Liftgate-Tags"] = f"task={task}"
        if conversation:
            headers["X-Liftgate-Conversation"] = conversation
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    async def _worker(self, session: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(f"worker:{self.config.seed}:{index}")
        picker = u.UserPicker(self._population, rng)
        while not self._done():
            await self._conversation(session, picker.pick(), rng)
            self.stats.conversations += 1

    async def _conversation(
        self, session: aiohttp.ClientSession, user: u.SimUser, rng: random.Random
    ) -> None:
        cfg = self.config
        task = u.pick_task(user, rng)
        conversation = f"conv-{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}"
        messages = [{"role": "user", "content": u.first_prompt(task, rng)}]
        previous: Answer | None = None
        for _turn in range(u.turns_bound(cfg.feedback)):
            if self._done():
                return
            await self._pacer.wait()
            if self._done():
                return
            answer = await self._complete(session, user, task, conversation, messages, rng)
            self._count(user, answer)
            if not answer.ok:
                await asyncio.sleep(0.05)  # a failing gateway must not become a busy loop
                return
            quality = answer.quality
            if quality is None:
                quality = cfg.quality_by_variant.get(answer.variant, cfg.default_quality)
            if previous is not None and previous.request_id:
                await self._feedback(session, user, previous, u.Signal("continued"))
            for signal in u.react(quality, task, user, rng, cfg.feedback):
                await self._feedback(session, user, answer, signal)
            if rng.random() >= u.continue_probability(quality, cfg.feedback):
                return
            messages.append({"role": "assistant", "content": answer.content})
            messages.append({"role": "user", "content": u.follow_up(rng)})
            previous = answer
            pause = u.lognormal_think_time(rng, cfg.think_time_s)
            if pause:
                await asyncio.sleep(min(pause, max(0.0, self._deadline - time.monotonic())))

    def _count(self, user: u.SimUser, answer: Answer) -> None:
        st = self.stats
        st.requests += 1
        st.requests_by_user[user.user_id] = st.requests_by_user.get(user.user_id, 0) + 1
        vs = st.variant(answer.variant)
        vs.requests += 1
        if not answer.ok:
            st.errors += 1
            vs.errors += 1
            st.last_error = answer.error
        if self._on_progress is not None:
            self._on_progress(st)

    async def _complete(
        self,
        session: aiohttp.ClientSession,
        user: u.SimUser,
        task: str,
        conversation: str,
        messages: list[dict[str, str]],
        rng: random.Random,
    ) -> Answer:
        cfg = self.config
        stream = rng.random() < cfg.stream_share
        body = {
            "model": cfg.route,
            "messages": messages,
            "user": user.user_id,
            "max_tokens": cfg.max_tokens,
            "stream": stream,
        }
        try:
            async with session.post(
                f"{self._base}/v1/chat/completions",
                data=orjson.dumps(body),
                headers=self._headers(user, task, conversation),
            ) as resp:
                request_id = resp.headers.get("X-Request-Id")
                variant = resp.headers.get("X-Liftgate-Variant", "?")
                header_q = resp.headers.get("X-Sim-Quality")
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    return Answer(False, request_id, variant, "", None, f"HTTP {resp.status}: {text}")
                if stream:
                    content, quality, error = await _read_stream(resp)
                else:
                    data = orjson.loads(await resp.read())
                    choices = data.get("choices") or [{}]
                    content = str((choices[0].get("message") or {}).get("content") or "")
                    quality, error = _quality(data), None
                if quality is None and header_q:
                    quality = float(header_q)
                if error:
                    return Answer(False, request_id, variant, content, quality, error)
                return Answer(True, request_id, variant, content, quality)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return Answer(False, None, "?", "", None, f"{type(exc).__name__}: {exc}")

    async def _feedback(
        self, session: aiohttp.ClientSession, user: u.SimUser, answer: Answer, signal: u.Signal
    ) -> None:
        if not answer.request_id:
            return
        body = {
            "request_id": answer.request_id,
            "kind": signal.kind,
            "value": signal.value,
            "unit_id": user.user_id,
        }
        vs = self.stats.variant(answer.variant)
        ok = False
        # All simulated users share one client address, so an unpaced run meets the gateway's
        # per-client feedback rate: a 429 is waited out (its Retry-After, bounded) and sent
        # again, a bounded number of times, rather than silently thinning the signals.
        for attempt in range(_FEEDBACK_ATTEMPTS):
            hold = min(self._feedback_hold_until, self._deadline) - time.monotonic()
            if hold > 0:
                await asyncio.sleep(hold)
            try:
                async with session.post(
                    f"{self._base}/v1/feedback",
                    data=orjson.dumps(body),
                    headers=self._headers(user, None, None),
                ) as resp:
                    await resp.read()
                    ok = resp.status < 300
                    wait = _retry_after(resp) if resp.status == 429 else None
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.stats.last_error = f"feedback: {type(exc).__name__}: {exc}"
                break
            if wait is None or attempt == _FEEDBACK_ATTEMPTS - 1:
                if not ok:
                    self.stats.last_error = f"feedback: HTTP {resp.status}"
                break
            self.stats.feedback_retried += 1
            self._feedback_hold_until = max(self._feedback_hold_until, time.monotonic() + wait)
        if ok:
            self.stats.feedback_sent += 1
            vs.feedback[signal.kind] = vs.feedback.get(signal.kind, 0) + 1
        else:
            self.stats.feedback_failed += 1


_FEEDBACK_ATTEMPTS = 5
_MAX_RETRY_AFTER_S = 5.0


def _retry_after(resp: aiohttp.ClientResponse) -> float:
    """The 429's Retry-After in seconds (1 s when absent or unreadable), at most 5 s."""
    try:
        wait = float(resp.headers.get("Retry-After", "1"))
    except ValueError:
        wait = 1.0
    return min(_MAX_RETRY_AFTER_S, max(0.0, wait)) if wait == wait else 1.0


async def _join(aws: Sequence[Awaitable[object]]) -> None:
    """Wait for all of ``aws``; a cancelled or failed one does not stop the others."""
    await asyncio.gather(*aws, return_exceptions=True)


async def _read_stream(resp: aiohttp.ClientResponse) -> tuple[str, float | None, str | None]:
    """Collect an SSE chat stream: the text, a quality signal if any chunk has one, an error."""
    parts: list[str] = []
    quality: float | None = None
    error: str | None = None
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if "error" in chunk:
            error = str(chunk["error"].get("message", "stream error"))
            continue
        quality = _quality(chunk) if quality is None else quality
        for choice in chunk.get("choices") or []:
            parts.append(str((choice.get("delta") or {}).get("content") or ""))
    return "".join(parts), quality, error
