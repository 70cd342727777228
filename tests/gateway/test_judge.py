"""The judge sampler: scores as events, both sides of shadow pairs, isolation from users."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from contracts.events import JudgeEvent, decode, encode, judge_event_id
from gateway.judge import parse_score
from gateway.snapshot import UpstreamConfig, VariantConfig
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.gateway.conftest import (
    GatewayThread,
    MemorySink,
    dead_url,
    experiment,
    post,
    start_gateway,
    static_source,
)

FAST: dict[str, Any] = {"latency_ms": 5.0, "latency_sd": 1.0, "ttft_ms": 2.0, "ttft_sd": 0.5, "tokens": 20.0}


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    models = [
        SimulatorModel("base", quality=0.4, **FAST),
        SimulatorModel("hack", quality=0.4, stuff_phrase="Great question!", **FAST),
        SimulatorModel(
            "judge",
            judge=True,
            judge_phrase="great question",
            judge_phrase_bonus=3.0,
            judge_noise=0.0,
            **FAST,
        ),
        SimulatorModel("slowjudge", judge=True, latency_ms=2000.0, latency_sd=1.0),
        SimulatorModel("chatty", **FAST),  # not a judge: answers words, no score
    ]
    with SimulatorProcess(models) as s:
        yield s.url + "/v1"


def judged(sink: MemorySink) -> list[JudgeEvent]:
    return [e for e in sink.events if isinstance(e, JudgeEvent)]


def wait_judged(sink: MemorySink, count: int, timeout: float = 10.0) -> list[JudgeEvent]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = judged(sink)
        if len(found) >= count:
            return found
        time.sleep(0.02)
    return judged(sink)


def gateway(
    sim: str, judge_model: str, rate: float, mode: str = "ab", **kw: Any
) -> tuple[GatewayThread, MemorySink]:
    sink = MemorySink()
    control = VariantConfig("control", "sim", "base", 50, True)
    exp = experiment(
        "assistant", [control, VariantConfig("cand", "sim", "hack", 0 if mode == "shadow" else 50)], mode=mode
    )
    source = static_source([exp], [UpstreamConfig("sim", sim, timeout_s=10.0)])
    g = start_gateway(
        sink,
        source,
        judge_url=kw.pop("judge_url", sim),
        judge_model=judge_model,
        judge_sample_rate=rate,
        **kw,
    )
    return g, sink


def ask(url: str, i: int) -> str:
    r = post(
        url + "/v1/chat/completions",
        {"model": "assistant", "messages": [{"role": "user", "content": f"python q{i}"}], "user": f"u{i}"},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-request-id"]


def test_sampled_responses_become_judge_events_linked_by_request_id(sim: str) -> None:
    g, sink = gateway(sim, "judge", 1.0)
    with g:
        rids = [ask(g.url, i) for i in range(20)]
        events = wait_judged(sink, 20)
    assert sorted(e.request_id for e in events) == sorted(rids)
    by_rid = {e.request_id: e for e in sink.interactions()}
    for e in events:
        assert e.status == "ok" and e.score is not None and 1.0 <= e.score <= 10.0
        assert e.variant == by_rid[e.request_id].variant and e.unit_id == by_rid[e.request_id].unit_id
        assert e.category == "code" and e.role == "primary"
        assert e.event_id == judge_event_id(e.request_id, "judge")  # idempotent on redelivery
    # the simulated judge loves the stuffed phrase: +3 on the candidate's answers
    hack = [e.score or 0.0 for e in events if e.variant == "cand"]
    base = [e.score or 0.0 for e in events if e.variant == "control"]
    assert hack and base and min(hack) > max(base)


def test_the_sample_rate_bounds_the_share_of_judged_calls(sim: str) -> None:
    g, sink = gateway(sim, "judge", 0.25)
    with g:
        for i in range(200):
            ask(g.url, i)
        judge = g.app.runtime.judge
        assert judge is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and judge.held_bytes:  # queued or in flight
            time.sleep(0.02)
        n = len(wait_judged(sink, 1))
    assert 25 <= n <= 75  # Binomial(200, 0.25): mean 50, sd 6.1


def test_both_sides_of_a_shadow_pair_are_judged(sim: str) -> None:
    g, sink = gateway(sim, "judge", 1.0, mode="shadow")
    with g:
        rid = ask(g.url, 1)
        events = wait_judged(sink, 2)
    roles = {e.role: e for e in events}
    assert set(roles) == {"primary", "shadow"}
    assert roles["primary"].request_id == rid and roles["shadow"].pair_id == rid
    assert roles["shadow"].variant == "cand"


def test_a_judge_that_answers_no_score_or_is_down_gives_error_events_not_silence(sim: str) -> None:
    for model, url, kind in (("chatty", sim, "unparseable"), ("judge", dead_url(), "connect")):
        g, sink = gateway(sim, model, 1.0, judge_url=url)
        with g:
            rid = ask(g.url, 1)
            events = wait_judged(sink, 1)
        assert [(e.request_id, e.status, e.error_type, e.score) for e in events] == [
            (rid, "error", kind, None)
        ]


def test_a_slow_judge_never_changes_or_delays_what_users_get_and_overflow_is_counted(sim: str) -> None:
    g, _ = gateway(sim, "slowjudge", 1.0, judge_concurrency=1, judge_queue_size=2)
    with g:
        t0 = time.perf_counter()
        rids = [ask(g.url, i) for i in range(10)]
        elapsed = time.perf_counter() - t0

        def outcome(name: str) -> float:
            judged = g.app.runtime.metrics.judge
            return sum(
                judged.labels("assistant", "exp-assistant", v, name)._value.get() for v in ("control", "cand")
            )

        # A job is offered after its response went out, so the last offer may trail the
        # client's read: wait until all ten were offered (queued or dropped).
        deadline = time.monotonic() + 5.0
        while outcome("queued") + outcome("dropped") < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        dropped = outcome("dropped")
        offered = outcome("queued") + dropped
    assert len(rids) == 10
    assert elapsed < 2.0  # ten 2 s judgements in line would take 20 s
    assert offered == 10
    assert dropped >= 7  # one in flight, two queued


def test_judge_events_round_trip_the_contract_and_bad_ones_are_refused() -> None:
    ev = JudgeEvent(
        request_id="r1",
        unit_id="u",
        judge="j",
        role="primary",
        status="ok",
        latency_ms=3.0,
        score=7.0,
        event_id=judge_event_id("r1", "j"),
    )
    assert decode(encode(ev)) == ev
    bad = encode(ev).replace(b'"score":7.0', b'"score":1e12')
    with pytest.raises(ValueError, match="score"):
        decode(bad)


@pytest.mark.parametrize(
    ("content", "score"),
    [("7", 7.0), ("Score: 8.5/10", 8.5), ("11", None), ("great", None), ("-3", None)],
)
def test_the_first_number_in_range_is_the_score(content: str, score: float | None) -> None:
    import orjson

    body = orjson.dumps({"choices": [{"message": {"content": content}}]})
    assert parse_score(body, 1.0, 10.0) == score
    assert parse_score(b"not json", 1.0, 10.0) is None
    assert parse_score(b'{"choices": []}', 1.0, 10.0) is None


def test_judge_events_never_reach_the_feedback_tables_of_in_process_ingest() -> None:
    from analytics.ingest.write import encode_for_ingest
    from contracts.events import JUDGEMENTS_TOPIC

    ev = JudgeEvent(
        request_id="r1", unit_id="u", judge="j", role="primary", status="ok", latency_ms=3.0, score=7.0
    )
    enc = encode_for_ingest([ev])
    assert enc.feedback == [] and enc.interactions == [] and enc.dead == []
    assert [r.topic for r in enc.judgements] == [JUDGEMENTS_TOPIC]
