"""A metric the database cannot compute, or a broken stored definition, degrades the report
to an error entry for that metric; the rest of the report is computed as usual."""

from __future__ import annotations

import numpy as np
import orjson
from sqlalchemy import text
from sqlalchemy.orm import Session

from analytics.ingest.write import ingest
from analytics.report.assembly import build_report
from contracts.events import FeedbackEvent
from tests.analytics.ingest_helpers import interaction
from tests.analytics.report_data import create_experiment, insert_units, simulate_units

HUGE = 1.7e308


def _store_definition(db: Session, name: str, numerator: str) -> None:
    """As an older version stored it, before definitions were bounded."""
    definition = {"name": name, "kind": "mean", "numerator": numerator, "direction": "higher_is_better"}
    db.execute(
        text("INSERT INTO metric_definitions (name, definition) VALUES (:n, CAST(:d AS jsonb))"),
        {"n": name, "d": orjson.dumps(definition).decode()},
    )


def test_rollups_that_overflow_a_metric_leave_an_error_entry_and_the_other_metrics(db: Session) -> None:
    rng = np.random.default_rng(5)
    eid, _ = create_experiment(
        db.connection(), [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate", "signal_mean"]
    )
    for variant in ("control", "candidate"):
        insert_units(
            db.connection(), eid, variant, simulate_units(rng, 50, thumbs_p=0.2, tokens=50, error_p=0.1)
        )
    # Custom-feedback sums as stored before values were bounded at ingest.
    db.execute(
        text("UPDATE unit_rollups SET counters = CAST(:c AS jsonb) WHERE experiment_id = :e"),
        {"c": orjson.dumps({"sig": HUGE, "sig:n": 1}).decode(), "e": eid},
    )
    _store_definition(db, "signal_mean", "counters['sig']")
    report = build_report(db.connection(), eid)
    failed = [e for e in report.errors if e.code == "metric_failed"]
    assert any("signal_mean" in e.message and "out of range" in e.message for e in failed), report.errors
    assert {r.metric for r in report.results} == {"thumbs_up_rate"}
    assert all(r.units == 50 for r in report.results)


def test_a_stored_definition_with_an_unbounded_number_is_an_error_entry_not_sql_inf(db: Session) -> None:
    rng = np.random.default_rng(6)
    eid, _ = create_experiment(db.connection(), [("control", 1), ("candidate", 1)])
    for variant in ("control", "candidate"):
        insert_units(
            db.connection(), eid, variant, simulate_units(rng, 30, thumbs_p=0.2, tokens=50, error_p=0.1)
        )
    _store_definition(db, "inf_metric", "thumbs_up * 1e999")
    _store_definition(db, "deep_metric", "-" * 990 + "thumbs_up")
    _store_definition(db, "long_number", "thumbs_up * " + "9" * 400)
    report = build_report(db.connection(), eid)
    invalid = " ".join(e.message for e in report.errors if e.code == "invalid_metric")
    for name in ("inf_metric", "deep_metric", "long_number"):
        assert name in invalid
    assert "thumbs_up_rate" in {r.metric for r in report.results}  # the default set still computed


def test_a_feedback_value_of_1_7e308_is_dead_lettered_and_the_report_computes(db: Session) -> None:
    eid, _ = create_experiment(db.connection(), [("control", 1), ("candidate", 1)], metrics=["signal_sum"])
    _store_definition(db, "signal_sum", "counters['sig']")
    events: list[object] = []
    for i in range(20):
        ev = interaction(eid, "control" if i % 2 else "candidate", f"u{i}")
        events += [ev, FeedbackEvent(request_id=ev.request_id, unit_id=ev.unit_id, kind="sig", value=HUGE)]
        events.append(FeedbackEvent(request_id=ev.request_id, unit_id=ev.unit_id, kind="sig", value=2.0))
    res = ingest(db, events)  # type: ignore[arg-type]
    reasons = db.execute(
        text("SELECT reason FROM dead_letters WHERE position(CAST(:p AS bytea) IN payload) > 0"),
        {"p": f'"kind":"sig","value":{HUGE},'.encode()},
    ).all()
    assert res.dead_lettered == 20 and res.feedback == 20
    assert len(reasons) >= 20 and all(
        "field 'value' must be between -1e+09 and 1e+09" in r[0] for r in reasons
    )
    report = build_report(db.connection(), eid)
    rows = {r.variant: r for r in report.results}
    assert not [e for e in report.errors if e.code == "metric_failed"]
    assert rows["control"].mean == 2.0 and rows["candidate"].mean == 2.0
