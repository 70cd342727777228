"""RL-risk scenarios: the simulated models behave as described, and the forgetting scenario is
caught in the right category from events the real gateway emits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest

from analytics.risks import MatrixInput, capability_matrix
from analytics.stats import Direction, MetricKind, SampleStats
from gateway.snapshot import UpstreamConfig, VariantConfig
from liftgate import users as u
from liftgate.scenarios import SCENARIOS, scenario
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.gateway.conftest import MemorySink, experiment, start_gateway, static_source

FAST = {"latency_ms": 3.0, "latency_sd": 0.5, "ttft_ms": 1.0, "ttft_sd": 0.2, "error_rate": 0.0}


def fast(model: SimulatorModel) -> SimulatorModel:
    return replace(model, **FAST)  # type: ignore[arg-type]


def test_every_scenario_has_a_baseline_a_candidate_and_a_judge_that_survive_the_cli_spec() -> None:
    for sc in SCENARIOS.values():
        assert [m.name for m in sc.models] == ["baseline", "candidate", "judge"]
        assert sc.judge.judge and not sc.candidate.judge
        for m in sc.models:
            assert SimulatorModel.parse(m.to_spec()) == m
    with pytest.raises(ValueError, match="known: reward-hacking"):
        scenario("nope")


@pytest.fixture(scope="module")
def hacking() -> Iterator[str]:
    with SimulatorProcess([fast(m) for m in scenario("reward-hacking").models]) as sim:
        yield sim.url + "/v1"


async def _chat(session: aiohttp.ClientSession, url: str, model: str, text: str) -> dict[str, object]:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    async with session.post(url + "/chat/completions", json=body) as r:
        assert r.status == 200
        data: dict[str, object] = orjson.loads(await r.read())
        return data


def test_the_reward_hacker_is_verbose_stuffs_its_phrase_and_wins_its_judge_not_its_users(
    hacking: str,
) -> None:
    async def run() -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[int]]]:
        scores: dict[str, list[float]] = {"baseline": [], "candidate": []}
        quality: dict[str, list[float]] = {"baseline": [], "candidate": []}
        words: dict[str, list[int]] = {"baseline": [], "candidate": []}
        async with aiohttp.ClientSession() as session:
            for i in range(30):
                for model in ("baseline", "candidate"):
                    data = await _chat(session, hacking, model, f"Write a Python function number {i}")
                    answer = data["choices"][0]["message"]["content"]  # type: ignore[index]
                    if model == "candidate":
                        assert answer.startswith("Great question! ")
                    words[model].append(len(answer.split()))
                    quality[model].append(float(data["sim_quality"]))  # type: ignore[arg-type]
                    judged = await _chat(session, hacking, "judge", f"Question:\nq\n\nAnswer:\n{answer}")
                    scores[model].append(float(judged["choices"][0]["message"]["content"]))  # type: ignore[index]
        return scores, quality, words

    scores, quality, words = asyncio.run(run())
    assert np.mean(words["candidate"]) > 1.5 * np.mean(words["baseline"])
    assert max(quality["candidate"]) < min(quality["baseline"])  # users: worse
    assert np.mean(scores["candidate"]) > np.mean(scores["baseline"]) + 2.0  # judge: much better


def test_the_forgetting_scenario_is_caught_in_code_and_only_there_from_gateway_events() -> None:
    """Simulated users (liftgate.users prompts) through the real gateway; the outcome of a
    response is Bernoulli(its quality); the matrix is built from the events' categories."""
    sc = scenario("forgetting")
    sink = MemorySink()
    with SimulatorProcess([fast(sc.baseline), fast(sc.candidate)]) as sim:
        control = VariantConfig("control", "sim", "baseline", 50, True)
        exp = experiment("assistant", [control, VariantConfig("cand", "sim", "candidate", 50)])
        source = static_source([exp], [UpstreamConfig("sim", sim.url + "/v1", timeout_s=10.0)])
        with start_gateway(sink, source) as g:
            outcomes = asyncio.run(_traffic(g.url, users=2000, seed=5))
    # planned_units: the experiment's planned size (4,000 units) tunes the always-valid test
    matrix = capability_matrix(_inputs(sink, outcomes), planned_units=4000)
    assert matrix.harmed_categories == (("success", "code"),)
    code = next(c for c in matrix.cells if c.category == "code")
    math_cell = next(c for c in matrix.cells if c.category == "math")
    assert code.lift is not None and code.lift < -0.1
    assert math_cell.lift is not None and math_cell.lift > 0.05


async def _traffic(url: str, users: int, seed: int) -> dict[str, float]:
    """One first-turn request per simulated user; returns request id -> outcome (0/1). Each
    user draws from its own generator, so the run does not depend on the order of answers."""
    population = u.build_population(users, seed=seed)
    outcomes: dict[str, float] = {}
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as session:

        async def one(user: u.SimUser) -> None:
            rng = random.Random(f"{seed}:{user.user_id}")
            prompt = u.first_prompt(u.pick_task(user, rng), rng)
            body = {
                "model": "assistant",
                "messages": [{"role": "user", "content": prompt}],
                "user": user.user_id,
            }
            async with sem, session.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                data = orjson.loads(await r.read())
                outcomes[r.headers["x-request-id"]] = float(rng.random() < data["sim_quality"])

        await asyncio.gather(*(one(user) for user in population))
    return outcomes


def _inputs(sink: MemorySink, outcomes: dict[str, float]) -> list[MatrixInput]:
    deadline_events = sink.wait_for(lambda e: len(sink.interactions()) >= len(outcomes), timeout=10.0)
    assert deadline_events
    per: dict[tuple[str, str], dict[str, list[float]]] = {}
    for e in sink.interactions():
        if e.role != "primary" or e.request_id not in outcomes:
            continue
        assert e.category is not None
        cell = per.setdefault((e.category, e.variant or ""), {})
        cell.setdefault(e.unit_id, []).append(outcomes[e.request_id])
    out = []
    for category in sorted({k for k, _ in per}):
        stats = []
        for variant in ("control", "cand"):
            units = per.get((category, variant), {})
            x = np.array([sum(v) for v in units.values()])
            y = np.array([float(len(v)) for v in units.values()])
            stats.append(
                SampleStats(len(x), float(x.sum()), float(x @ x), float(y.sum()), float(y @ y), float(x @ y))
            )
        out.append(MatrixInput(category, "success", Direction.INCREASE, MetricKind.RATIO, stats[0], stats[1]))
    return out


def test_liftgate_up_refuses_an_unknown_scenario_or_one_without_the_simulator(tmp_path: Path) -> None:
    from tests.liftgate.frontdoor import liftgate

    res = liftgate("up", "--scenario", "nope", "--state-dir", str(tmp_path), token=None)
    assert res.returncode == 2 and "known: reward-hacking, forgetting, honest, biased-judge" in res.stderr
    res = liftgate(
        "up",
        "--scenario",
        "forgetting",
        "--upstream",
        "a=http://127.0.0.1:1/v1",
        "--state-dir",
        str(tmp_path),
        token=None,
    )
    assert res.returncode == 2 and "--scenario runs the simulator" in res.stderr
