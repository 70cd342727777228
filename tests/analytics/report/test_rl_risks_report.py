"""The report's rl_risks section, computed from ingested interactions, feedback and judgements
(real PostgreSQL, the real ingest): each scenario fires what it should and nothing else,
small or missing data is reported as such, and the numbers are the detectors' on the
stored data."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from analytics.report.assembly import ReportOptions, build_report
from analytics.report.risks import MATRIX_METRICS, ngrams, rl_risks
from analytics.report.risks_schema import ALARM_NAMES, RlRisks
from contracts.events import FeedbackEvent
from contracts.rollout_plan import CategoryMetric, RiskAlarm
from tests.analytics.report_data import create_experiment
from tests.analytics.risks_data import scenario_events

pytestmark = pytest.mark.long  # a minute or more in CI: scheduled first (tests/conftest.py)

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


def test_above_max_units_a_hash_sample_of_units_feeds_the_decomposition_and_judge_parts(
    engine: Engine,
) -> None:
    # The mix, the matrix and the length shift read every unit's sums (rl_rollups); the
    # unit-clustered bootstraps (length decomposition, judge) read a hash sample of units.
    from analytics.report.risks import RiskOptions, rl_risks

    eid, full = _risks(engine, "aa", 200, seed=10)
    with engine.connect() as conn:
        sampled = rl_risks(conn, eid, "control", ["candidate"], RiskOptions(max_units=200))[0]
    assert full.units_share == 1.0 and sampled.units_share == 0.5 and sampled.judge.judged_share == 0.5
    assert (
        (sampled.units_control, sampled.units_candidate)
        == (full.units_control, full.units_candidate)
        == (200, 200)
    )
    assert sampled.capability.cells == full.capability.cells and sampled.category_mix == full.category_mix
    dec, dec_full = sampled.verbosity.decomposition, full.verbosity.decomposition
    assert dec is not None and dec_full is not None and dec_full.units == 400
    assert 140 <= dec.units <= 260
    assert 0 < sampled.judge.judged_control < full.judge.judged_control
    with engine.connect() as conn:  # the same units every time (a hash, not a draw)
        again = rl_risks(conn, eid, "control", ["candidate"], RiskOptions(max_units=200))[0]
    assert again.verbosity.decomposition == dec and again.judge.judged_control == sampled.judge.judged_control


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths where two dumped sections differ (an empty list: equal; floats to 1e-9)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")
        ]
    if isinstance(a, float) and isinstance(b, float):  # sums in another order: the last bits
        return [] if np.isclose(a, b, rtol=1e-9, atol=1e-12) else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_the_section_from_the_ingest_rollups_equals_the_one_from_the_stored_rows(engine: Engine) -> None:
    # rl_rollups is folded at ingest (COPY path, then a redelivery through the ON CONFLICT
    # path, feedback before and after its response); RL_ROWS defines it on the stored rows.
    # Every number of the section must be the same either way.
    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
    events = scenario_events(eid, "reward-hacking", 300, seed=11)
    feedback = [e for e in events if isinstance(e, FeedbackEvent)]
    rest = [e for e in events if not isinstance(e, FeedbackEvent)]
    ingest(engine, feedback[:100])  # stored before its interaction: attributed later
    ingest(engine, rest)
    ingest(engine, feedback[100:] + rest[:50])  # a redelivery in the batch: ON CONFLICT path
    ingest(engine, feedback[50:150])  # feedback redelivered: counted once
    with engine.connect() as conn:
        (by_rollups,) = rl_risks(conn, eid, "control", ["candidate"])
        (by_rows,) = rl_risks(conn, eid, "control", ["candidate"], rows=True)
        stored = conn.execute(text("SELECT count(*), sum(thumbs_up + thumbs_down) FROM rl_rollups"
                                   " WHERE experiment_id = :e"), {"e": eid}).one()  # fmt: skip
    assert stored[0] > 300 and stored[1] > 100  # the comparison is not of empty sections
    assert by_rollups.verbosity.state == "ok" and by_rollups.capability.state == "ok"
    skip = {"build_seconds", "computed_at"}
    assert _differences(by_rollups.model_dump(exclude=skip), by_rows.model_dump(exclude=skip)) == []


def test_compacting_rl_rollups_mid_ingest_changes_no_number_of_the_section(engine: Engine) -> None:
    # The background compaction sums appended rows into one row per key, in chunks, while
    # ingest goes on: after a partial and a full compaction, and appends on top, the section
    # is still the one computed from the stored rows, and a key has one compacted row.
    from analytics.ingest.rollups import compact_rl_rollups
    from analytics.ingest.write import psycopg_connection

    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
    events = scenario_events(eid, "reward-hacking", 300, seed=13)
    half = len(events) // 2
    skip = {"build_seconds", "computed_at"}

    def compact(chunk: int, deadline: float | None = None) -> int:
        with psycopg_connection(engine) as pg:
            return compact_rl_rollups(pg, eid, chunk=chunk, deadline=deadline)

    def same_as_rows() -> str:
        with engine.connect() as conn:
            (by_rollups,) = rl_risks(conn, eid, "control", ["candidate"])
            (by_rows,) = rl_risks(conn, eid, "control", ["candidate"], rows=True)
        assert _differences(by_rollups.model_dump(exclude=skip), by_rows.model_dump(exclude=skip)) == []
        return by_rollups.capability.state

    ingest(engine, events[:half])
    assert compact(50, deadline=0.0) == 50  # one chunk: compacted and appended rows side by side
    same_as_rows()
    ingest(engine, events[half:])
    assert compact(1_000) > 0
    assert same_as_rows() == "ok"  # not a comparison of empty sections
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT count(*), count(*) FILTER (WHERE compacted), count(DISTINCT (variant, unit_id,"
                 " category, lbin)) FROM rl_rollups WHERE experiment_id = :e"), {"e": eid}
        ).one()  # fmt: skip
    assert rows[0] == rows[1] == rows[2] > 100


def test_every_gateway_category_at_once_is_tested_with_the_per_row_numbers(engine: Engine) -> None:
    # The gateway assigns up to 64 rule categories plus "other": the per-unit pivot holds
    # them all (its cross-products travel as an array, within PostgreSQL's column limit).
    import random

    from tests.analytics.ingest_helpers import feedback, interaction

    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED)
    rng = random.Random(12)
    categories = [f"c{i:02d}" for i in range(64)] + ["other"]
    events: list[Any] = []
    for arm in ("control", "candidate"):
        for u in range(80):  # 32-48 units per category and arm: enough to test (min_units 30)
            for c in categories[u % 5 :: 2]:  # units overlap categories differently
                e = interaction(eid, arm, f"{arm}-{u}", category=c, completion_tokens=rng.randrange(1, 500))
                events.append(e)
                if rng.random() < 0.5:
                    events.append(feedback(e, rng.choice(("thumbs_up", "thumbs_down"))))
    ingest(engine, events)
    with engine.connect() as conn:
        (r,) = rl_risks(conn, eid, "control", ["candidate"])
        (rows,) = rl_risks(conn, eid, "control", ["candidate"], rows=True)
    assert len(r.capability.categories) == 65 and len(r.category_mix.shares) == 65
    assert len(r.capability.cells) == 65 * 3 and r.category_mix.state == "ok"
    assert any(c.state == "ok" for c in r.capability.cells)
    skip = {"build_seconds", "computed_at"}
    assert _differences(r.model_dump(exclude=skip), rows.model_dump(exclude=skip)) == []
