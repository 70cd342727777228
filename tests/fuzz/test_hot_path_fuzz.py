"""The gateway's hot path fuzzed with hand-written Hypothesis strategies (``strategies``):
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/feedback`` on a
real gateway (uvicorn, client keys required) in front of the real simulator, over an A/B
route that logs content, a shadow route and a route whose candidate always fails and falls
back to the control. No answer may be ≥ 500 or late, and every event the gateway emits
must be one the consumer accepts (``contracts.events.decode``): an accepted request that
becomes a dead letter at ingest is a failure too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from contracts.events import DecodeError, Event, decode, encode
from gateway.routing import key_hash
from gateway.snapshot import UpstreamConfig, VariantConfig
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.fuzz.driver import Shard, Target, run, run_seed, scale
from tests.gateway.conftest import MemorySink, experiment, post, start_gateway, static_source
from tests.known_secrets import secret

CLIENT_KEY = secret("lg-fuzz-client")
#: Cases this test must send (with ``test_gateway_openapi_fuzz``'s 11,000: the gateway's ≥ 20,000).
MIN_CASES = 9_000
ROUTES = ["fz-ab", "fz-shadow", "fz-fallback"]


class CheckingSink(MemorySink):
    """Keeps no event, but encodes each one and decodes it as the consumer would."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.poisoned: list[str] = []
        self.lock = threading.Lock()

    def emit(self, event: Event) -> None:
        try:
            decode(encode(event))
        except DecodeError as exc:
            with self.lock:
                self.poisoned.append(f"{exc}: {event!r:.500}")
        with self.lock:
            self.count += 1


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, CheckingSink]]:
    fast: dict[str, Any] = {"latency_ms": 2.0, "latency_sd": 0.5, "ttft_ms": 1.0, "ttft_sd": 0.2,
                            "tokens": 8.0, "tokens_sd": 2.0}  # fmt: skip
    models = [SimulatorModel("base", **fast), SimulatorModel("cand", **fast),
              SimulatorModel("broken", error_rate=1.0, midstream_error_share=0.0, **fast)]  # fmt: skip
    with SimulatorProcess(models) as sim:
        ups = [UpstreamConfig("sim", sim.url + "/v1")]
        control = VariantConfig("control", "sim", "base", 1, True)
        exps = [
            experiment("fz-ab", [control, VariantConfig("cand", "sim", "cand", 1)], content_logging="full"),
            experiment("fz-shadow", [control, VariantConfig("mirror", "sim", "cand")], mode="shadow", exp_id=2),
            experiment("fz-fallback", [control, VariantConfig("bad", "sim", "broken", 1)],
                       fallback_to_control=True, exp_id=3),
        ]  # fmt: skip
        source = static_source(exps, ups, keys=frozenset({key_hash(CLIENT_KEY)}))
        sink = CheckingSink()
        with start_gateway(sink, source, client_keys="required") as g:
            yield g.url, sink


def _request_ids(url: str, key: str) -> list[str]:
    """Responses that exist, for feedback to name."""
    ids = []
    for route in ROUTES:
        body = {"model": route, "messages": [{"role": "user", "content": "hello"}]}
        r = post(url + "/v1/chat/completions", body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-request-id"])
    return ids


@pytest.mark.slow
@pytest.mark.fuzz
@pytest.mark.timeout(900)  # a few minutes in CI; more on a busy machine
def test_the_hot_path_answers_every_generated_request_below_500_in_time_with_storable_events(
    gateway: tuple[str, CheckingSink],
) -> None:
    url, sink = gateway
    target = Target(
        {},
        url,
        {},
        extra={"models": ROUTES, "client_key": CLIENT_KEY, "request_ids": _request_ids(url, CLIENT_KEY)},
    )
    shards = [
        Shard("hot:chat", "positive", 4_500),
        Shard("hot:completions", "positive", 1_800),
        Shard("hot:embeddings", "positive", 1_500),
        Shard("hot:feedback", "positive", 2_200),
    ]
    seed = run_seed()
    score, elapsed = run(target, shards, seed)
    summary = score.summary("gateway (hot path)", seed, elapsed) + f"; {sink.count} events"
    print(summary)
    assert score.failed == 0, summary + "\n" + "\n".join(score.failures)
    assert sink.poisoned == [], summary + "\n" + "\n".join(sink.poisoned[:10])
    assert score.cases >= MIN_CASES * scale(), summary
    assert score.statuses[200] + score.statuses[202] > score.cases // 10, (
        summary
    )  # the fuzz got past the checks
