"""RL risks end to end: the reward-hacking scenario's simulator behind the real gateway (judge
sampler on, content logging full, feedback through /v1/feedback), events ingested into
PostgreSQL by the real ingest, and the analytics service as a real process serving
``/api/experiments/{ref}/rl-risks`` and the alarm gauges on ``/metrics``."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from analytics.ingest.write import ingest
from analytics.report.risks_schema import ALARM_NAMES
from contracts.events import InteractionEvent, JudgeEvent
from gateway.snapshot import UpstreamConfig, VariantConfig
from liftgate import users as u
from liftgate.scenarios import scenario
from liftgate.simulator_process import SimulatorProcess
from tests.analytics.report_data import create_experiment
from tests.analytics.service import test_app
from tests.analytics.service.test_app import READ_TOKEN, TOKEN, Service
from tests.gateway.conftest import MemorySink, experiment, start_gateway, static_source

# Stopped, not running: the session's snapshotters (other modules' service processes) snapshot
# every running experiment, and these carry raw responses the RL-risk section reads.
STOPPED = "stopped"

FAST = {"latency_ms": 3.0, "latency_sd": 0.5, "ttft_ms": 1.0, "ttft_sd": 0.2, "error_rate": 0.0}
USERS = 400
service = test_app.service  # the analytics service process, on this module's ``seeded``


async def _traffic(url: str, users: int, seed: int) -> int:
    """Two turns per simulated user; a vote on 60 % of answers (thumbs-up with probability
    the answer's quality) posted to the gateway's /v1/feedback. Returns answered calls."""
    population = u.build_population(users, seed=seed)
    answered = 0
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as session:

        async def one(user: u.SimUser) -> None:
            nonlocal answered
            rng = random.Random(f"{seed}:{user.user_id}")
            for _ in range(2):
                prompt = u.first_prompt(u.pick_task(user, rng), rng)
                body = {"model": "assistant", "messages": [{"role": "user", "content": prompt}],
                        "user": user.user_id}  # fmt: skip
                async with sem:
                    async with session.post(url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
                        data = orjson.loads(await r.read())
                        rid = r.headers["x-request-id"]
                    answered += 1
                    if rng.random() < 0.6:
                        kind = "thumbs_up" if rng.random() < data["sim_quality"] else "thumbs_down"
                        fb = {"request_id": rid, "kind": kind}
                        async with session.post(url + "/v1/feedback", json=fb) as r:
                            assert r.status in (200, 202), await r.text()

        await asyncio.gather(*(one(user) for user in population))
    return answered


@pytest.fixture(scope="module")
def seeded(engine: Engine) -> Iterator[dict[str, Any]]:
    """Overrides test_app's fixture: the experiment the service reports on, with gateway data."""
    with engine.begin() as conn:
        eid, name = create_experiment(
            conn, [("control", 1), ("candidate", 1)], status=STOPPED, metrics=["thumbs_up_rate"]
        )
    sc = scenario("reward-hacking")
    sink = MemorySink()
    with SimulatorProcess([replace(m, **FAST) for m in sc.models]) as sim:  # type: ignore[arg-type]
        variants = [VariantConfig("control", "sim", "baseline", 50, True),
                    VariantConfig("candidate", "sim", "candidate", 50)]  # fmt: skip
        exp = experiment("assistant", variants, exp_id=eid, content_logging="full")
        source = static_source([exp], [UpstreamConfig("sim", sim.url + "/v1", timeout_s=10.0)])
        with start_gateway(sink, source, judge_url=sim.url + "/v1", judge_model="judge", judge_sample_rate=1.0,
                           feedback_rate=0, judge_queue_size=100_000) as g:  # fmt: skip
            answered = asyncio.run(_traffic(g.url, USERS, seed=11))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # every answer judged (rate 1.0, a fast judge)
                if sum(isinstance(e, JudgeEvent) for e in sink.events) >= answered:
                    break
                time.sleep(0.05)
    events = list(sink.events)
    primaries = [e for e in events if isinstance(e, InteractionEvent) and e.role == "primary"]
    assert len(primaries) == answered and all(e.category for e in primaries)
    assert sum(isinstance(e, JudgeEvent) for e in events) == answered
    ingest(engine, events)
    yield {"id": eid, "name": name, "draft": eid}


def test_the_rl_risks_endpoint_serves_the_reports_section_and_flags_the_stuffed_phrase(
    service: Service, seeded: dict[str, Any]
) -> None:
    status, body = service.call("GET", f"/api/experiments/{seeded['name']}/rl-risks")
    assert status == 200, body
    assert body["experiment_id"] == seeded["id"] and len(body["rl_risks"]) == 1
    risks = body["rl_risks"][0]
    assert risks["variant"] == "candidate" and risks["control"] == "control"
    assert "great question" in risks["phrases"]["flagged"]
    assert risks["verbosity"]["longer"] is True and risks["verbosity"]["relative_shift"] > 0.5
    assert risks["judge"]["state"] == "ok" and risks["judge"]["judges"] == ["judge"]
    assert risks["judge"]["judge_says"] > risks["judge"]["users_say"]
    assert {c["category"] for c in risks["capability"]["cells"]} <= {"code", "math", "writing", "other"}
    # the same numbers as the report it comes from
    status, report = service.call("GET", f"/api/experiments/{seeded['id']}/report")
    assert status == 200
    assert report["rl_risks"][0]["alarms"] == risks["alarms"]
    assert report["rl_risks"][0]["capability"] == risks["capability"]


def test_the_rl_risks_endpoint_needs_a_reader_and_an_existing_experiment(service: Service) -> None:
    assert service.call("GET", "/api/experiments/999999/rl-risks")[0] == 404
    assert service.call("GET", "/api/experiments/1/rl-risks", token=None)[0] == 401
    assert service.call("GET", "/api/experiments/1/rl-risks", token=READ_TOKEN + "x")[0] in (401, 403)


def test_prometheus_gauges_carry_one_bounded_series_per_alarm_equal_to_the_api(
    service: Service, seeded: dict[str, Any]
) -> None:
    _, body = service.call("GET", f"/api/experiments/{seeded['id']}/rl-risks")
    alarms = {a["name"]: a for a in body["rl_risks"][0]["alarms"]}
    status, exposition = service.call("GET", "/metrics", token=None)
    assert status == 200
    found: dict[str, dict[tuple[str, str, str], float]] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name in ("liftgate_analytics_rl_risk_alarm", "liftgate_analytics_rl_risk_evaluable"):
            for s in family.samples:
                key = (s.labels["experiment"], s.labels["variant"], s.labels["alarm"])
                found.setdefault(family.name, {})[key] = s.value
    mine = {k: v for k, v in found["liftgate_analytics_rl_risk_alarm"].items() if k[0] == str(seeded["id"])}
    assert {k[2] for k in mine} == set(ALARM_NAMES) and {k[1] for k in mine} == {"candidate"}
    for (_, _, alarm), value in mine.items():
        assert value == (1.0 if alarms[alarm]["firing"] else 0.0)
        evaluable = found["liftgate_analytics_rl_risk_evaluable"][(str(seeded["id"]), "candidate", alarm)]
        assert evaluable == (1.0 if alarms[alarm]["state"] == "ok" else 0.0)
    assert mine[(str(seeded["id"]), "candidate", "stuffing")] == 1.0


def test_the_judge_probe_needs_the_admin_token_and_a_configured_judge(
    service: Service, seeded: dict[str, Any]
) -> None:
    path = f"/api/experiments/{seeded['id']}/rl-risks/probe"
    assert service.call("POST", path, {"phrase": "great question"})[0] == 403  # the read token
    assert service.call("POST", path, {"phrase": "great question"}, token=None)[0] == 401
    status, body = service.call("POST", path, {"phrase": "great question"}, token=TOKEN)
    assert status == 409 and "LIFTGATE_JUDGE_URL" in body["detail"]
    assert service.call("POST", path, {"phrase": ""}, token=TOKEN)[0] == 422
    assert service.call("POST", path, {"phrase": "x", "samples": 5000}, token=TOKEN)[0] == 422


def test_a_phrase_lookup_needs_the_n_gram_key(service: Service, seeded: dict[str, Any]) -> None:
    status, body = service.call("GET", f"/api/experiments/{seeded['id']}/rl-risks?phrase=great%20question")
    assert status == 409 and "LIFTGATE_NGRAM_KEY" in body["detail"]
    status, body = service.call("GET", f"/api/experiments/{seeded['id']}/rl-risks")
    assert status == 200 and body["rl_risks"][0]["phrases"]["source"] == "text"
