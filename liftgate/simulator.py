"""An OpenAI-compatible model server that stands in for vLLM in tests, demos and benchmarks.

    python -m liftgate.simulator --port 8001 \\
        --model name=baseline,latency_ms=200,ttft_ms=40,tokens=120,quality=0.6 \\
        --model name=candidate,latency_ms=240,tokens=144,quality=0.65

Endpoints: ``POST /v1/chat/completions`` and ``/v1/completions`` (JSON, or SSE in vLLM's
chunk shape with an optional usage chunk), ``POST /v1/embeddings``, ``GET /v1/models``,
``GET /health``. Behaviour per model is described by :class:`SimulatorModel`. The server is
aiohttp on uvloop and does little per request, so it can carry benchmark traffic on a
small machine. On start it prints ``liftgate-simulator listening on http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import logging
import os
import re
import secrets
import signal
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import uvloop
from aiohttp import web

from liftgate.simulator_model import ModelBehaviour, SimulatorModel, count_prompt_tokens
from liftgate.simulator_stream import error_payload, stream_completion

__all__ = ["SimulatorModel", "build_app", "load_models", "main", "run", "serve"]

log = logging.getLogger(__name__)

BEHAVIOURS: web.AppKey[dict[str, ModelBehaviour]] = web.AppKey("behaviours", dict)
#: Quality of recent answers by their text, for simulated judges (bounded, oldest dropped).
ANSWERS: web.AppKey[OrderedDict[bytes, float]] = web.AppKey("answers", OrderedDict)
_ANSWERS_MAX = 200_000
_JUDGED = re.compile(r"Answer:\n(.*)\Z", re.S)
_ids = itertools.count(1)
_ID_PREFIX = secrets.token_hex(4)


def error_response(status: int, message: str, err_type: str, code: str | None = None) -> web.Response:
    body = error_payload(message, err_type, code or status)
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _headers(behaviour: ModelBehaviour, quality: float) -> dict[str, str]:
    return {"X-Sim-Quality": f"{quality:g}", "X-Sim-Model": behaviour.model.name}


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.strip().encode(), digest_size=12).digest()


def _remember(request: web.Request, text: str, quality: float) -> None:
    answers = request.app[ANSWERS]
    answers[_digest(text)] = quality
    if len(answers) > _ANSWERS_MAX:
        answers.popitem(last=False)


def _judged_answer(body: dict[str, Any]) -> str:
    """The answer a judge is asked to score: after "Answer:" in the last user message."""
    for message in reversed(body.get("messages") or ()):
        if (
            isinstance(message, dict)
            and message.get("role") == "user"
            and isinstance(message.get("content"), str)
        ):
            m = _JUDGED.search(message["content"])
            return m.group(1) if m else message["content"]
    return ""


async def _request_json(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"malformed JSON body: {exc}", "BadRequestError")
    if not isinstance(body, dict):
        return error_response(400, "request body must be a JSON object", "BadRequestError")
    return body


def _behaviour(request: web.Request, body: dict[str, Any]) -> ModelBehaviour | web.Response:
    behaviours = request.app[BEHAVIOURS]
    name = body.get("model")
    if name is None and len(behaviours) == 1:
        return next(iter(behaviours.values()))
    found = behaviours.get(name) if isinstance(name, str) else None
    if found is None:
        return error_response(404, f"The model `{name}` does not exist.", "NotFoundError", "model_not_found")
    return found


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _prompt_text(body: dict[str, Any], chat: bool) -> str:
    if not chat:
        prompt = body.get("prompt", "")
        return prompt if isinstance(prompt, str) else json.dumps(prompt)
    parts: list[str] = []
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


async def _completion(request: web.Request, chat: bool) -> web.StreamResponse:
    body = await _request_json(request)
    if isinstance(body, web.Response):
        return body
    behaviour = _behaviour(request, body)
    if isinstance(behaviour, web.Response):
        return behaviour
    model = behaviour.model
    if model.hang:
        await asyncio.sleep(model.hang_s)
        return error_response(504, "simulated hang ended", "TimeoutError")
    prompt = _prompt_text(body, chat)
    quality = behaviour.quality_for(prompt)
    if model.judge:
        answer_text = _judged_answer(body) if chat else prompt
        known = request.app[ANSWERS].get(_digest(answer_text))
        tokens, finish = [f"{behaviour.judge_score(answer_text, known):g}"], "stop"
    else:
        tokens, finish = behaviour.completion(prompt.encode(), _max_tokens(body))
        if (answer := behaviour.eval_answer(prompt, body.get("seed"))) is not None:
            tokens, finish = answer, "stop"
        else:
            tokens = behaviour.stuffed(tokens)
        _remember(request, "".join(tokens), quality)
    draw = behaviour.draw()
    usage = {
        "prompt_tokens": count_prompt_tokens(prompt),
        "completion_tokens": len(tokens),
        "total_tokens": count_prompt_tokens(prompt) + len(tokens),
    }
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{_ID_PREFIX}{next(_ids):x}"
    if body.get("stream"):
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return await stream_completion(
            request, behaviour, draw, rid, chat, tokens, finish, usage if include_usage else None, quality
        )
    if draw.error:
        await asyncio.sleep(draw.ttft_s)
        return error_response(500, "simulated upstream failure", "InternalServerError")
    await asyncio.sleep(draw.latency_s)
    text = "".join(tokens)
    choice: dict[str, Any]
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    payload = {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model.name,
        "choices": [choice],
        "usage": usage,
        "sim_quality": quality,
    }
    return web.Response(
        body=orjson.dumps(payload), content_type="application/json", headers=_headers(behaviour, quality)
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completion(request, chat=False)


def _embedding_inputs(raw: Any) -> list[bytes] | None:
    if isinstance(raw, str):
        return [raw.encode()]
    if isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        return [orjson.dumps(raw)]  # one pre-tokenised input
    if isinstance(raw, list) and raw and all(isinstance(x, (str, list)) for x in raw):
        return [x.encode() if isinstance(x, str) else orjson.dumps(x) for x in raw]
    return None


async def embeddings(request: web.Request) -> web.StreamResponse:
    body = await _request_json(request)
    if isinstance(body, web.Response):
        return body
    behaviour = _behaviour(request, body)
    if isinstance(behaviour, web.Response):
        return behaviour
    if behaviour.model.hang:
        await asyncio.sleep(behaviour.model.hang_s)
        return error_response(504, "simulated hang ended", "TimeoutError")
    inputs = _embedding_inputs(body.get("input"))
    if inputs is None:
        return error_response(400, "'input' must be a string or a list of strings/tokens", "BadRequestError")
    draw = behaviour.draw()
    await asyncio.sleep(draw.ttft_s)
    if draw.error:
        return error_response(500, "simulated upstream failure", "InternalServerError")
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, item in enumerate(inputs):
        vec = behaviour.embedding(item)
        encoded: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if as_base64 else vec
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    n_tokens = sum(count_prompt_tokens(item.decode(errors="replace")) for item in inputs)
    payload = {
        "id": f"embd-{_ID_PREFIX}{next(_ids):x}",
        "object": "list",
        "created": int(time.time()),
        "model": behaviour.model.name,
        "data": data,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens, "completion_tokens": 0},
    }
    return web.Response(
        body=orjson.dumps(payload),
        content_type="application/json",
        headers=_headers(behaviour, behaviour.model.quality),
    )


async def list_models(request: web.Request) -> web.StreamResponse:
    created = int(time.time())
    data = [
        {
            "id": b.model.name,
            "object": "model",
            "created": created,
            "owned_by": "liftgate-simulator",
            "root": b.model.name,
            "parent": None,
            "max_model_len": b.model.max_model_len,
            "sim_quality": b.model.quality,
        }
        for b in request.app[BEHAVIOURS].values()
    ]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")


async def health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


def build_app(models: Sequence[SimulatorModel]) -> web.Application:
    """The aiohttp application serving ``models`` (names must be unique)."""
    if not models:
        raise ValueError("the simulator needs at least one model")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate model names: {names}")
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[BEHAVIOURS] = {m.name: ModelBehaviour(m) for m in models}
    app[ANSWERS] = OrderedDict()
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    return app


async def serve(host: str, port: int, models: Sequence[SimulatorModel]) -> tuple[web.AppRunner, int]:
    """Start serving on the running loop; return the runner (``await runner.cleanup()``) and port."""
    # handler_cancellation: a client that gives up (e.g. a gateway timing out on a hanging
    # model) frees its handler instead of leaving it asleep for hang_s.
    runner = web.AppRunner(build_app(models), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or ()
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


def run(host: str, port: int, models: Sequence[SimulatorModel], *, announce: bool = True) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); blocking, on uvloop."""

    async def main() -> None:
        runner, bound = await serve(host, port, models)
        if announce:
            sys.stdout.write(f"liftgate-simulator listening on http://{host}:{bound}\n")
            sys.stdout.flush()
        log.info("simulator serving %s on %s:%s", [m.name for m in models], host, bound)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    uvloop.run(main())


def load_models(path: Path, seed: int | None = None) -> list[SimulatorModel]:
    """Models from a JSON or YAML file: a list of entries, or ``{"models": [...]}``."""
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    entries = data.get("models") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError(f"{path}: expected a list of models or {{'models': [...]}}")
    if seed is not None:
        entries = [{"seed": seed, **e} for e in entries]
    return [SimulatorModel.from_mapping(dict(e)) for e in entries]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m liftgate.simulator", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port (printed on start)")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="SPEC",
        help="name=NAME[,latency_ms=..,latency_sd=..,ttft_ms=..,ttft_sd=..,tokens=..,tokens_sd=..,"
        "error_rate=..,hang=true,quality=..,seed=..,chunk_tokens=..,skills=math:0.9/code:0.5]; "
        "repeat for several models",
    )
    parser.add_argument("--config", type=Path, help="JSON or YAML file with the models")
    parser.add_argument("--seed", type=int, help="default seed for models that set none")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("LIFTGATE_LOG_LEVEL", "WARNING"))
    models = load_models(args.config, args.seed) if args.config else []
    for spec in args.model:
        model = SimulatorModel.parse(
            spec if "seed=" in spec or args.seed is None else f"{spec},seed={args.seed}"
        )
        models.append(model)
    if not models:
        models = [SimulatorModel(name="baseline", seed=args.seed or 0)]
    run(args.host, args.port, models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
