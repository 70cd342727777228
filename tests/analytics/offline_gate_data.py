"""Real offline gate runs for the analytics API and dashboard tests: the demo suite against
the simulator (a candidate that forgot code), and a small dataset against a stub upstream
whose candidate answers with markup (``<script>``), each run by the real runner and decided
by the real gate into the test database."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine

from evals import gatekeeper, store
from evals.datasets import load_dataset
from evals.gate import OfflineGate
from evals.runner import RunnerSettings, run_experiment
from tests.evals.conftest import Arm, make_experiment

GATE: Final = {"suites": ["demo"], "margins": {"code": 0.05, "math": 0.05}, "default_margin": 0.05,
               "min_items": 20}  # fmt: skip
#: What the stub's "evil" model answers: markup that would run if a page used innerHTML.
MARKUP: Final = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> & "quotes"'
MARKUP_ITEMS: Final = 6


def run_and_gate(engine: Engine, name: str, dataset: Any, gate: dict[str, Any]) -> None:
    """Declare ``gate``, run ``dataset`` against every variant, decide (as the CLI would)."""
    with engine.begin() as conn:
        exp = store.experiment(conn, name)
        store.set_declaration(conn, exp.id, OfflineGate.model_validate(gate).model_dump(mode="json"), "test")
    settings = RunnerSettings(params=OfflineGate.model_validate(gate).params, concurrency=16)
    # In a thread of its own: Playwright's sync API keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        summaries = pool.submit(
            asyncio.run, run_experiment(engine, dataset, exp.targets, settings, experiment_id=exp.id)
        ).result(timeout=300)
    assert all(s.status == "completed" and not s.errors for s in summaries), summaries
    gatekeeper.evaluate(engine, name, None, "test")


def demo_gated(engine: Engine, simulator_url: str, name: str) -> str:
    """The demo suite: baseline ``base`` vs candidate ``cand`` (better at math, worse at code)."""
    make_experiment(engine, [Arm("baseline", "base", simulator_url, True), Arm("candidate", "cand", simulator_url)],
                    name=name)  # fmt: skip
    run_and_gate(engine, name, load_dataset("demo"), GATE)
    return name


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint: model "echo" repeats the prompt, "evil" answers
    with :data:`MARKUP`."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        prompt = body["messages"][-1]["content"]
        content = prompt if body.get("model") == "echo" else f"{MARKUP} The answer is nothing."
        reply = json.dumps({
            "id": "stub", "object": "chat.completion", "created": 0, "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def stub_upstream() -> Iterator[str]:
    """The stub on a free port of 127.0.0.1; yields its base URL (``…/v1``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, name="stub-upstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def markup_gated(engine: Engine, base_url: str, name: str, tmp: Path) -> str:
    """A few ``chat`` items the baseline passes by echoing and the candidate fails with markup."""
    path = tmp / f"{name}-markup.jsonl"
    path.write_text("".join(
        json.dumps({"id": f"m{i}", "category": "chat", "prompt": f"The answer is {i + 7}",
                    "scorer": {"type": "answer", "answer": str(i + 7), "mode": "numeric"}}) + "\n"
        for i in range(MARKUP_ITEMS)
    ))  # fmt: skip
    make_experiment(
        engine, [Arm("baseline", "echo", base_url, True), Arm("candidate", "evil", base_url)], name=name
    )
    run_and_gate(engine, name, load_dataset(str(path)), {"suites": [path.stem], "default_margin": 0.05})
    return name
