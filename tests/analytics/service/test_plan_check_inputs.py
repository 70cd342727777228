"""``POST /api/rollout-plans/check`` with text no route or metric can have: a 422 with the
reason, never a 500. Found by the fuzz suite (tests/fuzz/test_analytics_fuzz.py): a NUL in the
route or in a guardrail's metric name reached PostgreSQL, which cannot hold NUL in text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fuzz.services import http_json
from tests.known_secrets import secret
from tests.services import analytics_service

ADMIN = secret("plan-check-admin")


@pytest.fixture(scope="module")
def url(module_database_url: str) -> Iterator[str]:
    with analytics_service(
        module_database_url, ADMIN, snapshot_interval_s="0", rollout_controller="false"
    ) as u:
        yield u


@pytest.mark.parametrize("route", ["\u0000#", "r\u0001", "\u007f", "a\nb"])
def test_a_route_with_control_characters_is_refused_with_a_reason(url: str, route: str) -> None:
    status, answer = http_json(
        "POST", url + "/api/rollout-plans/check", ADMIN, {"route": route, "plan": None}
    )
    assert status == 422 and "route" in answer["detail"], (status, answer)


@pytest.mark.parametrize(
    "plan",
    [
        {"stages": [10, 50], "guardrails": [{"metric": "error\u0000rate"}]},
        {"stages": [10, 50], "guardrails": ["x\u0000"]},
        {"stages": [10, 50], "success_metrics": ["\u0000"]},
    ],
)
def test_a_metric_name_with_a_nul_is_an_error_of_the_plan(url: str, plan: dict[str, Any]) -> None:
    status, answer = http_json("POST", url + "/api/rollout-plans/check", ADMIN, {"route": "r", "plan": plan})
    assert status == 200 and not answer["ok"], (status, answer)
    assert any("\\x00" in e for e in answer["errors"]), answer


def test_a_plan_check_of_a_clean_route_still_answers(url: str) -> None:
    status, answer = http_json("POST", url + "/api/rollout-plans/check", ADMIN, {"route": "no-such-route"})
    assert status == 200 and answer["errors"] == [], answer


GROUP_PLAN = {
    "stages": [10, 50, 100],
    "planned_units": 2000,
    "guardrails": ["error_rate"],
    "sequential": {"mode": "group", "spending": "pocock", "looks": 4},
}


def test_a_group_sequential_plan_is_checked_with_its_planned_looks_and_adjusted_alphas(url: str) -> None:
    status, answer = http_json("POST", url + "/api/rollout-plans/check", ADMIN, {"plan": GROUP_PLAN})
    assert status == 200 and answer["ok"], answer
    seq = answer["sequential"]
    assert (seq["mode"], seq["spending"], seq["looks"]) == ("group", "pocock", 4)
    assert [r["units"] for r in seq["planned_looks"]] == [500, 1000, 1500, 2000]
    # Pocock: nearly equal per-look levels, each well below the stage's 0.025
    alphas = [r["adjusted_alpha"] for r in seq["planned_looks"]]
    assert max(alphas) < 0.025 and max(alphas) / min(alphas) < 1.6


@pytest.mark.parametrize(
    ("plan", "reason"),
    [
        ({"sequential": {"mode": "group", "looks": 4}}, "needs planned_units"),
        ({"sequential": {"mode": "group", "looks": 0}, "planned_units": 10}, "sequential.looks"),
        ({"sequential": {"mode": "group", "spending": "linear", "looks": 2}, "planned_units": 10},
         "sequential.spending"),
    ],
)  # fmt: skip
def test_an_invalid_group_sequential_plan_is_refused_with_the_reason(
    url: str, plan: dict[str, Any], reason: str
) -> None:
    status, answer = http_json("POST", url + "/api/rollout-plans/check", ADMIN, {"plan": plan})
    assert status == 200 and not answer["ok"] and any(reason in e for e in answer["errors"]), answer


def test_the_cli_prints_the_group_design_of_a_plan(url: str, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(GROUP_PLAN))
    done = subprocess.run(
        [sys.executable, "-m", "liftgate", "rollout", "check", str(path), "--analytics", url, "--token", ADMIN],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "group-sequential (pocock, 4 looks per stage" in done.stdout and "2000 units" in done.stdout
