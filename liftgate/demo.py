"""The experiments ``liftgate up`` creates, through the control plane's admin API (idempotent).

* ``demo`` on route ``assistant``: baseline vs candidate, 50/50 — the simulator's known
  differences (verbosity, latency, quality) should show up as significant lifts; content
  logging ``full`` (simulated text), so its calls can be curated into datasets;
* ``demo-aa`` on route ``assistant-aa``: the baseline against an identical copy of itself
  (same upstream, same model) — an A/A test, which should show no significant difference.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from liftgate.admin_client import AdminClient, AdminError
from liftgate.interrupt import no_checkpoint

log = logging.getLogger(__name__)

DEMO_ROUTE = "assistant"
AA_ROUTE = "assistant-aa"
#: The offline gate's experiment: the demo's two models, never started. Its gate fails (the
#: candidate forgot code), and a failing gate pauses a running A/B test that shows the
#: candidate (control.gates), so the gate gets an experiment of its own and ``demo`` keeps
#: its users for the online side of the story.
GATE_EXPERIMENT = "demo-gate"
GATE_ROUTE = "assistant-gate"


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    base_url: str
    model: str
    api_key: str | None = None


def demo_experiments(control: Upstream, candidate: Upstream) -> list[dict[str, Any]]:
    return [
        {
            "name": "demo",
            "route": DEMO_ROUTE,
            "mode": "ab",
            "description": "liftgate up demo: baseline vs candidate (20% more verbose, slower, better liked)",
            # Simulated prompts only: the demo keeps their text, so its thumbs-down answers can
            # become a dataset (`liftgate datasets create ... --from-experiment demo`).
            "content_logging": "full",
            # The simulated users tag each call with its task: the report and dashboard break
            # results down by it (and by rollout stage, always).
            "segment_tags": ["task"],
            "variants": [
                {"name": "baseline", "upstream": control.name, "model": control.model, "weight": 50, "is_control": True},
                {"name": "candidate", "upstream": candidate.name, "model": candidate.model, "weight": 50},
            ],
        },
        {
            "name": "demo-aa",
            "route": AA_ROUTE,
            "mode": "ab",
            "description": "liftgate up demo: A/A test (the baseline against an identical copy)",
            "segment_tags": ["task"],
            "variants": [
                {"name": "baseline", "upstream": control.name, "model": control.model, "weight": 50, "is_control": True},
                {"name": "baseline-copy", "upstream": control.name, "model": control.model, "weight": 50},
            ],
        },
    ]  # fmt: skip


def gate_experiment(control: Upstream, candidate: Upstream) -> dict[str, Any]:
    return {
        "name": GATE_EXPERIMENT,
        "route": GATE_ROUTE,
        "mode": "ab",
        "description": "liftgate up demo: the offline gate of the demo's candidate (a draft: a candidate "
        "that fails its gate gets no users)",
        "variants": [
            {"name": "baseline", "upstream": control.name, "model": control.model, "weight": 50, "is_control": True},
            {"name": "candidate", "upstream": candidate.name, "model": candidate.model, "weight": 50},
        ],
    }  # fmt: skip


def ensure_upstreams(client: AdminClient, upstreams: list[dict[str, Any]]) -> None:
    known = {u.get("name") for u in client.upstreams()}
    for spec in upstreams:
        if spec["name"] in known:
            continue
        client.create_upstream(spec)
        log.info("created upstream %s", spec["name"])


def ensure_experiments(
    client: AdminClient, experiments: list[dict[str, Any]], *, start: bool = True
) -> list[str]:
    """Create missing experiments and (``start``) start the ones in draft or paused; returns
    their routes. With ``start=False`` they are left as they are (a new one stays a draft)."""
    existing = {e.get("name"): e for e in client.experiments()}
    for spec in experiments:
        current = existing.get(spec["name"])
        if current is None:
            current = client.create_experiment(spec)
            log.info("created experiment %s on route %s", spec["name"], spec["route"])
        if start and current.get("status") in ("draft", "paused"):
            try:
                client.action(spec["name"], "start")
            except AdminError as exc:
                # e.g. another experiment already runs on this route: keep going, say why.
                log.warning("could not start experiment %s: %s", spec["name"], exc)
    return [str(e["route"]) for e in experiments]


def seed(client: AdminClient, upstreams: list[Upstream]) -> list[str]:
    """The demo experiments over the first two upstreams (one upstream: A/A only)."""
    ensure_upstreams(
        client,
        [
            {"name": u.name, "base_url": u.base_url, **({"api_key": u.api_key} if u.api_key else {})}
            for u in upstreams
        ],
    )
    control = upstreams[0]
    experiments = demo_experiments(control, upstreams[1] if len(upstreams) > 1 else control)
    if len(upstreams) < 2:
        experiments = experiments[1:]
    else:
        ensure_experiments(client, [gate_experiment(control, upstreams[1])], start=False)
    return ensure_experiments(client, experiments)


def served_model(base_url: str, default: str, timeout_s: float = 5.0) -> str:
    """The first model an OpenAI-compatible server lists at ``/v1/models`` (vLLM serves one),
    else ``default`` — the simulator names its model after the upstream."""
    url = base_url.rstrip("/")
    url = (url if url.endswith("/v1") else url + "/v1") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            data = json.load(resp)
        models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
    except (OSError, ValueError, AttributeError):
        return default
    if default in models:
        return default
    return str(models[0]) if models and models[0] else default


def wait_for_routes(
    gateway: AdminClient,
    routes: list[str],
    timeout_s: float = 15.0,
    checkpoint: Callable[[], None] = no_checkpoint,
) -> bool:
    """Poll the gateway's ``/v1/models`` until it serves every route (config refresh < 1 s);
    ``checkpoint`` is called on every round (``liftgate up``: raises on a stop signal)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        checkpoint()
        try:
            data = gateway.request("GET", "/v1/models")
        except AdminError:
            data = None
        names = {m.get("id") for m in (data or {}).get("data", [])} if isinstance(data, dict) else set()
        if set(routes) <= names:
            return True
        time.sleep(0.2)
    return False
