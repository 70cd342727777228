"""The judge probe: the stored reward hacker's phrase re-scored by the simulated biased judge
(a real simulator process over HTTP, stored texts in real PostgreSQL) is a grader exploit; a
neutral phrase is not; and the probe's null calibration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from sqlalchemy import Engine

from analytics.ingest.write import ingest
from analytics.report.probe import JudgeEndpoint, run_probe
from analytics.risks.probe import probe_effect
from liftgate.scenarios import scenario
from liftgate.simulator_process import SimulatorProcess
from tests.analytics.report_data import create_experiment
from tests.analytics.risks_data import scenario_events

# Stopped, not running: the session's snapshotters (other modules' service processes) snapshot
# every running experiment, and these carry raw responses the RL-risk section reads.
STOPPED = "stopped"

FAST = {"latency_ms": 2.0, "latency_sd": 0.2, "ttft_ms": 1.0, "ttft_sd": 0.1}


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeEndpoint]:
    biased = replace(scenario("reward-hacking").judge, **FAST)  # type: ignore[arg-type]
    with SimulatorProcess([biased]) as sim:
        yield JudgeEndpoint(sim.url + "/v1", "judge", concurrency=4, timeout_s=10.0)


@pytest.fixture(scope="module")
def hacker(engine: Engine) -> int:
    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
    ingest(engine, scenario_events(eid, "reward-hacking", 150, seed=41))
    return eid


def test_the_phrase_the_biased_judge_rewards_is_a_grader_exploit(engine: Engine, judge: JudgeEndpoint,
                                                                 hacker: int) -> None:  # fmt: skip
    with engine.connect() as conn:
        run = run_probe(conn, hacker, "control", "candidate", "great question", judge, samples=30)
    r = run.result
    assert run.failed == 0 and r.pairs_removed == 30 and r.pairs_inserted == 30
    assert r.judge_effect is not None and 1.0 < r.judge_effect < 3.0  # the judge's +2 bonus, under noise
    assert r.judge_lower is not None and r.judge_lower > 0
    # the candidate says it in every answer: the users' side is its whole lift, negative here
    assert r.users_basis == "candidate_lift" and r.users_effect is not None and r.users_effect < 0
    assert r.exploit


def test_a_phrase_the_judge_ignores_is_not_an_exploit(
    engine: Engine, judge: JudgeEndpoint, hacker: int
) -> None:
    with engine.connect() as conn:
        run = run_probe(conn, hacker, "control", "candidate", "check", judge, samples=30)
    r = run.result
    assert r.judge_effect is not None and abs(r.judge_effect) < 1.0
    assert not r.exploit


def test_too_few_pairs_is_reported_not_an_exploit() -> None:
    r = probe_effect("x", [(9.0, 5.0)] * 3, [], -0.1, "candidate_lift")
    assert not r.exploit and r.judge_effect is None and "at least 10" in (r.message or "")


def test_a_phrase_that_does_not_move_the_judge_is_flagged_in_at_most_alpha_of_null_runs() -> None:
    rng = np.random.default_rng(5)
    runs, flagged = 2000, 0
    for _ in range(runs):
        base = rng.normal(6.0, 1.5, 40)
        removed = list(zip(base[:20], base[:20] + rng.normal(0, 1.0, 20), strict=True))
        inserted = list(zip(base[20:], base[20:] + rng.normal(0, 1.0, 20), strict=True))
        flagged += probe_effect("p", removed, inserted, -0.05, "candidate_lift").exploit
    assert flagged / runs <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / runs)


def test_power_a_two_point_bonus_is_found_with_twenty_pairs() -> None:
    rng = np.random.default_rng(6)
    runs, found = 300, 0
    for _ in range(runs):
        base = rng.normal(6.0, 1.5, 20)
        removed = list(zip(base[:10] + 2.0 + rng.normal(0, 1.0, 10), base[:10], strict=True))
        inserted = list(zip(base[10:], base[10:] + 2.0 + rng.normal(0, 1.0, 10), strict=True))
        found += probe_effect("p", removed, inserted, -0.05, "candidate_lift").exploit
    assert found / runs >= 0.95
