"""The report's rl_risks section, computed from ingested interactions, feedback and judgements
(real PostgreSQL, the real ingest): each scenario fires what it should and nothing else,
small or missing data is reported as such, and the numbers are the detectors' on the
stored data."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from analytics.report.assembly import ReportOptions, build_report
from analytics.report.risks import MATRIX_METRICS, ngrams
from analytics.report.risks_schema import ALARM_NAMES, RlRisks
from contracts.rollout_plan import CategoryMetric, RiskAlarm
from tests.analytics.report_data import create_experiment
from tests.analytics.risks_data import scenario_events

# Stopped, not running: the session's snapshotters (other modules' service processes) snapshot
# every running experiment, and these carry raw responses the RL-risk section reads.
STOPPED = "stopped"

OPTS = ReportOptions(segments=False, timeseries=False)


def _risks(engine: Engine, scenario: str, units: int, seed: int, plan: dict[str, Any] | None = None,
           **kw: Any) -> tuple[int, RlRisks]:  # fmt: skip
    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
        if plan is not None:
            conn.execute(
                text("UPDATE experiments SET rollout_plan = CAST(:p AS jsonb) WHERE id = :e"),
                {"p": orjson.dumps(plan).decode(), "e": eid},
            )
    ingest(engine, scenario_events(eid, scenario, units, seed, **kw))
    with engine.connect() as conn:
        report = build_report(conn, eid, options=OPTS)
    assert len(report.rl_risks) == 1
    return eid, report.rl_risks[0]


def _firing(r: RlRisks) -> set[str]:
    return {a.name for a in r.alarms if a.firing}


def test_the_plan_vocabulary_matches_the_report_detectors() -> None:
    assert set(CategoryMetric.__args__) == set(MATRIX_METRICS)  # type: ignore[attr-defined]
    assert set(RiskAlarm.__args__) == set(ALARM_NAMES) - {"category_guardrail"}  # type: ignore[attr-defined]


def test_the_forgetting_candidate_is_caught_in_code_and_its_category_guardrail_is_breached(
    engine: Engine,
) -> None:
    plan = {"rl_risks": {"category_guardrails": [{"metric": "thumbs_down_rate", "margin": 0.10}]}}
    _, r = _risks(engine, "forgetting", 1500, seed=1, plan=plan)
    assert _firing(r) == {"forgetting", "category_guardrail"}
    forgetting = r.alarm("forgetting")
    assert forgetting is not None and forgetting.categories == ["code"]
    assert r.capability.breached == ["thumbs_down_rate/code"]
    math_up = next(c for c in r.capability.cells if c.category == "math" and c.metric == "thumbs_up_rate")
    assert math_up.lift is not None and math_up.lift > 0.05 and not math_up.harmed
    # the display values are shrunk towards the metric's mean, never beyond the raw lift
    for c in r.capability.cells:
        assert c.state == "ok" and c.lift is not None and c.shrunk_lift is not None
        assert abs(c.shrunk_lift) <= abs(c.lift) + abs(c.lift - c.shrunk_lift)
    assert r.category_mix.state == "ok" and not r.category_mix.flagged


def test_the_reward_hacker_fires_verbosity_goodhart_and_stuffing_naming_its_phrase(engine: Engine) -> None:
    _, r = _risks(engine, "reward-hacking", 800, seed=2)
    assert {"verbosity", "goodhart", "stuffing"} <= _firing(r)
    assert "category_mix" not in _firing(r)
    assert r.verbosity.longer and r.verbosity.relative_shift is not None and r.verbosity.relative_shift > 0.5
    assert r.judge.judge_says is not None and r.judge.users_say is not None
    assert r.judge.judge_says > r.judge.users_say and r.judge.users_say < 0
    assert r.judge.summary is not None and r.judge.summary.startswith("the judge says +")
    top = r.phrases.phrases[0]
    assert top.flagged and top.phrase in {"great", "question", "great question"}
    assert top.rate_candidate == 1.0 and top.rate_control == 0.0
    assert set(top.categories) == {"code", "math", "chat"}
    assert top.judge_with is not None and top.outcome_with is not None
    assert "great question" in r.phrases.flagged


def test_the_honest_better_candidate_and_an_aa_test_fire_nothing(engine: Engine) -> None:
    for scenario, seed in (("honest", 3), ("aa", 4)):
        _, r = _risks(engine, scenario, 800, seed=seed)
        assert _firing(r) == set(), (scenario, [a for a in r.alarms if a.firing])
        assert {a.name for a in r.alarms} == set(ALARM_NAMES)
        assert all(a.state == "ok" for a in r.alarms if a.name != "category_guardrail"), r.alarms


def test_small_experiments_report_insufficient_data_and_never_alarm(engine: Engine) -> None:
    _, r = _risks(engine, "reward-hacking", 12, seed=5)
    assert _firing(r) == set()
    assert {a.state for a in r.alarms} == {"insufficient_data"}
    assert r.verbosity.reason is not None and "at least 30 per arm" in r.verbosity.reason
    assert all(c.state == "insufficient_data" and c.p_value_harm is None for c in r.capability.cells)


def test_without_judge_or_stored_text_those_parts_are_unavailable(engine: Engine) -> None:
    _, r = _risks(engine, "reward-hacking", 200, seed=6, judged=False, content=False)
    assert r.judge.state == "unavailable" and "judge sampler" in (r.judge.reason or "")
    assert r.phrases.state == "unavailable" and "content logging" in (r.phrases.reason or "")
    assert r.verbosity.state == "ok"
    assert r.alarm("goodhart") is not None and r.alarm("goodhart").state == "unavailable"  # type: ignore[union-attr]


def test_matrix_numbers_are_the_per_unit_ratios_of_the_stored_events(engine: Engine) -> None:
    eid, r = _risks(engine, "forgetting", 300, seed=7)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT i.variant, count(*), count(*) FILTER (WHERE f.kind = 'thumbs_down'), count(DISTINCT i.unit_id)"
                " FROM interactions i LEFT JOIN feedback f ON f.request_id = i.request_id"
                " WHERE i.experiment_id = :e AND i.category = 'code' GROUP BY 1"
            ),
            {"e": eid},
        ).all()
    by = {v: (n, down, units) for v, n, down, units in rows}
    cell = next(c for c in r.capability.cells if c.category == "code" and c.metric == "thumbs_down_rate")
    assert cell.n_control == by["control"][2] and cell.n_candidate == by["candidate"][2]
    assert cell.control_mean is not None and cell.candidate_mean is not None
    assert np.isclose(cell.control_mean, by["control"][1] / by["control"][0])
    assert np.isclose(cell.candidate_mean, by["candidate"][1] / by["candidate"][0])
    shares = {s.category: s for s in r.category_mix.shares}
    assert np.isclose(sum(s.control or 0.0 for s in shares.values()), 1.0)


def test_ngrams_are_lower_cased_word_one_to_three_grams() -> None:
    assert ngrams("Great question! It's 2x") == {
        "great", "question", "it's", "2x", "great question", "question it's", "it's 2x",
        "great question it's", "question it's 2x",
    }  # fmt: skip
    assert ngrams("") == set()


def test_a_recent_snapshots_section_is_reused_within_its_max_age_and_recomputed_after(engine: Engine) -> None:
    from datetime import timedelta

    from analytics.report.snapshots import save_snapshot

    eid, _ = _risks(engine, "aa", 60, seed=8)
    with engine.begin() as conn:
        report = build_report(conn, eid, options=OPTS)
        save_snapshot(conn, report, source="api")
    computed = report.rl_risks[0].computed_at
    assert computed is not None
    ingest(engine, scenario_events(eid, "aa", 40, seed=9))  # more data: a new section would differ
    reuse = ReportOptions(segments=False, timeseries=False, rl_risks_max_age_s=300.0)
    with engine.connect() as conn:
        again = build_report(conn, eid, options=reuse, now=computed + timedelta(seconds=299))
        later = build_report(conn, eid, options=reuse, now=computed + timedelta(seconds=301))
    assert again.rl_risks == report.rl_risks
    assert later.rl_risks[0].computed_at == computed + timedelta(seconds=301)
    before, after = report.rl_risks[0].verbosity.decomposition, later.rl_risks[0].verbosity.decomposition
    assert before is not None and after is not None
    assert after.responses_control > before.responses_control


def test_above_max_units_a_hash_sample_of_units_is_read_in_both_arms(engine: Engine) -> None:
    from analytics.report.risks import RiskOptions, rl_risks

    eid, full = _risks(engine, "aa", 200, seed=10)
    with engine.connect() as conn:
        sampled = rl_risks(conn, eid, "control", ["candidate"], RiskOptions(max_units=200))[0]
    assert full.units_share == 1.0 and sampled.units_share == 0.5
    assert 70 <= sampled.units_control <= 130 and 70 <= sampled.units_candidate <= 130
    with engine.connect() as conn:  # the same units every time (a hash, not a draw)
        again = rl_risks(conn, eid, "control", ["candidate"], RiskOptions(max_units=200))[0]
    assert (again.units_control, again.units_candidate) == (sampled.units_control, sampled.units_candidate)
