"""Sending notifications: one attempt (:func:`attempt`) and the delivery worker (:class:`Notifier`).

An attempt POSTs the rendered body (``control.notify_payload``) with the headers a receiver
needs — ``X-Liftgate-Event`` (the kind), ``X-Liftgate-Delivery`` (the event id, the same on
every retry: the de-duplication key) and, when the webhook has a secret,
``X-Liftgate-Signature`` (``control.webhook_signature``, signed at send time). Redirects
are not followed (the target is what the admin configured, nothing else). Every address
the host resolves to passes the SSRF guard (``control.destinations``) in the connector's
resolver, so the checked address is the one connected to.

Outcomes: 2xx delivered; a connection error, a timeout, 408, 429 or 5xx is retried with
exponential backoff and jitter until ``max_attempts``; any other answer (a 3xx, a 4xx such
as 401 for a wrong secret) or a refused address fails at once: retrying cannot change it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from sqlalchemy import Engine

from control import notifications, webhook_signature
from control.destinations import AddressPolicy, url_problem
from control.notify_payload import render
from control.notify_settings import NotifySettings

log = logging.getLogger(__name__)

USER_AGENT: Final = "liftgate-webhooks/1"
_RETRYABLE: Final = frozenset({408, 425, 429})
_LEASE_MARGIN_S: Final = 30.0


class Refused(OSError):
    """The destination's address is refused by the SSRF guard."""


class GuardedResolver(AbstractResolver):
    """The default resolver, refusing every host with a forbidden address among its answers."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        for answer in answers:
            refusal = self._policy.refusal(answer["host"])
            if refusal is not None:
                raise Refused(f"{host} resolves to a refused address: {refusal}")
        return answers

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    status_code: int | None
    error: str | None
    latency_ms: float
    retryable: bool


def session(policy: AddressPolicy, timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(policy), limit=64, force_close=True)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        headers={"User-Agent": USER_AGENT},
        trust_env=False,  # no proxy from the environment: the guard checks the real target
    )


async def attempt(
    http: aiohttp.ClientSession, claimed: notifications.Claimed, policy: AddressPolicy
) -> Outcome:
    started = time.perf_counter()

    def done(ok: bool, code: int | None, error: str | None, retryable: bool) -> Outcome:
        return Outcome(ok, code, error, round((time.perf_counter() - started) * 1000, 3), retryable)

    problem = url_problem(claimed.url, policy)
    if problem is not None:
        return done(False, None, problem, False)
    body = render(claimed.format, claimed.body)
    headers = {
        "Content-Type": "application/json",
        "X-Liftgate-Event": str(claimed.body.get("type")),
        "X-Liftgate-Delivery": str(claimed.body.get("id")),
    }
    if claimed.secret:
        headers[webhook_signature.HEADER] = webhook_signature.header_value(
            claimed.secret, int(time.time()), body
        )
    try:
        async with http.post(claimed.url, data=body, headers=headers, allow_redirects=False) as resp:
            await resp.content.read(4096)  # a little of the answer, so the connection ends cleanly
            code = resp.status
    except Refused as exc:
        return done(False, None, str(exc), False)
    except aiohttp.ClientConnectorError as exc:
        refused = _refusal(exc)
        if refused is not None:
            return done(False, None, str(refused), False)
        return done(False, None, f"{type(exc).__name__}: {exc}", True)
    except TimeoutError:
        return done(False, None, "timed out", True)
    except (aiohttp.ClientError, OSError) as exc:
        return done(False, None, f"{type(exc).__name__}: {exc}", True)
    if 200 <= code < 300:
        return done(True, code, None, False)
    if 300 <= code < 400:
        return done(False, code, f"HTTP {code}: redirects are not followed", False)
    retryable = code >= 500 or code in _RETRYABLE
    return done(False, code, f"HTTP {code}", retryable)


def _refusal(exc: BaseException) -> Refused | None:
    """The guard's refusal behind a connection error (aiohttp wraps resolver errors)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, Refused):
            return seen
        inner = getattr(seen, "os_error", None)
        if isinstance(inner, BaseException) and inner is not seen:
            seen = inner
        else:
            seen = seen.__cause__ or seen.__context__
    return None


def record(
    engine: Engine,
    claimed: notifications.Claimed,
    outcome: Outcome,
    settings: NotifySettings,
    *,
    retry: bool = True,
) -> str:
    more = retry and outcome.retryable and claimed.attempt < settings.max_attempts
    retry_in = (
        notifications.backoff_s(claimed.attempt, settings.backoff_base_s, settings.backoff_max_s)
        if more
        else None
    )
    with engine.begin() as conn:
        status = notifications.finish(
            conn,
            claimed,
            ok=outcome.ok,
            status_code=outcome.status_code,
            error=outcome.error,
            latency_ms=outcome.latency_ms,
            retry_in_s=retry_in,
        )
    if not outcome.ok:
        # The webhook's name only: its URL can be a credential.
        log.warning(
            "webhook %s: delivery %s attempt %s failed (%s)%s",
            claimed.webhook, claimed.delivery_id, claimed.attempt, outcome.error,
            f"; retrying in {retry_in:.1f}s" if retry_in is not None else "",
        )  # fmt: skip
    return status


async def send_test(engine: Engine, name: str, actor: str, settings: NotifySettings) -> dict[str, Any]:
    """The test button: queue a ``test`` event for one webhook and make one attempt now
    (recorded in the delivery log; not retried). The delivery as the log shows it."""

    def queue() -> notifications.Claimed:
        with engine.begin() as conn:
            did = notifications.queue_test(conn, name, actor, datetime.now(UTC))
            claimed = notifications.claim(conn, 1, settings.timeout_s + _LEASE_MARGIN_S, delivery_id=did)
        return claimed[0]

    claimed = await asyncio.to_thread(queue)
    policy = settings.policy()
    async with session(policy, settings.timeout_s) as http:
        outcome = await attempt(http, claimed, policy)
    await asyncio.to_thread(record, engine, claimed, outcome, settings, retry=False)

    def read() -> dict[str, Any]:
        with engine.connect() as conn:
            rows = notifications.deliveries(conn, webhook=name, limit=20)
        return next(r for r in rows if r["id"] == claimed.delivery_id)

    return await asyncio.to_thread(read)


class Notifier:
    """The delivery worker: claims due deliveries and sends them, ``concurrency`` at a time."""

    def __init__(self, engine: Engine, settings: NotifySettings) -> None:
        self.engine = engine
        self.settings = settings

    def run(self, stop: threading.Event) -> None:
        log.info("notification worker running (poll %ss)", self.settings.poll_s)
        asyncio.run(self._main(stop))

    def _claim(self, n: int) -> list[notifications.Claimed]:
        with self.engine.begin() as conn:
            return notifications.claim(conn, n, self.settings.timeout_s + _LEASE_MARGIN_S)

    async def _deliver(self, http: aiohttp.ClientSession, claimed: notifications.Claimed) -> None:
        outcome = await attempt(http, claimed, self.settings.policy())
        try:
            await asyncio.to_thread(record, self.engine, claimed, outcome, self.settings)
        except Exception:  # the lease runs out and the attempt is made again
            log.exception("webhook %s: could not record delivery %s", claimed.webhook, claimed.delivery_id)

    async def _main(self, stop: threading.Event) -> None:
        inflight: set[asyncio.Task[None]] = set()
        async with session(self.settings.policy(), self.settings.timeout_s) as http:
            while not stop.is_set():
                room = self.settings.concurrency - len(inflight)
                claimed: list[notifications.Claimed] = []
                if room > 0:
                    try:
                        claimed = await asyncio.to_thread(self._claim, room)
                    except Exception:  # a database hiccup must not end the worker
                        log.exception("notification worker: claiming deliveries failed")
                for one in claimed:
                    task = asyncio.create_task(self._deliver(http, one))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                if not claimed:
                    await asyncio.sleep(self.settings.poll_s)
            if inflight:  # a stopped worker lets attempts in flight end (their deadline bounds it)
                await asyncio.wait(inflight, timeout=self.settings.timeout_s)
