"""Staged rollouts end to end: simulator, gateway and analytics service as real processes,
standalone controller processes, real HTTP traffic; events ingested by the real ingest
function; weights applied by the gateway from PostgreSQL. Accelerated (second-long
stages, high traffic) and bounded in time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from liftgate.simulator_model import SimulatorModel
from tests.scenarios.rollout_stack import TOKEN, Stack, Traffic, http, start_stack, wait_for


def _model(name: str, error_rate: float) -> SimulatorModel:
    # Latency well above the few ms of queueing a loaded test machine adds, so load drifting
    # over the run does not look like a latency regression of the later-ramped candidate.
    return SimulatorModel(name, latency_ms=60.0, latency_sd=6.0, ttft_ms=10.0, ttft_sd=2.0, tokens=16.0,
                          tokens_sd=3.0, error_rate=error_rate)  # fmt: skip


MODELS = [_model("base", 0.05), _model("bad", 0.15), _model("good", 0.03), _model("same", 0.05)]
PLAN: dict[str, Any] = {
    "stages": [5, 10, 25, 50, 100],
    "min_duration_s": 4,
    "min_units": 8,
    "interval_s": 0.5,
    "planned_units": 500,
    "min_test_units": 20,
    # Mean latency here is mostly queueing on a shared, loaded 2-core machine and drifts with
    # the load of other processes; guardrails compare the variants within the current stage
    # (the default window), so the drift hits both arms alike and the default margin holds.
    "guardrails": [
        {"metric": "error_rate", "margin": 0.25},
        "latency_mean",
        "thumbs_down_rate",
        "completion_tokens_per_response",
    ],
}


@pytest.fixture(scope="module")
def stack(database_url: str) -> Iterator[Stack]:
    yield from start_stack(database_url, MODELS, controller_in_service=False)


@pytest.fixture
def controller(stack: Stack) -> Iterator[None]:
    proc = stack.start_controller()
    yield
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


def _create(stack: Stack, name: str, candidate_model: str, plan: dict[str, Any]) -> str:
    return stack.create_rollout(name, plan, candidate_model)


def _state(stack: Stack, name: str) -> dict[str, Any]:
    return stack.rollout(name)


def _timeline(stack: Stack, name: str) -> str:
    state = _state(stack, name)
    rows = [(d["created_at"][11:23], d["decision"], d["stage"], d["reason"]) for d in state["decisions"][-8:]]
    return f"status {state['status']} stage {state['stage']}; last decisions {rows}"


def _decisions(state: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [d for d in state["decisions"] if d["decision"] == kind]


def test_a_candidate_with_three_times_the_errors_is_rolled_back_before_25_percent_and_then_gets_no_traffic(
    stack: Stack, controller: None, engine: Engine, unique_name: str
) -> None:
    started = time.monotonic()
    name = f"bad-{unique_name}"[:60]
    # require_noninferiority: a stage advances only once every guardrail is shown
    # non-inferior, so whether the candidate reaches 25% does not depend on how much traffic
    # this (shared, loaded) machine pushes through a 10 s stage: with the default policy a
    # stage that saw too few requests to detect the harm advances (seen once in CI: rolled
    # back at 25%). The default policy's rollback before 25% is covered deterministically in
    # tests/analytics/rollout/test_controller.py.
    route = _create(stack, name, "bad", {**PLAN, "min_duration_s": 10, "require_noninferiority": True})
    wait_for(lambda: _state(stack, name)["stage"] == 0, 20, "the controller to start the rollout")
    with Traffic(stack.gateway, route, units=600, duration_s=100):
        state = wait_for(
            lambda: (s := _state(stack, name))["status"] == "rolled_back" and s, 100, "a rollback"
        )
        rollback = _decisions(state, "rollback")[-1]
        assert rollback["stage"] < 2, state["decisions"]  # rolled back at 5% or 10%
        assert "error_rate" in rollback["reason"] and rollback["actor"] == "controller"
        assert not _decisions(state, "advance") or all(
            d["to_stage"] < 2 for d in _decisions(state, "advance")
        )
        time.sleep(4.0)  # keep sending traffic after the rollback
    with engine.connect() as conn:
        after = conn.execute(
            text("SELECT count(*) FILTER (WHERE upstream = :c), count(*) FROM interactions"
                 " WHERE route = :r AND role = 'primary' AND ts > :t"),
            {"c": f"{name}-cand", "r": route, "t": _ts(rollback["created_at"]) + timedelta(seconds=1)},
        ).one()  # fmt: skip
    assert after[1] > 50, "traffic continued after the rollback"
    assert after[0] == 0, f"{after[0]} requests went to the candidate after the rollback"
    assert time.monotonic() - started < 120


def test_an_equal_or_better_candidate_is_promoted_and_becomes_the_baseline(
    stack: Stack, controller: None, engine: Engine, unique_name: str
) -> None:
    started = time.monotonic()
    name = f"good-{unique_name}"[:60]
    route = _create(stack, name, "good", PLAN)
    wait_for(lambda: _state(stack, name)["stage"] == 0, 20, "the controller to start the rollout")
    with Traffic(stack.gateway, route, units=400, duration_s=100):
        state = wait_for(lambda: (s := _state(stack, name))["status"] == "completed" and s, 100, "promotion",
                         context=lambda: _timeline(stack, name))  # fmt: skip
        time.sleep(3.0)
    moves = [d["decision"] for d in state["decisions"] if d["decision"] != "hold"]
    assert moves == ["start", "advance", "advance", "advance", "advance", "promote"]
    weights = {v["name"]: v["weight"] for v in state["variants"]}
    assert weights == {"control": 0, "candidate": 100}, weights
    exp = stack.admin("GET", f"/experiments/{name}")
    assert exp["status"] == "completed"
    promoted = _ts(_decisions(state, "promote")[-1]["created_at"]) + timedelta(seconds=1)
    with engine.connect() as conn:
        served: dict[str, int] = dict(
            conn.execute(
                text("SELECT upstream, count(*) FROM interactions WHERE route = :r AND role = 'primary'"
                     " AND ts > :t GROUP BY upstream"),
                {"r": route, "t": promoted},
            ).all()
        )  # fmt: skip
    assert served.get(f"{name}-cand", 0) > 20 and f"{name}-base" not in served, served
    # the CLI shows the same state, and refuses to move a completed rollout
    cli = [sys.executable, "-m", "liftgate", "rollout"]
    env = {**os.environ, "LIFTGATE_ADMIN_TOKEN": TOKEN}
    shown = subprocess.run([*cli, "status", name, "--analytics", stack.analytics, "--json"],
                           capture_output=True, text=True, timeout=60, env=env, check=True)  # fmt: skip
    assert json.loads(shown.stdout)["status"] == "completed"
    refused = subprocess.run([*cli, "advance", name, "--analytics", stack.analytics],
                             capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert refused.returncode == 1 and "409" in refused.stderr
    assert time.monotonic() - started < 120


def test_a_broken_split_holds_the_rollout(stack: Stack, controller: None, unique_name: str) -> None:
    started = time.monotonic()
    name = f"lossy-{unique_name}"[:60]  # the gateway loses half the candidate units' events
    route = _create(stack, name, "same", {**PLAN, "stages": [20, 50, 100], "min_duration_s": 8})
    wait_for(lambda: _state(stack, name)["stage"] == 0, 20, "the controller to start the rollout")
    with Traffic(stack.gateway, route, units=500, duration_s=60):
        state = wait_for(
            lambda: (s := _state(stack, name))["decisions"][-1]["evidence"].get("code") == "srm" and s,
            40, "an SRM hold",
        )  # fmt: skip
        time.sleep(10.0)  # past the stage's minimums: still held
        state = _state(stack, name)
    assert state["status"] == "running" and state["stage"] == 0, state["decisions"][-3:]
    hold = state["decisions"][-1]
    assert hold["decision"] == "hold" and hold["evidence"]["srm"]["flagged"]
    assert time.monotonic() - started < 120


def test_pause_holds_everything_and_a_killed_controller_resumes_mid_stage(
    stack: Stack, engine: Engine, unique_name: str
) -> None:
    started = time.monotonic()
    name = f"kill-{unique_name}"[:60]
    route = _create(stack, name, "same", {**PLAN, "min_duration_s": 6})
    first = stack.start_controller()
    wait_for(lambda: _state(stack, name)["stage"] == 0, 20, "the controller to start the rollout")
    with Traffic(stack.gateway, route, units=400, duration_s=110) as traffic:
        wait_for(lambda: _state(stack, name)["stage"] == 1, 40, "the first advance")
        time.sleep(2.0)  # mid-stage
        first.send_signal(signal.SIGKILL)
        first.wait(5)
        before = _state(stack, name)
        assert before["stage"] == 1
        # two controllers at once after the restart: still one decision per stage
        stack.start_controller()
        stack.start_controller()
        state = wait_for(
            lambda: (s := _state(stack, name))["stage"] == 2 and s, 40, "the advance after restart"
        )
        to_two = [d for d in _decisions(state, "advance") if d["to_stage"] == 2]
        assert len(to_two) == 1
        assert to_two[0]["evidence"]["elapsed_s"] >= 6  # timed from the original stage start
        assert _ts(to_two[0]["created_at"]) - _ts(before["stage_started_at"]) >= timedelta(seconds=6)
        assert [d["to_stage"] for d in _decisions(state, "advance")] == [1, 2]

        paused = stack.rollout(name, "pause")
        assert paused["status"] == "paused" and paused["decision"]["actor"] == "admin:scenario"
        pause_at = _ts(paused["decision"]["created_at"])
        time.sleep(9.0)  # longer than the stage minimum
        held = _state(stack, name)
        assert held["status"] == "paused" and held["stage"] == 2
        assert held["decisions"][-1]["decision"] == "pause"
        sent_in_pause = [s for s in traffic.sent if s.at > pause_at + timedelta(seconds=1)]
        late = [(s.at - pause_at).total_seconds() for s in sent_in_pause if s.variant == "candidate"]
        assert sent_in_pause and not late, f"candidate served {late} s after the pause"

        resumed = stack.rollout(name, "resume")
        assert resumed["status"] == "running" and resumed["stage"] == 2
        rolled = stack.rollout(name, "rollback")
        assert rolled["status"] == "rolled_back"
        manual = [d["decision"] for d in rolled["decisions"] if d["actor"] == "admin:scenario"]
        assert manual == ["pause", "resume", "rollback"]
    with engine.connect() as conn:
        audits = conn.execute(
            text("SELECT action, actor FROM audit_log WHERE action LIKE 'rollout.%' AND entity_id = :e"),
            {"e": str(state["experiment_id"])},
        ).all()
    assert ("rollout.pause", "admin:scenario") in [tuple(a) for a in audits]
    assert time.monotonic() - started < 120


def _ts(value: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(value)


def test_the_rollout_api_requires_the_admin_token_and_explains_refusals(
    stack: Stack, unique_name: str
) -> None:
    name = f"api-{unique_name}"[:60]
    stack.create_rollout(name, PLAN)
    url = f"{stack.analytics}/api/experiments/{name}/rollout"
    assert http("POST", url + "/pause")[0] == 401
    assert http("POST", url + "/pause", headers={"Authorization": "Bearer wrong-token-123456"})[0] == 403
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert http("POST", url + "/explode", headers=auth)[0] == 404
    status, body = http("POST", url + "/resume", headers=auth)
    assert status == 409 and "running" in body
    assert http("GET", url)[0] == 401  # reads need a credential too
    status, body = http("GET", f"{stack.analytics}/api/experiments/no-such-{name}/rollout", headers=auth)
    assert status == 404 and "not found" in body
    status, state = http("GET", url, headers=auth)
    assert status == 200 and state["plan"]["stages"] == PLAN["stages"]
    assert [s["percent"] for s in state["stages"]] == PLAN["stages"]
