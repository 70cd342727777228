"""The hashed n-gram sampler: hashes of a sample of responses of ``hashed`` experiments only,
never their text; a bounded queue whose drops are counted; a weak key stops the gateway."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
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
        accepted = [sampler.offer(_job(i)) for i in range(4)]  # no worker yet: the queue fills
        accepted.append(sampler.offer(_job(9, "x" * 200)))
        sampler.start()
        await asyncio.wait_for(sampler.join(), 10)
        accepted.append(sampler.offer(_job(10, "x" * 90)))  # room again
        accepted.append(sampler.offer(_job(11, "x" * 20)))  # over the characters
        await asyncio.wait_for(sampler.join(), 10)
        await sampler.close()
        return accepted

    assert asyncio.run(run()) == [True, True, False, False, False, True, False]
    counts = {
        s.labels["outcome"]: s.value for s in metrics.ngrams.collect()[0].samples if s.name.endswith("_total")
    }
    assert counts == {"queued": 3.0, "dropped": 4.0, "hashed": 3.0}
    assert sampler.held_bytes == 0 and len(_grams(sink)) == 3


def test_a_weak_key_stops_the_gateway_at_start_and_no_key_hashes_nothing() -> None:
    from gateway.app import create_app

    with pytest.raises(ValueError, match="at least 16 bytes"):
        create_app(settings(ngram_key="too-short"), MemorySink(), config_source=static_source([], []))
    app = create_app(settings(), MemorySink(), config_source=static_source([], []))
    assert app is not None  # no key: the sampler is off


def _long_answer() -> str:
    """English-like text past the 4,000-character cut: the longest job the sampler gets."""
    rng = random.Random(7)
    vocab = ["".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 9))) for _ in range(2000)]
    return "Great question! " + " ".join(rng.choice(vocab) for _ in range(1500))


def _hash_while_probing(text: str) -> tuple[int, float, list[NgramsEvent]]:
    """Hash one answer through a started sampler while a probe task yields to the loop in a
    loop: how many times the probe ran while the job was in progress, and its longest wait."""
    metrics = GatewayMetrics(CollectorRegistry())
    sink = MemorySink()
    sampler = NgramSampler(NgramConfig(KEY, 1.0), Recorder(sink, metrics), metrics)

    async def run() -> tuple[int, float]:
        sampler.start()
        await asyncio.sleep(0)  # the worker waits on the queue
        assert sampler.offer(_job(1, text))
        ticks, longest = 0, 0.0
        deadline = time.perf_counter() + 10
        while not _grams(sink) and time.perf_counter() < deadline:
            t = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - t)
            ticks += 1
        await sampler.close()
        return ticks, longest

    ticks, longest = asyncio.run(run())
    return ticks, longest, _grams(sink)


def test_hashing_a_long_answer_leaves_the_event_loop_to_other_requests_between_small_steps() -> None:
    """Hashing a 4,000-character answer costs ~2 ms of CPU: run in one loop step, it would
    stall every request on the gateway's loop for that long. It runs in many short steps."""
    text = _long_answer()
    ticks, _, events = _hash_while_probing(text)
    assert [e.grams for e in events] == [KEY.hashes(text)]  # the same hashes as in one go
    assert ticks >= 10, ticks  # the probe ran again and again while the job was in progress
    # Generous timing check: the longest stall is far below the hashing's CPU time in one go.
    # Minima over repeats, so that a descheduled process on a loaded machine does not count.
    whole = min(_cpu_of(lambda: KEY.hashes(text)) for _ in range(5))
    stall = min(_hash_while_probing(text)[1] for _ in range(5))
    assert stall < whole / 4, (stall, whole)


TRICKY = [
    "",
    "   ",
    "x" * 5000,  # one word past the cut, no space anywhere
    "Mail ALICE@example.com, call 555 1234 or 5551234!  Don’t   PANIC\tnow\nΣΊΣΥΦΟΣ ΟΔΟΣ end",
    " leading and trailing spaces ",
    "a b " * 1500,  # past the cut, one space apart
]


@pytest.mark.parametrize("chars", [1, 7, 50, 1500])
@pytest.mark.parametrize("step", [1, 2, 3, 128])
def test_hashing_in_steps_gives_the_same_hashes_as_in_one_go(chars: int, step: int) -> None:
    from gateway.ngrams import hashes

    rng = random.Random(chars * 1000 + step)
    alphabet = "ab cd\tΣσς’'@.0123456789 x-_é"
    texts = [*TRICKY, _long_answer()]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(30)]
    for text in texts:
        assert asyncio.run(hashes(KEY, text, chars, step, step)) == KEY.hashes(text), text[:80]


class _Colliding(NgramKey):
    """Hashes of only 8 values: distinct grams collide (a 64-bit collision, made likely)."""

    def digests(self, grams: Iterable[str]) -> set[int]:
        return {h % 8 for h in super().digests(grams)}


def test_a_hash_collision_across_steps_is_kept_once_and_in_order() -> None:
    from gateway.ngrams import hashes

    key = _Colliding(SECRET)
    text = _long_answer()
    assert asyncio.run(hashes(key, text, 100, 5, 5)) == list(range(8)) == key.hashes(text)


class _Exploding(NgramKey):
    """Fails on a text containing "boom", quoting it in the exception (as a codec error might)."""

    def digests(self, grams: Iterable[str]) -> set[int]:
        todo = list(grams)
        if "boom" in todo:
            raise ValueError(f"cannot hash {todo}")
        return super().digests(todo)


def test_a_job_that_fails_is_counted_and_logged_by_request_id_never_with_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    sink = MemorySink()
    sampler = NgramSampler(NgramConfig(_Exploding(SECRET), 1.0), Recorder(sink, metrics), metrics)

    async def run() -> None:
        sampler.start()
        assert sampler.offer(_job(1, "secret boom words")) and sampler.offer(_job(2, "fine words"))
        await asyncio.wait_for(sampler.join(), 10)
        await sampler.close()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(run())
    assert [e.request_id for e in _grams(sink)] == ["r2"]  # the worker went on
    counts = {
        s.labels["outcome"]: s.value for s in metrics.ngrams.collect()[0].samples if s.name.endswith("_total")
    }
    assert counts == {"queued": 2.0, "hashed": 1.0, "failed": 1.0}
    assert "r1" in caplog.text and "secret" not in caplog.text and "boom" not in caplog.text


def _cpu_of(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
