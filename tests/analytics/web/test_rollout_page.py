"""The rollout page in a real Chromium against the real analytics service, for rollouts
driven by the real controller over events through the real ingest: every decision shows
the evidence it was taken on, a normal ramp shows no SRM banner, and a completed rollout
whose cumulative table disagrees says which evidence the controller used."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from analytics.rollout.controller import Controller, measure
from analytics.rollout.plan import parse_plan
from analytics.rollout.telemetry import for_registry
from control import rollout
from tests.analytics.ramp_data import Behaviour, create_rollout, population
from tests.analytics.web.conftest import WatchedPage, snapshot
from tests.analytics.web.test_dashboard import SCREENSHOTS, assert_numbers_match, open_page, shown_numbers
from tests.services import READ_TOKEN, get_json

PLAN = {"stages": [5, 25, 50, 100], "min_duration_s": 10, "min_units": 10, "interval_s": 0,
        "planned_units": 2000, "guardrails": [{"metric": "error_rate", "margin": 0.25},
                                               {"metric": "latency_mean", "margin": 0.2}]}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rollouts:
    ramping: str
    completed: str


def _name(engine: Engine, eid: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT name FROM experiments WHERE id = :e"), {"e": eid}).scalar_one())


def _ramping(engine: Engine) -> str:
    """Ramped by the real controller (5% → 25% → 50%) on an injected clock."""
    eid, salt = create_rollout(
        engine, PLAN, metrics=["error_rate", "latency_mean", "thumbs_down_rate"], salt="web"
    )
    ramp = population(engine, eid, salt, 1500, seed=21)
    now = datetime.now(UTC) - timedelta(minutes=30)
    controller = Controller(engine, for_registry(CollectorRegistry()), clock=lambda: now, srm_grace_s=2.0)
    controller.evaluate(eid)
    for _ in range(200):
        ramp.send(now, 250, seconds=2.0)
        now += timedelta(seconds=2)
        controller.evaluate(eid)
        with engine.connect() as conn:
            row = rollout.load(conn, eid)
        assert row is not None and row.status == "running", row
        if (row.stage or 0) >= 2:
            break
    ramp.send(now, 400, seconds=4.0)  # some traffic in the 50% stage, for the live look
    assert row.stage == 2
    return _name(engine, eid)


def _completed(engine: Engine) -> str:
    """Ramped to 50% and promoted on stage-window evidence; the candidate's latency tail is
    far longer than the control's at the same mean (the cumulative p95 fails)."""
    eid, salt = create_rollout(
        engine, PLAN, metrics=["error_rate", "latency_mean", "latency_p95"], salt="web"
    )
    ramp = population(engine, eid, salt, 600, seed=22)
    ramp.behaviour["candidate"] = Behaviour(latency_ms=400.0 * 0.72, latency_sigma=0.9)
    t = datetime.now(UTC) - timedelta(hours=1)
    for stage, pct in enumerate((5.0, 25.0, 50.0)):
        ramp.set_stage(stage, pct, t)
        ramp.send(t, 4000, seconds=300)
        t += timedelta(seconds=300)
    with engine.begin() as conn:
        row = rollout.load(conn, eid)
        assert row is not None
        plan = parse_plan(row.plan)
        look = measure(conn, row, plan, plan.stage(2), t, 2.0)
        conn.execute(
            text(
                "INSERT INTO rollout_decisions (experiment_id, stage, to_stage, decision, reason, actor, evidence,"
                " created_at) VALUES (:e, 2, 2, 'promote', 'final stage passed', 'controller', CAST(:ev AS jsonb), :t)"
            ),
            {
                "e": eid,
                "ev": orjson.dumps({"code": "complete", **look.evidence("complete")}).decode(),
                "t": t,
            },
        )
        rollout.promote(conn, row, "final stage passed", t)
    return _name(engine, eid)


@pytest.fixture(scope="module")
def rollouts(engine: Engine, analytics_url: str, admin_token: str) -> Iterator[Rollouts]:
    made = Rollouts(ramping=_ramping(engine), completed=_completed(engine))
    # A snapshot each: the page and the test then read the same report (the live look's
    # elapsed time would differ between two fresh computations).
    for name in (made.ramping, made.completed):
        snapshot(analytics_url, admin_token, name)
    yield made


def _evidence_rows(w: WatchedPage) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = w.page.eval_on_selector_all(
        "#rollout-timeline tr.evidence-row",
        """rs => rs.map(r => ({
            id: r.dataset.evidenceFor,
            guardrails: [...r.querySelectorAll('tr[data-guardrail]')].map(g => g.dataset.guardrail),
            outcomes: [...r.querySelectorAll('tr[data-guardrail] [data-outcome]')].map(o => o.dataset.outcome),
            srm: r.querySelector('.ev-srm')?.dataset.flagged ?? null,
            minimums: r.querySelector('.ev-min') !== null,
        }))""",
    )
    return rows


def test_every_decision_of_a_ramp_shows_its_evidence_and_no_srm_banner(
    watched: WatchedPage, analytics_url: str, rollouts: Rollouts
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{rollouts.ramping}")
    report = get_json(f"{analytics_url}/api/experiments/{rollouts.ramping}/report", READ_TOKEN)
    section = get_json(f"{analytics_url}/api/experiments/{rollouts.ramping}/rollout", READ_TOKEN)
    # a normal ramp: per-stage SRM, no banner
    assert report["srm"]["method"] == "per_stage" and not report["srm"]["flagged"]
    assert watched.page.get_attribute("#srm-banner", "data-flagged") == "false"
    assert "banner ok" in (watched.page.get_attribute("#srm-banner", "class") or "")
    assert len(report["srm"]["stages"]) == 3
    # each decision has an evidence row with the guardrails, SRM and minimums it was taken on
    shown = {r["id"]: r for r in _evidence_rows(watched)}
    assert set(shown) == {str(d["id"]) for d in section["decisions"]}
    tested = [d for d in section["decisions"] if d["evidence"].get("guardrails")]
    assert len(tested) >= 2  # the advances out of 5% and 25%
    for d in tested:
        row = shown[str(d["id"])]
        assert row["guardrails"] == [g["metric"] for g in d["evidence"]["guardrails"]]
        assert row["outcomes"] == [g["outcome"] for g in d["evidence"]["guardrails"]]
        assert row["srm"] == str(d["evidence"]["srm"]["flagged"]).lower()
        assert row["minimums"]
    # every number in the timeline is the rollout API's, every other one the report's
    numbers = shown_numbers(watched, "#rollout")
    assert any("/evidence/guardrails/" in n["ptr"] for n in numbers)
    assert_numbers_match(numbers, section)
    assert_numbers_match(shown_numbers(watched, "main"), report)
    # the live look and the plan's guardrails, from the report's rollout section
    assert watched.page.is_visible("#rollout-look-card")
    plan_guards = watched.page.eval_on_selector_all(
        "[data-plan-guardrail]", "es => es.map(e => e.dataset.planGuardrail)"
    )
    assert plan_guards == ["error_rate", "latency_mean"]
    look_ptrs = [n["ptr"] for n in shown_numbers(watched, "#live-look")]
    assert any(p.startswith("/rollout/look/evidence/guardrails/") for p in look_ptrs)
    basis = watched.page.inner_text(".verdict [data-basis]")
    assert "live look at 50%" in basis
    watched.page.screenshot(path=str(SCREENSHOTS / "rollout-evidence.png"), full_page=True)
    assert watched.errors == []


def test_a_completed_rollout_says_which_evidence_the_controller_used_where_the_table_differs(
    watched: WatchedPage, analytics_url: str, rollouts: Rollouts
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{rollouts.completed}")
    report = get_json(f"{analytics_url}/api/experiments/{rollouts.completed}/report", READ_TOKEN)
    assert report["status"] == "completed"
    [verdict] = report["verdicts"]
    assert verdict["verdict"] != "harm"
    assert watched.page.get_attribute("[data-status]", "data-status") == "completed"
    basis = watched.page.inner_text(".verdict [data-basis]")
    assert basis.startswith("on promoted at 50% on stage-window evidence")
    notes = watched.page.eval_on_selector_all(
        ".verdict ul.differences li", "ls => ls.map(l => l.textContent)"
    )
    assert notes == verdict["differences"]
    assert any("latency_p95 failed — fixed-horizon, request-level" in n for n in notes)
    assert watched.page.is_visible("#head #differs")
    # the table shows the failed p95 guardrail as what it is
    badge = watched.page.get_attribute(
        "#results tr[data-metric='latency_p95'] [data-guardrail-outcome]", "data-guardrail-outcome"
    )
    assert badge == "fail"
    assert "fixed-horizon" in watched.page.inner_text("#results tr[data-metric='latency_p95']")
    assert_numbers_match(shown_numbers(watched, "main"), report)
    assert watched.errors == []
