"""Rollout reports over events through the real ingest path: SRM under ramps, and the
verdict derived from the controller's own guardrails and evidence (one source of truth)."""

from __future__ import annotations

from datetime import datetime, timedelta

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from analytics.report.assembly import ReportOptions, RolloutViewMissing, build_report
from analytics.rollout import view
from analytics.rollout.controller import Controller, measure
from analytics.rollout.plan import parse_plan
from analytics.rollout.telemetry import for_registry
from control import rollout
from tests.analytics.ramp_data import T0, Behaviour, Ramp, create_rollout, population

OPTS = ReportOptions(timeseries=False, rollout=view.report_part)
RAMP_PLAN = {"stages": [10, 25, 50, 100], "min_duration_s": 10, "min_units": 10, "interval_s": 0,
             "planned_units": 2000}  # fmt: skip
STAGE_S = 300.0


def _ramp_to_half(ramp: Ramp, calls: int = 3000) -> datetime:
    """Stages 10% → 25% → 50%, ``calls`` calls in each; returns the time after the last."""
    t = T0
    for stage, pct in enumerate((10.0, 25.0, 50.0)):
        ramp.set_stage(stage, pct, t)
        ramp.send(t, calls, seconds=STAGE_S)
        t += timedelta(seconds=STAGE_S)
    return t


def test_a_normal_ramp_never_raises_the_sample_ratio_mismatch_banner(db: Session) -> None:
    eid, salt = create_rollout(db, RAMP_PLAN, metrics=["error_rate"], salt="ramp")
    now = _ramp_to_half(population(db, eid, salt, 1000, seed=3))
    report = build_report(db.connection(), eid, now=now, options=OPTS)
    assert report.srm.method == "per_stage"
    assert not report.srm.flagged, report.srm
    assert [s.stage for s in report.srm.stages] == [0, 1, 2]
    assert [s.expected_share["candidate"] for s in report.srm.stages] == [0.10, 0.25, 0.50]
    assert [s.percent for s in report.srm.stages] == [10.0, 25.0, 50.0]
    assert all(s.p_value is not None and not s.flagged for s in report.srm.stages)
    # the allocation table shows the current stage against its weights
    shares = {a.variant: (a.expected_share, a.observed_units) for a in report.allocation}
    assert shares["candidate"][0] == 0.5
    assert shares["candidate"][1] == report.srm.stages[2].units["candidate"]
    assert report.verdicts[0].verdict != "srm"


def test_a_rollout_report_without_the_controllers_view_is_refused_not_judged_as_an_experiment(
    db: Session,
) -> None:
    eid, _ = create_rollout(db, RAMP_PLAN, metrics=["error_rate"], salt="ramp")
    with pytest.raises(RolloutViewMissing, match="is a rollout"):
        build_report(db.connection(), eid, now=T0, options=ReportOptions(timeseries=False))


def test_candidate_units_lost_during_a_ramp_still_raise_the_banner(db: Session) -> None:
    eid, salt = create_rollout(db, RAMP_PLAN, metrics=["error_rate"], salt="ramp")
    now = _ramp_to_half(population(db, eid, salt, 2000, seed=3, lose_candidate=0.3), calls=6000)
    report = build_report(db.connection(), eid, now=now, options=OPTS)
    assert report.srm.method == "per_stage"
    assert report.srm.flagged and report.srm.p_value is not None and report.srm.p_value < 0.001
    assert any(s.flagged for s in report.srm.stages)
    assert report.verdicts[0].verdict == "srm"


def test_a_ramp_without_stage_tags_counts_each_unit_once_where_it_was_first_served(db: Session) -> None:
    eid, salt = create_rollout(db, RAMP_PLAN, metrics=["error_rate"], salt="ramp")
    now = _ramp_to_half(population(db, eid, salt, 1000, seed=4, tag_stages=False))
    report = build_report(db.connection(), eid, now=now, options=OPTS)
    assert report.srm.method == "first_exposure"
    assert report.srm.p_value is not None and not report.srm.flagged, report.srm
    # units moved to the candidate by the last ramp got a new candidate row in this stage:
    # counted once, under the control they were first served by, they are not new units
    shown = sum(a.observed_units for a in report.allocation)
    rows_in_stage = (
        db.connection()
        .execute(
            text("SELECT count(*) FROM unit_rollups WHERE experiment_id = :e AND first_ts >= :t"),
            {"e": eid, "t": T0 + timedelta(seconds=2 * STAGE_S + 2)},
        )
        .scalar_one()
    )
    assert 0 < shown < rows_in_stage


# --- one source of truth ----------------------------------------------------------------------


FAST = {"stages": [5, 25, 50, 100], "min_duration_s": 10, "min_units": 10, "interval_s": 0,
        "planned_units": 2000, "guardrails": [{"metric": "error_rate", "margin": 0.25},
                                               {"metric": "latency_mean", "margin": 0.2}]}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _drive(engine: Engine, ramp: Ramp, clock: Clock, steps: int, *, until_stage: int | None = None) -> None:
    """The real controller on an injected clock, ``steps`` rounds of 2 s of traffic."""
    controller = Controller(engine, for_registry(CollectorRegistry()), clock=clock, srm_grace_s=2.0)
    controller.evaluate(ramp.experiment_id)
    for _ in range(steps):
        ramp.send(clock.now, 250, seconds=2.0)
        clock.now += timedelta(seconds=2)
        controller.evaluate(ramp.experiment_id)
        with engine.connect() as conn:
            row = rollout.load(conn, ramp.experiment_id)
        assert row is not None
        if row.status != "running" or (until_stage is not None and (row.stage or 0) >= until_stage):
            return


def test_a_running_rollouts_report_shows_the_plans_guardrails_and_the_controllers_live_evidence(
    engine: Engine,
) -> None:
    eid, salt = create_rollout(
        engine, FAST, metrics=["thumbs_down_rate", "latency_mean", "latency_p95"], salt="ramp"
    )
    ramp = population(engine, eid, salt, 1500, seed=5)
    clock = Clock()
    _drive(engine, ramp, clock, 40, until_stage=1)
    ramp.send(clock.now, 250, seconds=2.0)
    clock.now += timedelta(seconds=2)
    with engine.connect() as conn:
        report = build_report(conn, eid, now=clock.now, options=OPTS)
        row = rollout.load(conn, eid)
        assert row is not None and row.status == "running" and row.stage == 1
        plan = parse_plan(row.plan)
        expected = measure(conn, row, plan, plan.stage(1), clock.now, 2.0).evidence("x")
        last = rollout.decisions(conn, eid)[-1]
    section = report.rollout
    assert section is not None and section.error is None
    assert [(g.metric, g.margin) for g in section.guardrails] == [("error_rate", 0.25), ("latency_mean", 0.2)]
    assert section.window == "stage" and section.stage == 1 and section.stage_percent == 25
    # the catalogue's guardrail flags give way to the plan's: latency_mean guards at 20%
    info = {m.name: m for m in report.metrics}
    assert info["latency_mean"].guardrail and info["latency_mean"].margin == 0.2
    assert info["error_rate"].guardrail and info["error_rate"].margin == 0.25
    # the live look is the controller's measure at the report's time, on the same window
    assert section.look is not None
    assert orjson.loads(orjson.dumps(section.look.evidence["guardrails"])) == orjson.loads(
        orjson.dumps(expected["guardrails"])
    )
    assert section.look.evidence["srm"]["counts"] == expected["srm"]["counts"]
    assert section.decisions[-1].id == last.id and section.decisions[-1].evidence == last.evidence
    [verdict] = report.verdicts
    assert verdict.basis is not None and "live look at 25%" in verdict.basis
    assert verdict.verdict in ("insufficient_data", "no_difference_yet", "ship")
    # a latency quantile in the cumulative table is fixed-horizon and not yet valid here
    p95 = report.result("latency_p95", "candidate")
    assert p95 is not None and p95.guardrail is not None and p95.guardrail.test == "fixed_horizon"
    assert p95.guardrail.outcome != "fail"


def test_a_harmful_candidate_is_harm_on_the_same_evidence_that_rolled_it_back(engine: Engine) -> None:
    eid, salt = create_rollout(engine, FAST, metrics=["error_rate", "thumbs_down_rate"], salt="ramp")
    ramp = population(engine, eid, salt, 1500, seed=6)
    ramp.behaviour["candidate"] = Behaviour(error_p=0.3)
    clock = Clock()
    _drive(engine, ramp, clock, 60)
    with engine.connect() as conn:
        row = rollout.load(conn, eid)
        assert row is not None and row.status == "rolled_back", rollout.decisions(conn, eid)[-1]
        report = build_report(conn, eid, now=clock.now + timedelta(minutes=5), options=OPTS)
        rollback = rollout.decisions(conn, eid)[-1]
    assert report.rollout is not None and report.rollout.decisions[-1].id == rollback.id
    [verdict] = report.verdicts
    assert verdict.verdict == "harm" and verdict.failed_guardrails == ["error_rate"]
    at = f"rolled back at {rollback.evidence['stage_percent']:g}% on stage-window evidence"
    assert verdict.basis is not None and verdict.basis.startswith(at)
    harmed = next(g for g in rollback.evidence["guardrails"] if g["metric"] == "error_rate")
    assert f"harm {harmed['harm']:+.1%}" in verdict.reason


def test_a_completed_rollout_never_shows_harm_without_saying_which_evidence_the_controller_used(
    engine: Engine,
) -> None:
    # The candidate's mean latency equals the control's, its tail is far longer: the plan
    # guards the mean (per unit, always valid); the cumulative table also shows the p95.
    eid, salt = create_rollout(
        engine, FAST, metrics=["error_rate", "latency_mean", "latency_p95"], salt="ramp"
    )
    ramp = population(engine, eid, salt, 600, seed=7)
    ramp.behaviour["candidate"] = Behaviour(latency_ms=400.0 * 0.72, latency_sigma=0.9)
    t = T0
    for stage, pct in enumerate((5.0, 25.0, 50.0)):
        ramp.set_stage(stage, pct, t)
        ramp.send(t, 4000, seconds=STAGE_S)
        t += timedelta(seconds=STAGE_S)
    with engine.begin() as conn:
        row = rollout.load(conn, eid)
        assert row is not None
        plan = parse_plan(row.plan)
        look = measure(conn, row, plan, plan.stage(2), t, 2.0)
        # what the controller records when it promotes at the 50% stage
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
    harmed = [g["metric"] for g in look.evidence("x")["guardrails"] if g["outcome"] == "harm"]
    assert harmed == []  # the controller's evidence shows no harm
    with engine.connect() as conn:
        report = build_report(conn, eid, now=t + timedelta(minutes=1), options=OPTS)
    assert report.status == "completed"
    p95 = report.result("latency_p95", "candidate")
    assert p95 is not None and p95.guardrail is not None
    assert p95.guardrail.outcome == "fail"  # the experiment has stopped: its last look counts
    [verdict] = report.verdicts
    assert verdict.verdict != "harm" and verdict.failed_guardrails == []
    assert verdict.basis is not None and verdict.basis.startswith("promoted at 50% on stage-window evidence")
    [note] = [d for d in verdict.differences if "latency_p95" in d]
    assert note.startswith(
        "promoted at 50% on stage-window evidence; the cumulative report now shows latency_p95 failed"
    )
    assert "fixed-horizon, request-level" in note


@pytest.mark.parametrize("raw", [{"stages": [50, 10]}, {"guardrails": ["latency_p95"]}])
def test_a_rollout_with_an_invalid_plan_is_insufficient_data_with_the_reason(
    db: Session, raw: dict[str, object]
) -> None:
    eid, salt = create_rollout(db, raw, metrics=["error_rate"], salt="ramp")
    ramp = population(db, eid, salt, 200, seed=8)
    ramp.set_stage(0, 10.0, T0)
    ramp.send(T0, 1000, seconds=60)
    report = build_report(db.connection(), eid, now=T0 + timedelta(minutes=2), options=OPTS)
    [verdict] = report.verdicts
    assert verdict.verdict == "insufficient_data" and "invalid rollout plan" in verdict.reason
    assert report.rollout is not None and report.rollout.error is not None
    assert report.rollout.error.code == "plan_invalid"


def test_the_reports_live_look_uses_the_controllers_srm_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    from analytics.rollout.settings import RolloutSettings
    from analytics.service.settings import AnalyticsSettings

    monkeypatch.setenv("LIFTGATE_ROLLOUT_SRM_GRACE_S", "7.5")
    monkeypatch.setenv("LIFTGATE_ADMIN_TOKEN", "grace-test-token-9f3b2c1a")
    assert (
        ReportOptions.from_settings(AnalyticsSettings()).srm_grace_s
        == RolloutSettings().rollout_srm_grace_s
        == 7.5
    )  # type: ignore[call-arg]
