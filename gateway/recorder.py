"""Turns finished calls into events (handed to the sink) and metric observations.

Content logging per experiment: ``none`` (default), ``hashed`` (a keyed digest of the redacted
text, :meth:`contracts.ngrams.NgramKey.digest`: lets analytics count identical prompts without
storing them, and nobody holding only the events can test a guessed text against it; a sample of
responses also gets its keyed n-gram hashes, :mod:`gateway.ngrams`) or ``full`` (text after the
redaction hook, by default e-mail addresses and digit runs replaced). Without the deployment's
key (``LIFTGATE_NGRAM_KEY``) ``hashed`` stores nothing: never an unkeyed digest.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from time import time
from typing import Any

from contracts.content import redact_content
from contracts.events import InteractionEvent, JudgeEvent, NgramsEvent
from contracts.ids import uuid7
from contracts.ngrams import NgramKey
from gateway.relay import CallResult
from gateway.sink import EventSink
from gateway.telemetry import GatewayMetrics

log = logging.getLogger(__name__)

# The order in which Recorder.record passes InteractionEvent's fields.
_EVENT_FIELDS = (
    "request_id", "route", "unit_id", "unit_source", "role", "mode", "endpoint", "model", "upstream",
    "status", "http_status", "latency_ms", "experiment_id", "experiment", "variant", "pair_id",
    "error_type", "ttft_ms", "prompt_tokens", "completion_tokens", "response_chars", "finish_reason",
    "stream", "fallback", "fallback_from", "conversation_id", "tags", "prompt", "response", "category",
    "event_id", "ts",
)  # fmt: skip
if tuple(f.name for f in fields(InteractionEvent))[: len(_EVENT_FIELDS)] != _EVENT_FIELDS:
    raise ImportError("InteractionEvent's fields changed order: update Recorder.record")

#: The default redaction hook (shared with curation, which re-applies it to dataset items).
default_redact = redact_content


def prompt_text(request: dict[str, Any], endpoint: str) -> str:
    if endpoint == "chat":
        parts = []
        for msg in request.get("messages") or ():
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return "\n".join(parts)
    prompt = request.get("prompt" if endpoint == "completions" else "input")
    return prompt if isinstance(prompt, str) else str(prompt)


@dataclass(slots=True)
class CallInfo:
    """Everything known about one request besides the upstream's answer."""

    request_id: str
    route: str
    experiment_id: int | None
    experiment: str | None
    unit_id: str
    unit_source: str
    mode: str
    endpoint: str
    stream: bool
    tags: dict[str, str]
    conversation_id: str | None
    content_logging: str
    category: str | None = None
    # Set when the judge sampler picked this request: the user's text for the judge (the
    # response text is then kept in memory until the judge job is queued, never logged).
    judge_question: str | None = None
    # The client asked to see its arm (``X-Liftgate-Show-Variant: true``); see blinding.
    show_variant: bool = False

    @property
    def keep_text(self) -> bool:
        return self.content_logging != "none" or self.judge_question is not None


class Recorder:
    def __init__(
        self,
        sink: EventSink,
        metrics: GatewayMetrics,
        memory: int = 100_000,
        redact: Callable[[str], str] = default_redact,
        content_key: NgramKey | None = None,
    ) -> None:
        self.sink = sink
        self.metrics = metrics
        self.redact = redact
        self.content_key = content_key
        self._unkeyed_warned = False
        self.memory = memory
        # request_id -> (unit_id, experiment_id, variant): lets /v1/feedback fill attribution.
        self.recent: OrderedDict[str, tuple[str, int | None, str | None]] = OrderedDict()

    def _content(self, text: str | None, policy: str) -> str | None:
        if text is None or policy == "none":
            return None
        if policy == "hashed":
            key = self.content_key
            if key is None:
                if not self._unkeyed_warned:
                    self._unkeyed_warned = True
                    log.warning(
                        "content_logging 'hashed' without LIFTGATE_NGRAM_KEY: no digest is stored"
                        " (an unkeyed hash of a prompt can be matched against guesses)"
                    )
                return None
            return key.digest(self.redact(text))
        text = self.redact(text)
        # Stored as text, which PostgreSQL cannot hold with a NUL in it (orjson, which parsed
        # the request and the answer, already refuses lone surrogates).
        return text.replace("\x00", "\ufffd") if "\x00" in text else text

    def record(
        self,
        info: CallInfo,
        variant: str,
        model: str,
        upstream: str,
        res: CallResult,
        http_status: int,
        latency: float,
        role: str = "primary",
        pair_id: str | None = None,
        fallback_from: str | None = None,
        prompt: str | None = None,
    ) -> None:
        ok = res.error_type is None and http_status < 400
        exp_label = info.experiment or ""
        ch = self.metrics.children(info.route, exp_label, variant, role)
        ch.count(
            "2xx" if ok else ("4xx" if 400 <= http_status < 500 else "5xx"),
            res.prompt_tokens,
            res.completion_tokens,
        )
        ch.duration.observe(latency)
        if res.ttft is not None:
            ch.ttft.observe(res.ttft)
        if res.error_type is not None:
            self.metrics.upstream_errors.labels(info.route, exp_label, variant, res.error_type).inc()
        policy = info.content_logging
        prompt_stored = response_stored = None
        if policy != "none":
            prompt_stored = self._content(prompt, policy)
            response_stored = self._content("".join(res.texts or ()), policy)
        ttft = res.ttft
        # Positional, in the field order of InteractionEvent (_EVENT_FIELDS, checked at import): a
        # call with thirty keywords spends a visible share of its time matching their names.
        event = InteractionEvent(
            info.request_id,
            info.route,
            info.unit_id,
            info.unit_source,  # type: ignore[arg-type]
            role,  # type: ignore[arg-type]
            info.mode,  # type: ignore[arg-type]
            info.endpoint,  # type: ignore[arg-type]
            model,
            upstream,
            "ok" if ok else "error",
            http_status,
            latency * 1000.0,
            info.experiment_id,
            info.experiment,
            variant,
            pair_id,
            res.error_type,
            ttft * 1000.0 if ttft is not None else None,
            res.prompt_tokens,
            res.completion_tokens,
            res.chars,
            res.finish_reason,
            info.stream,
            fallback_from is not None,
            fallback_from,
            info.conversation_id,
            info.tags,
            prompt_stored,
            response_stored,
            info.category,
            uuid7(),
            time(),
        )
        self.emit(event)
        # Failed calls too: a thumbs-down on an error is feedback about a call this gateway served.
        if role == "primary" and self.memory:
            recent = self.recent
            recent[info.request_id] = (
                info.unit_id,
                info.experiment_id,
                variant if info.experiment_id else None,
            )
            if len(recent) > self.memory:
                recent.popitem(last=False)

    def emit(self, event: Any) -> None:
        try:
            self.sink.emit(event)
        except Exception:  # the sink must never fail a request; count and move on
            log.exception("event sink raised on emit; event dropped")
            return
        if isinstance(event, InteractionEvent):
            self.metrics.count_interaction()
        elif isinstance(event, JudgeEvent):
            self.metrics.judge_events.inc()
        elif isinstance(event, NgramsEvent):
            self.metrics.ngrams_events.inc()
        else:
            self.metrics.feedback_events.inc()
