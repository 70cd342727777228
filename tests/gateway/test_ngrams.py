"""The hashed n-gram sampler: hashes of a sample of responses of ``hashed`` experiments only,
never their text; a bounded queue whose drops are counted; a weak key stops the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from contracts.events import InteractionEvent, NgramsEvent, encode, ngrams_event_id
from contracts.ngrams import NgramKey
from gateway.ngrams import NgramConfig, NgramJob, NgramSampler
from gateway.recorder import Recorder
from gateway.snapshot import UpstreamConfig, VariantConfig
from gateway.telemetry import GatewayMetrics
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.gateway.conftest import MemorySink, experiment, post, settings, start_gateway, static_source
from tests.known_secrets import secret

SECRET = secret("ngram-key")
KEY = NgramKey(SECRET)
FAST: dict[str, Any] = {"latency_ms": 3.0, "latency_sd": 0.5, "ttft_ms": 1.0, "ttft_sd": 0.2, "tokens": 30.0}


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    models = [SimulatorModel("base", **FAST), SimulatorModel("hack", stuff_phrase="Great question!", **FAST)]
    with SimulatorProcess(models) as s:
        yield s.url + "/v1"


def _run(
    sim: str, logging: str, rate: float, calls: int, stream: bool = False
) -> tuple[MemorySink, list[str]]:
    sink = MemorySink()
    variants = [VariantConfig("control", "sim", "base", 50, True), VariantConfig("cand", "sim", "hack", 50)]
    exp = experiment("assistant", variants, content_logging=logging)
    source = static_source([exp], [UpstreamConfig("sim", sim, timeout_s=10.0)])
    answers = []
    with start_gateway(sink, source, ngram_key=SECRET, ngram_sample_rate=rate) as g:
        for i in range(calls):
            body = {"model": "assistant", "user": f"u{i}", "messages": [{"role": "user", "content": "hi"}]}
            if stream:
                body["stream"] = True
            r = post(g.url + "/v1/chat/completions", body)
            assert r.status_code == 200
            if not stream:
                answers.append(orjson.loads(r.content)["choices"][0]["message"]["content"])
    return sink, answers  # the gateway's shutdown hashed what its sampler had queued


def _grams(sink: MemorySink) -> list[NgramsEvent]:
    return [e for e in sink.events if isinstance(e, NgramsEvent)]


def test_a_hashed_experiment_ships_the_keyed_hashes_of_each_answer_and_never_its_text(sim: str) -> None:
    sink, answers = _run(sim, "hashed", 1.0, 20)
    grams = {e.request_id: e for e in _grams(sink)}
    calls = {e.request_id: e for e in sink.events if isinstance(e, InteractionEvent)}
    assert grams.keys() == calls.keys() and len(grams) == 20
    by_text = {tuple(KEY.hashes(a)) for a in answers}
    for rid, e in grams.items():
        call = calls[rid]
        assert (e.unit_id, e.variant, e.category, e.experiment_id) == (
            call.unit_id, call.variant, call.category, call.experiment_id,
        )  # fmt: skip
        assert e.key_id == KEY.key_id and e.event_id == ngrams_event_id(rid) and e.role == "primary"
        assert tuple(e.grams) in by_text
        if call.variant == "cand":
            assert KEY.hash("great question") in e.grams
    for e in sink.events:
        blob = encode(e).decode().lower()
        assert "great question" not in blob and all(a[:30].lower() not in blob for a in answers)


def test_streamed_answers_are_hashed_too(sim: str) -> None:
    sink, _ = _run(sim, "hashed", 1.0, 6, stream=True)
    assert len(_grams(sink)) == 6


@pytest.mark.parametrize("logging", ["none", "full"])
def test_other_content_logging_modes_hash_nothing(sim: str, logging: str) -> None:
    sink, _ = _run(sim, logging, 1.0, 6)
    assert _grams(sink) == [] and len(sink.events) == 6


def test_a_share_of_responses_is_sampled(sim: str) -> None:
    """Rate 0.2 over 200 calls: 40 expected, sd 5.7; the bounds are 4 sd away."""
    sink, _ = _run(sim, "hashed", 0.2, 200)
    assert 17 <= len(_grams(sink)) <= 63


def _job(i: int, text: str = "some answer text") -> NgramJob:
    return NgramJob(f"r{i}", "u", 1, "exp", "route", "cand", None, text)


def test_the_queue_is_bounded_by_count_and_by_characters_and_drops_are_counted() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    sink = MemorySink()
    sampler = NgramSampler(
        NgramConfig(KEY, 1.0, queue_size=2, queue_chars=100), Recorder(sink, metrics), metrics
    )

    async def run() -> list[bool]:
        accepted = [sampler.submit(_job(i)) for i in range(4)]  # no worker yet: the queue fills
        accepted.append(sampler.submit(_job(9, "x" * 200)))
        sampler.start()
        await asyncio.wait_for(sampler.queue.join(), 10)
        accepted.append(sampler.submit(_job(10, "x" * 90)))  # room again
        accepted.append(sampler.submit(_job(11, "x" * 20)))  # over the characters
        await asyncio.wait_for(sampler.queue.join(), 10)
        await sampler.close()
        return accepted

    assert asyncio.run(run()) == [True, True, False, False, False, True, False]
    counts = {
        s.labels["outcome"]: s.value for s in metrics.ngrams.collect()[0].samples if s.name.endswith("_total")
    }
    assert counts == {"queued": 3.0, "dropped": 4.0, "hashed": 3.0}
    assert sampler.held_chars == 0 and len(_grams(sink)) == 3


def test_a_weak_key_stops_the_gateway_at_start_and_no_key_hashes_nothing() -> None:
    from gateway.app import create_app

    with pytest.raises(ValueError, match="at least 16 bytes"):
        create_app(settings(ngram_key="too-short"), MemorySink(), config_source=static_source([], []))
    app = create_app(settings(), MemorySink(), config_source=static_source([], []))
    assert app is not None  # no key: the sampler is off
