"""Calling an upstream: one JSON call, or an SSE stream relayed event by event.

The gateway measures latency and time to first token itself and takes token usage from the
upstream. For streams it always asks for ``stream_options.include_usage`` and, when the
client did not ask for it, drops the usage-only chunk (``"choices": []``) before relaying.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import orjson

from gateway.blinding import ModelEcho
from gateway.http_client import StreamResponse, UpstreamError
from gateway.upstreams import UpstreamClient

_SEP = b"\n\n"
_MAX_PENDING = 1 << 20


@dataclass(slots=True)
class CallResult:
    """Outcome of one upstream call, filled as the response is read or relayed."""

    status: int = 0  # HTTP status the upstream answered (0: none)
    error_type: str | None = None  # connect | timeout | http_4xx | http_5xx | stream | protocol
    body: bytes = b""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    chars: int = 0
    ttft: float | None = None
    texts: list[str] | None = None  # collected only when content logging needs the text
    done: bool = False

    @property
    def failed_before_response(self) -> bool:
        """A failure eligible for fallback: nothing reached the client yet."""
        return self.error_type in ("connect", "timeout", "http_5xx")


def classify(exc: BaseException) -> str:
    if isinstance(exc, UpstreamError):
        return exc.kind
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    return "protocol"


_MAX_COUNT = 2**31 - 1  # token counts are stored as 32-bit integers
_MAX_FINISH_REASON = 32


def _count(value: Any) -> int | None:
    return value if value.__class__ is int and 0 <= value <= _MAX_COUNT else None


def _finish_reason(value: Any) -> str | None:
    """An upstream's finish reason, if it is a short printable word (it becomes an event field)."""
    if isinstance(value, str) and value and len(value) <= _MAX_FINISH_REASON and value.isprintable():
        return value
    return None


def _usage(res: CallResult, usage: Any) -> None:
    if isinstance(usage, dict):
        res.prompt_tokens = _count(usage.get("prompt_tokens"))
        res.completion_tokens = _count(usage.get("completion_tokens"))


def summarize_json(res: CallResult, endpoint: str, keep_text: bool) -> None:
    """Usage, finish reason and response length of a JSON response (failures are ignored)."""
    try:
        obj = orjson.loads(res.body)
    except orjson.JSONDecodeError:
        return
    if not isinstance(obj, dict):
        return
    _usage(res, obj.get("usage"))
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if endpoint == "chat":
            msg = choice.get("message")
            text = msg.get("content") if isinstance(msg, dict) else None
        else:
            text = choice.get("text")
        if isinstance(text, str):
            res.chars += len(text)
            if keep_text:
                if res.texts is None:
                    res.texts = []
                res.texts.append(text)
        if res.finish_reason is None:
            res.finish_reason = _finish_reason(choice.get("finish_reason"))


async def call_json(client: UpstreamClient, endpoint: str, payload: bytes, res: CallResult) -> None:
    try:
        res.status, res.body = await client.http.post(
            client.heads[endpoint], payload, client.config.timeout_s
        )
    except UpstreamError as exc:
        res.error_type = exc.kind
        return
    if res.status >= 400:
        res.error_type = "http_5xx" if res.status >= 500 else "http_4xx"


async def open_stream(
    client: UpstreamClient, endpoint: str, payload: bytes, res: CallResult
) -> StreamResponse | None:
    """Start a streamed call; returns the open response when it answered 200 with a stream."""
    try:
        resp = await client.http.stream(client.heads[endpoint], payload, client.config.timeout_s)
    except UpstreamError as exc:
        res.error_type = exc.kind
        return None
    res.status = resp.status
    if resp.status == 200:
        return resp
    try:
        res.body = await resp.read()
    except UpstreamError:
        res.body = b""
    finally:
        resp.release()
    res.error_type = "http_5xx" if resp.status >= 500 else "http_4xx"
    return None


@dataclass(slots=True)
class SseFilter:
    """Parses complete SSE events, records usage/TTFT/length, drops the usage chunk if asked,
    and (``echo``: blinding) sets each event's ``model`` to the route."""

    res: CallResult
    chat: bool
    keep_usage: bool
    keep_text: bool
    t0: float
    echo: ModelEcho | None = None
    buf: bytes = b""
    sep: bytes = _SEP  # switched to CRLF framing if the upstream uses it
    _parts: list[bytes] = field(default_factory=list)

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to relay now: every complete event in ``buf + chunk`` (possibly edited)."""
        data = self.buf + chunk if self.buf else chunk
        cut = data.rfind(self.sep)
        if cut < 0:
            if self.sep == _SEP and b"\r\n\r\n" in data:
                self.sep = b"\r\n\r\n"
                self.buf = b""
                return self.feed(data)
            if len(data) > _MAX_PENDING:  # no event boundary at all: relay as is, never buffer unboundedly
                self.buf = b""
                return data if self.echo is None else self.echo.every(data)
            self.buf = data
            return b""
        end = cut + len(self.sep)
        block, self.buf = data[:end], data[end:]
        return self._events(block)

    def flush(self) -> bytes:
        rest, self.buf = self.buf, b""
        return self._events(rest + self.sep) if rest.strip() else b""

    def _events(self, block: bytes) -> bytes:
        res = self.res
        edited = False
        kept: list[bytes] = self._parts
        kept.clear()
        sep = self.sep
        for ev in block.split(sep):
            if not ev:
                continue
            if ev.startswith(b"data:"):
                payload = ev[5:].strip()
                if payload == b"[DONE]":
                    res.done = True
                else:
                    out = self._record(ev, payload)
                    if out is not ev:
                        edited = True
                        if out is None:
                            continue
                        ev = out
            kept.append(ev)
        if not edited:
            return block
        return b"".join(ev + sep for ev in kept)

    def _record(self, ev: bytes, payload: bytes) -> bytes | None:
        """Record one data event; returns it (edited when its model must be blinded), or None
        when it is a usage-only chunk to drop."""
        res = self.res
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return ev if self.echo is None else self.echo.every(ev)
        if not isinstance(obj, dict):
            return ev if self.echo is None else self.echo.every(ev)
        echo = self.echo
        if echo is not None:
            model = obj.get("model")
            if model != echo.route:
                ev = echo.first(ev, model) if isinstance(model, str) else echo.every(ev)
        choices = obj.get("choices")
        usage = obj.get("usage")
        if "error" in obj and res.error_type is None:  # the upstream reported a mid-stream failure
            res.error_type = "stream"
        if usage:
            _usage(res, usage)
        if not choices:
            return ev if self.keep_usage or not usage or "error" in obj else None
        for choice in choices:
            if self.chat:
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else None
            else:
                text = choice.get("text")
            if text and isinstance(text, str):
                if res.ttft is None:
                    res.ttft = perf_counter() - self.t0
                res.chars += len(text)
                if self.keep_text:
                    if res.texts is None:
                        res.texts = []
                    res.texts.append(text)
            fr = choice.get("finish_reason")
            if fr:
                res.finish_reason = _finish_reason(fr) or res.finish_reason
        return ev
