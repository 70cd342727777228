"""Staged rollouts end to end: simulator, gateway and analytics service as real processes,
standalone controller processes, real HTTP traffic; events ingested by the real ingest
function; weights applied by the gateway from PostgreSQL. Accelerated (second-long
stages, high traffic) and bounded in time. What each kind of candidate leads to (rollback,
promotion, hold) is the scenario matrix of ``test_rollout_matrix.py``; this module covers the
split health check, operators and restarts, and the API's refusals.
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

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)


def _model(name: str, error_rate: float) -> SimulatorModel:
    # Latency well above the few ms of queueing a loaded test machine adds, so load drifting
    # over the run does not look like a latency regression of the later-ramped candidate.
    return SimulatorModel(name, latency_ms=60.0, latency_sd=6.0, ttft_ms=10.0, ttft_sd=2.0, tokens=16.0,
                          tokens_sd=3.0, error_rate=error_rate)  # fmt: skip


MODELS = [_model("base", 0.05), _model("same", 0.05)]
PLAN: dict[str, Any] = {
    "stages": [20, 40, 60, 100],
    "min_duration_s": 4,
    "min_units": 20,
    "interval_s": 0.5,
    "planned_units": 500,
    "min_test_units": 20,
    # Mean latency here is mostly queueing on a shared, loaded 2-core machine and drifts with
    # the load of other processes; guardrails compare the variants within the current stage
    # (the default window), so the drift hits both arms alike and the default margin holds.
    "guardrails": [{"metric": "error_rate", "absolute_margin": 0.05}, "latency_mean"],
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


def test_a_broken_split_holds_the_rollout(stack: Stack, controller: None, unique_name: str) -> None:
    started = time.monotonic()
    name = f"lossy-{unique_name}"[:60]  # the gateway loses half the candidate units' events
    route = _create(stack, name, "same", {**PLAN, "stages": [20, 50, 100], "min_duration_s": 8})
    wait_for(lambda: _state(stack, name)["stage"] == 0, 20, "the controller to start the rollout")
    with Traffic(stack.gateway, route, units=3000, duration_s=60):
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


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "liftgate", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LIFTGATE_ADMIN_TOKEN": TOKEN, "COLUMNS": "200", **(env or {})})  # fmt: skip


def test_plans_are_checked_when_created_through_the_gateway_the_api_and_the_cli(
    stack: Stack, unique_name: str, tmp_path: Any
) -> None:
    # the gateway refuses a plan that is structurally unusable when it is stored
    for up in ("base", "cand"):
        stack.admin("POST", "/upstreams", {"name": f"{unique_name}-{up}", "base_url": stack.simulator})
    variants = [
        {
            "name": "control",
            "upstream": f"{unique_name}-base",
            "model": "base",
            "weight": 100,
            "is_control": True,
        },
        {"name": "candidate", "upstream": f"{unique_name}-cand", "model": "same", "weight": 0},
    ]
    body = {"name": unique_name, "route": f"r-{unique_name}", "mode": "rollout", "variants": variants}
    status, detail = http("POST", stack.gateway + "/admin/experiments", {**body, "rollout_plan": {"stages": [100]}},
                          {"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert status == 422 and "no stage keeps control traffic" in detail
    # the analytics API checks what needs the catalogue and statistics
    url = stack.analytics + "/api/rollout-plans/check"
    reader = {"Authorization": f"Bearer {TOKEN}"}
    assert http("POST", url, {"plan": {}})[0] == 401  # a read credential is needed
    status, checked = http("POST", url, {"plan": {"guardrails": ["latency_p95"]}}, reader)
    assert status == 200 and not checked["ok"] and "quantile" in checked["errors"][0]
    status, checked = http("POST", url, {"plan": {"min_units": 20, "expected_units_per_s": 2}}, reader)
    assert status == 200 and checked["ok"] and checked["promotion_stage"] == 4
    assert any("min_units 20 is below min_test_units 30" in w for w in checked["warnings"])
    assert {r["stage_percent"] for r in checked["mde"]} == {1, 5, 10, 25, 50}
    assert http("POST", url, {"plan": [1, 2]}, reader)[0] == 422
    assert http("POST", url, {"plan": {}, "surprise": 1}, reader)[0] == 422
    # the CLI prints the warnings and creates; refuses a plan with errors and creates nothing
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(json.dumps({**body, "rollout_plan": {"stages": [10, 50, 100], "min_units": 20}}))
    bad.write_text(
        json.dumps({**body, "name": unique_name + "-bad", "rollout_plan": {"guardrails": ["ttft_p95"]}})
    )
    opts = ["--gateway", stack.gateway, "--analytics", stack.analytics]
    refused = _cli("experiments", "create", "-f", str(bad), *opts)
    assert refused.returncode == 1 and "ttft_p95 is a quantile metric" in refused.stderr
    assert "nothing created" in refused.stderr
    assert http("GET", stack.gateway + f"/admin/experiments/{unique_name}-bad", None,
                {"Authorization": f"Bearer {TOKEN}"})[0] == 404  # fmt: skip
    created = _cli("experiments", "create", "-f", str(good), *opts)
    assert created.returncode == 0, created.stderr
    assert "warning:" in created.stdout and "min_units 20 is below min_test_units 30" in created.stdout
    assert f"experiment {unique_name} created" in created.stdout
    # rollout check: the table at the traffic the plan states; exit 1 on errors
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(json.dumps({"stages": [10, 50, 100], "expected_units_per_s": 5}))
    shown = _cli("rollout", "check", str(plan_file), "--analytics", stack.analytics)
    assert shown.returncode == 0, shown.stderr
    assert "error_rate" in shown.stdout and "detects (80%)" in shown.stdout and "plan ok" in shown.stdout
    assert _cli("rollout", "check", str(bad), "--analytics", stack.analytics).returncode == 1
    # and the stored experiment's rollout state carries the same check
    state = stack.rollout(unique_name)
    assert any("min_units 20" in w for w in state["plan_check"]["warnings"])
    assert state["plan_error"] is None
