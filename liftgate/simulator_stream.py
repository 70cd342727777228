"""Server-sent events in vLLM's chunk shape, paced by a simulated timeline.

The first content chunk goes out after the drawn time to first token; the remaining
chunks are spread over the rest of the drawn latency. Pacing is done in at most
``_MAX_PAUSES`` sleeps whatever the answer's length, because each timer costs the event
loop far more than writing a chunk, and benchmarks run the simulator at high rates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from aiohttp import web

from liftgate.simulator_model import Draw, ModelBehaviour

log = logging.getLogger(__name__)

_MAX_PAUSES = 16
_DONE = b"data: [DONE]\n\n"


def error_payload(message: str, err_type: str, code: int | str) -> dict[str, Any]:
    """OpenAI's error shape, as vLLM sends it (also as a mid-stream ``data:`` frame)."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def _frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _chunk(
    base: dict[str, Any], chat: bool, text: str | None, finish: str | None, role: bool = False
) -> bytes:
    choice: dict[str, Any]
    if chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    return _frame({**base, "choices": [choice]})


async def stream_completion(
    request: web.Request,
    behaviour: ModelBehaviour,
    draw: Draw,
    rid: str,
    chat: bool,
    tokens: list[str],
    finish: str,
    usage: dict[str, int] | None,
    quality: float | None = None,
) -> web.StreamResponse:
    """Stream ``tokens`` as SSE; fail mid-stream or up front when ``draw.error`` says so."""
    model = behaviour.model
    await asyncio.sleep(draw.ttft_s)
    if draw.error and not draw.midstream:
        body = error_payload("simulated upstream failure", "InternalServerError", 500)
        return web.Response(status=500, body=orjson.dumps(body), content_type="application/json")
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Sim-Quality": f"{model.quality if quality is None else quality:g}",
            "X-Sim-Model": model.name,
        }
    )
    await response.prepare(request)
    base = {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model.name,
        "sim_quality": model.quality if quality is None else quality,
    }
    size = model.chunk_tokens
    pieces = ["".join(tokens[i : i + size]) for i in range(0, len(tokens), size)]
    fail_at = len(pieces) // 2 if draw.error else -1
    pauses = min(_MAX_PAUSES, max(len(pieces) - 1, 0))
    pause_every = max(1, -(-(len(pieces) - 1) // pauses)) if pauses else 1
    points = (len(pieces) - 1) // pause_every
    pause_s = (draw.latency_s - draw.ttft_s) / points if points else 0.0
    started = time.monotonic()
    # Frames due at the same moment go out in one write: a write per frame would cost the
    # simulator more CPU than everything else it does for a streamed request.
    pending: list[bytes] = [_chunk(base, chat, "", None, role=True)] if chat else []
    try:
        for i, piece in enumerate(pieces):
            if i == fail_at:
                error = error_payload("simulated failure mid-stream", "InternalServerError", 500)
                pending += (_frame(error), _DONE)
                await response.write_eof(b"".join(pending))
                return response
            if i and i % pause_every == 0:
                # Sleep to the planned time, not for a fixed pause, so write costs don't add up.
                delay = started + pause_s * (i // pause_every) - time.monotonic()
                if delay > 0:
                    await response.write(b"".join(pending))
                    pending.clear()
                    await asyncio.sleep(delay)
            last = i == len(pieces) - 1
            pending.append(_chunk(base, chat, piece, finish if last else None))
        if usage is not None:
            pending.append(_frame({**base, "choices": [], "usage": usage}))
        pending.append(_DONE)
        await response.write_eof(b"".join(pending))
    except ConnectionResetError:
        log.debug("client went away during stream %s", rid)
    return response
