"""The hot path: a raw ASGI handler for ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` that runs before FastAPI's router.

Per request: one pass over the headers — client key, declared size, liftgate headers, the
client's in-flight limit (refusals here never read the body) — then read the body within its
limit, ``orjson.loads``, the minimal shape and depth checks (``gateway.inputs``), look the
route up in the in-memory snapshot, assign the variant (pure hash), rewrite ``model`` (and,
for streams, ``stream_options.include_usage``), ``orjson.dumps``, call the upstream, relay the
answer, then hand one event to the sink and enqueue shadow mirrors. Unknown request fields
pass through untouched. No pydantic, no database, no blocking I/O.

Fallback (experiment ``fallback_to_control``, A/B and rollout): a candidate call that fails
before anything reached the client (connect error, timeout, 5xx) is retried once on the
control. Two events share the request id: the failed attempt (``role="attempt"``, variant =
the candidate, status ``error``; not counted as a request by analytics) and the served
primary call, which keeps ``variant`` = the candidate —
the unit's assigned arm, so per-unit analysis stays intention-to-treat and a unit never
appears in two arms — while ``model``/``upstream`` name the control that answered, with
``fallback=True, fallback_from=<candidate>``. ``X-Liftgate-Variant`` names the assigned arm.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from time import perf_counter
from typing import Any

import orjson

from contracts.config_rules import key_hash
from contracts.events import ROLLOUT_STAGE_TAG
from contracts.ids import request_id
from gateway import errors
from gateway.auth import peer
from gateway.blinding import model_echo
from gateway.bodies import CLOSE, BodyTooLarge, ClientGone, Receive, Scope, Send, read_body, refusal_headers
from gateway.category import CategoryRules
from gateway.http_client import StreamResponse
from gateway.inputs import MAX_DEPTH, completion_problem, header_problem, too_deep
from gateway.judge import TEXT_MAX, JudgeSampler, job_for
from gateway.limits import ConcurrencyLimit
from gateway.ngrams import NgramSampler
from gateway.ngrams import job_for as ngram_job_for
from gateway.recorder import CallInfo, Recorder, prompt_text
from gateway.relay import CallResult, SseFilter, call_json, classify, open_stream, summarize_json
from gateway.routing import Decision, RequestFacts, api_key_of, decide, parse_tags
from gateway.shadow import ShadowJob, ShadowMirror
from gateway.snapshot import RouteConfig, VariantConfig
from gateway.upstreams import UpstreamPool
from serving.protocol import arrived_body, disconnection, respond

MAX_BODY = 32 * 1024 * 1024
_JSON = (b"content-type", b"application/json")
_SSE = (b"content-type", b"text/event-stream; charset=utf-8")
_NO_CACHE = (b"cache-control", b"no-cache")
_RETRY_1S = (b"retry-after", b"1")
_DONE = b"data: [DONE]\n\n"
_FALLBACK_MODES = ("ab", "rollout")
_UNAUTHORIZED = errors.unauthorized()
_TOO_MANY = errors.rate_limited("Too many requests in flight for this client; retry later.")


async def send_json(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [_JSON, (b"content-length", b"%d" % len(body)), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def error_for(res: CallResult, upstream: str) -> tuple[int, bytes]:
    if res.error_type == "connect":
        return errors.upstream_down(upstream)
    if res.error_type == "timeout":
        return errors.upstream_timeout(upstream)
    if res.error_type in ("http_4xx", "http_5xx"):
        return res.status, errors.upstream_error(res.status, res.body)
    return errors.upstream_bad_response(upstream)


def _mid_stream_error(res: CallResult) -> bytes:
    message = "upstream timed out mid-stream" if res.error_type == "timeout" else "upstream stream failed"
    return b"data: " + errors.error_body(message, "upstream_error", res.error_type) + b"\n\n" + _DONE


class CompletionProxy:
    def __init__(
        self,
        snapshot: Callable[[], Any],
        pool: UpstreamPool,
        recorder: Recorder,
        shadow: ShadowMirror | None,
        rng: Callable[[], float] = random.random,
        *,
        keys_required: bool = True,
        max_body: int = MAX_BODY,
        concurrency: ConcurrencyLimit | None = None,
        categories: CategoryRules | None = None,
        judge: JudgeSampler | None = None,
        ngrams: NgramSampler | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.pool = pool
        self.recorder = recorder
        self.shadow = shadow
        self.rng = rng
        self.metrics = recorder.metrics
        self.keys_required = keys_required
        self.max_body = max_body
        self.concurrency = concurrency if concurrency is not None else ConcurrencyLimit(0)
        self._too_large = errors.too_large(max_body)
        self.categories = categories
        self.judge = judge
        self.ngrams = ngrams
        self._key_cache: dict[bytes, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        """Headers first — key, declared size, liftgate headers, per-client limit — and only
        then the body: a request refused on its headers is answered without reading it (its
        connection closed when the body is large or chunked, see ``bodies.refusal_headers``)."""
        t0 = perf_counter()
        unit_header = tags_raw = conversation = None
        show_variant = False
        authorization: bytes | None = None
        length = -1
        chunked = False
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        for name, value in headers:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = int(value) if value.isdigit() else -1
            elif name == b"transfer-encoding":
                chunked = True
            elif name.startswith(b"x-liftgate-"):
                if name == b"x-liftgate-unit":
                    unit_header = value.decode("utf-8", "replace")
                elif name == b"x-liftgate-tags":
                    tags_raw = value.decode("utf-8", "replace")
                elif name == b"x-liftgate-conversation":
                    conversation = value.decode("utf-8", "replace")[:128]
                elif name == b"x-liftgate-show-variant":
                    show_variant = value.strip().lower() in (b"true", b"1", b"yes")
        snap = self.snapshot()
        digest = self._hashed(authorization) if authorization else None
        refused = self.metrics.refused
        if self.keys_required and (digest is None or digest not in snap.api_key_hashes):
            refused["unauthorized"].inc()
            await send_json(send, *_UNAUTHORIZED, refusal_headers(length, chunked))
            return
        if length > self.max_body:
            refused["body_too_large"].inc()
            await send_json(send, *self._too_large, [CLOSE])
            return
        if unit_header is not None or tags_raw is not None or conversation is not None:
            problem = header_problem(unit_header, tags_raw, conversation)
            if problem is not None:
                refused["invalid_request"].inc()
                await send_json(send, *errors.bad_request(*problem), refusal_headers(length, chunked))
                return
        client = digest if self.keys_required and digest else peer(scope)
        if not self.concurrency.acquire(client):
            refused["rate_limited"].inc()
            await send_json(send, *_TOO_MANY, [_RETRY_1S, *refusal_headers(length, chunked)])
            return
        try:
            try:
                body = arrived_body(scope)  # nearly always: the body came with the head
                if body is None:
                    body = await read_body(receive, self.max_body)
                elif len(body) > self.max_body:
                    raise BodyTooLarge
            except BodyTooLarge:
                refused["body_too_large"].inc()
                await send_json(send, *self._too_large, [CLOSE])
                return
            except ClientGone:
                return
            await self._serve(
                scope, send, receive, endpoint, body, snap, t0, headers, authorization, digest,
                unit_header, tags_raw, conversation, show_variant,
            )  # fmt: skip
        finally:
            self.concurrency.release(client)

    async def _serve(
        self,
        scope: Scope,
        send: Send,
        receive: Receive,
        endpoint: str,
        body: bytes,
        snap: Any,
        t0: float,
        headers: list[tuple[bytes, bytes]],
        authorization: bytes | None,
        digest: str | None,
        unit_header: str | None,
        tags_raw: str | None,
        conversation: str | None,
        show_variant: bool = False,
    ) -> None:
        problem: tuple[str, str | None] | None = None
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            problem = "Request body is not valid JSON.", None
        else:
            if not isinstance(req, dict):
                problem = "Request body must be a JSON object.", None
            else:
                problem = completion_problem(req, endpoint)
                if problem is None and too_deep(body, req):
                    problem = f"Request body is nested too deeply (the limit is {MAX_DEPTH} levels).", None
        if problem is not None:
            self.metrics.refused["invalid_request"].inc()
            await send_json(send, *errors.bad_request(*problem), [])
            return
        model: str = req["model"]
        route: RouteConfig | None = snap.routes.get(model)
        if route is None:
            self.metrics.refused["model_not_found"].inc()
            await send_json(send, *errors.model_not_found(model), [])
            return
        facts = RequestFacts(
            unit_header=unit_header,
            user=req.get("user"),
            authorization=authorization,
            headers=headers,
            tags=parse_tags(tags_raw) if tags_raw else {},
            model=model,
            metadata=req.get("metadata") if route.experiment.targeting else None,
            key_digest=digest,
        )
        d = decide(route, facts)
        exp = route.experiment
        stream = endpoint != "embeddings" and req.get("stream") is True
        keep_usage = True
        if stream:
            opts = req.get("stream_options")
            keep_usage = isinstance(opts, dict) and opts.get("include_usage") is True
            if not keep_usage:
                req["stream_options"] = (
                    {**opts, "include_usage": True} if isinstance(opts, dict) else {"include_usage": True}
                )
        rid = request_id()
        tags = facts.tags
        category = judge_question = None
        if d.attributed and endpoint != "embeddings":
            # Before treatment: from what the user sent, never from the variant.
            if self.categories is not None:
                category = self.categories.categorize(req, endpoint, tags)
            judge = self.judge
            if judge is not None and judge.rate > 0.0 and self.rng() < judge.rate:
                judge_question = prompt_text(req, endpoint)[:TEXT_MAX]
        if d.attributed and exp.mode == "rollout" and exp.rollout_stage is not None:
            tags = {**tags, ROLLOUT_STAGE_TAG: str(exp.rollout_stage)}
        info = CallInfo(
            request_id=rid,
            route=route.route,
            experiment_id=exp.id if d.attributed else None,
            experiment=exp.name if d.attributed else None,
            unit_id=d.unit_id,
            unit_source=d.unit_source,
            mode=d.mode,
            endpoint=endpoint,
            stream=stream,
            tags=tags,
            conversation_id=conversation,
            content_logging=exp.content_logging if d.attributed else "none",
            category=category,
            judge_question=judge_question,
            show_variant=show_variant,
        )
        prompt = prompt_text(req, endpoint) if info.content_logging != "none" else None
        if stream:
            await self._stream(scope, send, receive, info, route, d, req, keep_usage, t0, prompt)
        else:
            await self._json(scope, send, info, route, d, req, t0, prompt)
        if route.shadows and d.attributed and self.shadow is not None:
            self._mirror(info, route, req, prompt)

    def _hashed(self, authorization: bytes) -> str | None:
        """SHA-256 of the bearer key, memoised: clients send the same few keys over and over."""
        cache = self._key_cache
        found = cache.get(authorization)
        if found is None:
            key = api_key_of(authorization)
            if key is None:
                return None
            if len(cache) >= 10_000:
                cache.clear()
            found = cache[authorization] = key_hash(key)
        return found

    def _headers(
        self, info: CallInfo, route: RouteConfig, variant: VariantConfig
    ) -> list[tuple[bytes, bytes]]:
        """Blinding: the arm (variant, experiment) is named only when the experiment says
        ``always``, or ``on_request`` (the default) and the client asked for it."""
        out = [(b"x-request-id", info.request_id.encode())]
        policy = route.experiment.variant_header
        if policy == "always" or (policy == "on_request" and info.show_variant):
            out.append((b"x-liftgate-variant", variant.name.encode()))
            if info.experiment is not None:
                out.append((b"x-liftgate-experiment", info.experiment.encode()))
        return out

    def _can_fallback(self, route: RouteConfig, d: Decision, variant: VariantConfig) -> bool:
        exp = route.experiment
        return (
            exp.fallback_to_control
            and d.attributed
            and not variant.is_control
            and exp.mode in _FALLBACK_MODES
        )

    def _record_failed_attempt(
        self, info: CallInfo, variant: VariantConfig, res: CallResult, t0: float, prompt: str | None
    ) -> None:
        status = res.status or (504 if res.error_type == "timeout" else 502)
        self.recorder.record(
            info,
            variant.name,
            variant.model,
            variant.upstream,
            res,
            status,
            perf_counter() - t0,
            role="attempt",
            prompt=prompt,
        )
        self.metrics.fallbacks.labels(info.route, info.experiment or "", variant.name).inc()

    def _record_served(
        self,
        info: CallInfo,
        d: Decision,
        variant: VariantConfig,
        res: CallResult,
        status: int,
        latency: float,
        fallback_from: str | None,
        prompt: str | None,
    ) -> None:
        """The request's one primary event: attributed to the assigned arm (intention to
        treat), also after a fallback, with the model/upstream that actually answered."""
        self.recorder.record(
            info,
            d.variant.name,
            variant.model,
            variant.upstream,
            res,
            status,
            latency,
            fallback_from=fallback_from,
            prompt=prompt,
        )
        if info.judge_question is not None and self.judge is not None:
            job = job_for(info, d.variant.name, res, "primary")
            if job is not None:
                self.judge.offer(job)
        # Hashed n-grams of a sample of responses (content logging ``hashed`` only).
        if info.content_logging == "hashed" and self.ngrams is not None and self.rng() < self.ngrams.rate:
            gram_job = ngram_job_for(info, d.variant.name, res)
            if gram_job is not None:
                self.ngrams.offer(gram_job)

    async def _json(
        self,
        scope: Scope,
        send: Send,
        info: CallInfo,
        route: RouteConfig,
        d: Decision,
        req: dict[str, Any],
        t0: float,
        prompt: str | None,
    ) -> None:
        variant = d.variant
        req["model"] = variant.model
        res = await self._call_json(variant, info.endpoint, orjson.dumps(req))
        fallback_from = None
        if res.failed_before_response and self._can_fallback(route, d, variant):
            self._record_failed_attempt(info, variant, res, t0, prompt)
            fallback_from, variant = variant.name, route.control
            req["model"] = variant.model
            res = await self._call_json(variant, info.endpoint, orjson.dumps(req))
        latency = perf_counter() - t0
        if res.error_type is None:
            status, body = res.status, res.body
        else:
            status, body = error_for(res, variant.upstream)
        if status == 200 and route.experiment.echo_model:
            body = model_echo(info.route).first(body, variant.model)
        headers = self._headers(info, route, d.variant)
        # Head and body in one write, without the two ASGI messages (serving.protocol.respond).
        if not respond(scope, status, [_JSON, *headers], body):
            await send_json(send, status, body, headers)
        if res.error_type is None:
            summarize_json(res, info.endpoint, info.keep_text)
        self._record_served(info, d, variant, res, status, latency, fallback_from, prompt)

    async def _call_json(self, variant: VariantConfig, endpoint: str, payload: bytes) -> CallResult:
        res = CallResult()
        client = self.pool.clients.get(variant.upstream)
        if client is None:
            res.error_type = "connect"
        else:
            await call_json(client, endpoint, payload, res)
        return res

    async def _open(
        self, variant: VariantConfig, endpoint: str, payload: bytes, res: CallResult
    ) -> StreamResponse | None:
        client = self.pool.clients.get(variant.upstream)
        if client is None:
            res.error_type = "connect"
            return None
        return await open_stream(client, endpoint, payload, res)

    async def _stream(
        self,
        scope: Scope,
        send: Send,
        receive: Receive,
        info: CallInfo,
        route: RouteConfig,
        d: Decision,
        req: dict[str, Any],
        keep_usage: bool,
        t0: float,
        prompt: str | None,
    ) -> None:
        variant = d.variant
        req["model"] = variant.model
        res = CallResult()
        resp = await self._open(variant, info.endpoint, orjson.dumps(req), res)
        fallback_from = None
        if resp is None and res.failed_before_response and self._can_fallback(route, d, variant):
            self._record_failed_attempt(info, variant, res, t0, prompt)
            fallback_from, variant = variant.name, route.control
            req["model"] = variant.model
            res = CallResult()
            resp = await self._open(variant, info.endpoint, orjson.dumps(req), res)
        headers = self._headers(info, route, d.variant)
        if resp is None:
            status, body = error_for(res, variant.upstream)
            await send_json(send, status, body, headers)
            self._record_served(info, d, variant, res, status, perf_counter() - t0, fallback_from, prompt)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [_SSE, _NO_CACHE, *headers]})
        echo = model_echo(info.route) if route.experiment.echo_model else None
        flt = SseFilter(res, info.endpoint == "chat", keep_usage, info.keep_text, t0, echo)
        # True once the client went away: then stop relaying and drop the upstream
        # connection, so vLLM aborts the generation instead of finishing it for nobody.
        # Asked of the connection (no task per stream) when the protocol is serving.protocol's.
        client_gone = disconnection(scope)
        waiter = None
        if client_gone is None:
            waiter = asyncio.ensure_future(receive())
            client_gone = waiter.done
        tail = b""
        try:
            async for chunk in resp.chunks():
                if client_gone():
                    res.finish_reason = "client_closed"
                    break
                out = flt.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            else:
                tail = flt.flush()
                if not res.done:
                    res.error_type = "stream"
                    tail += _mid_stream_error(res)
        except Exception as exc:  # upstream broke mid-stream: one error frame, then [DONE]
            kind = classify(exc)
            res.error_type = "timeout" if kind == "timeout" else "stream"
            tail = flt.flush() + _mid_stream_error(res)
        finally:
            resp.release()
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        if waiter is not None:
            waiter.cancel()
        self._record_served(info, d, variant, res, 200, perf_counter() - t0, fallback_from, prompt)

    def _mirror(self, info: CallInfo, route: RouteConfig, req: dict[str, Any], prompt: str | None) -> None:
        shadow = self.shadow
        assert shadow is not None
        rate = route.experiment.shadow_sample_rate
        for variant in route.shadows:
            if rate < 1.0 and self.rng() >= rate:
                continue
            if shadow.full():  # overflow: count and skip before doing any work for it
                shadow.count((info.route, info.experiment or "", variant.name), "dropped")
                continue
            req["model"] = variant.model
            shadow_info = CallInfo(
                request_id=request_id(),
                route=info.route,
                experiment_id=info.experiment_id,
                experiment=info.experiment,
                unit_id=info.unit_id,
                unit_source=info.unit_source,
                mode="shadow",
                endpoint=info.endpoint,
                stream=info.stream,
                tags=info.tags,
                conversation_id=info.conversation_id,
                content_logging=info.content_logging,
                category=info.category,
                judge_question=info.judge_question,
            )
            shadow.offer(ShadowJob(shadow_info, info.request_id, variant, orjson.dumps(req), prompt))
