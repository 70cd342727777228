"""``POST /api/rollout-plans/check`` with text no route or metric can have: a 422 with the
reason, never a 500. Found by the fuzz suite (tests/fuzz/test_analytics_fuzz.py): a NUL in the
route or in a guardrail's metric name reached PostgreSQL, which cannot hold NUL in text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.analytics.web.services import analytics_service
from tests.fuzz.services import http_json
from tests.known_secrets import secret

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
