"""The CLI's table rendering of real reports: segment regressions and shadow pairs stand out."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from sqlalchemy.orm import Session

from analytics.ingest.write import ingest
from analytics.report.assembly import ReportOptions, build_report
from analytics.report.schema import Report
from contracts.events import Event, InteractionEvent
from liftgate.cli_report import render
from tests.analytics.report_data import T0, Units, create_experiment, insert_units, simulate_units


def _text(report: Report) -> str:
    console = Console(record=True, width=220)
    render(report, console)
    return console.export_text()


def test_table_names_the_segment_where_the_candidate_regresses(db: Session) -> None:
    rng = np.random.default_rng(41)
    conn = db.connection()
    eid, name = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    for variant in ("control", "candidate"):
        code = simulate_units(
            rng, 1500, thumbs_p=0.30 if variant == "control" else 0.12, tokens=100, error_p=0.05
        )
        chat = simulate_units(
            rng, 1500, thumbs_p=0.20 if variant == "control" else 0.30, tokens=100, error_p=0.05
        )
        insert_units(conn, eid, variant, code, segment="task=code", prefix=f"{variant}-code")
        insert_units(conn, eid, variant, chat, segment="task=chat", prefix=f"{variant}-chat")
        insert_units(conn, eid, variant, Units({k: np.concatenate([code[k], chat[k]]) for k in code.columns}))
    out = _text(build_report(conn, eid, options=ReportOptions(timeseries=False)))
    assert f"{name} (id {eid})" in out and "SRM: ok" in out
    assert "task=code (3,000 units): thumbs_up_rate candidate worse" in out
    assert "task=chat (3,000 units): thumbs_up_rate candidate better" in out
    assert "verdict candidate:" in out


def test_table_shows_the_paired_comparison_of_a_shadow_experiment(db: Session) -> None:
    rng = np.random.default_rng(43)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("baseline", 1), ("cand", 0)], mode="shadow", metrics=["error_rate"])
    events: list[Event] = []
    for i in range(50):
        common = {"route": "r", "unit_id": f"u{i}", "unit_source": "header", "mode": "shadow", "endpoint": "chat",
                  "model": "m", "upstream": "up", "status": "ok", "http_status": 200, "experiment_id": eid,
                  "ts": T0.timestamp() + i}  # fmt: skip
        lat = float(rng.gamma(4, 50))
        events.append(InteractionEvent(request_id=f"{eid}-{i}", role="primary", variant="baseline",
                                       latency_ms=lat, **common))  # type: ignore[arg-type]  # fmt: skip
        events.append(InteractionEvent(request_id=f"{eid}-{i}-s", role="shadow", variant="cand", pair_id=f"{eid}-{i}",
                                       latency_ms=lat + 100, **common))  # type: ignore[arg-type]  # fmt: skip
    ingest(db, events)
    out = _text(build_report(conn, eid, now=T0.replace(hour=1), options=ReportOptions(timeseries=False)))
    assert "shadow pairs: cand vs baseline (50 pairs)" in out
    assert "latency_ms" in out and "agreement 100.0% (same status and finish reason" in out
    assert "SRM: shadow experiments serve every unit the control" in out


def test_table_says_which_evidence_a_rollout_verdict_rests_on_and_where_the_table_differs(
    db: Session,
) -> None:
    from analytics.report.schema import ErrorInfo, Guardrail, Verdict

    rng = np.random.default_rng(45)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    for variant in ("control", "candidate"):
        insert_units(conn, eid, variant, simulate_units(rng, 200, thumbs_p=0.2, tokens=100, error_p=0.05))
    report = build_report(conn, eid, options=ReportOptions(timeseries=False, segments=False))
    note = "promoted at 50% on stage-window evidence; the cumulative report now shows latency_p95 failed"
    verdict = Verdict(variant="candidate", verdict="ship", reason="every plan guardrail shown non-inferior",
                      basis="promoted at 50% on stage-window evidence (by controller)", differences=[note])  # fmt: skip
    why = ErrorInfo(code="not_yet_valid", message="fixed-horizon, not yet valid")
    guard = Guardrail(outcome="inconclusive", margin=0.1, bound=0.3, test="fixed_horizon", error=why)
    row = report.results[-1].model_copy(update={"guardrail": guard})
    out = _text(report.model_copy(update={"verdicts": [verdict], "results": [*report.results[:-1], row]}))
    assert "on promoted at 50% on stage-window evidence (by controller)" in out
    assert f"≠ {note}" in out
    assert "guardrail fixed-horizon, not yet valid" in out


def test_a_metric_without_a_sequential_test_reads_fixed_horizon_only_not_not_significant(db: Session) -> None:
    """A quantile metric has a fixed-horizon p and no always-valid one, so the verdict policy
    (Holm-corrected sequential p) never calls it: a row reading "p <0.001 … n.s." told the
    user the difference was not significant. It says it has no verdict-grade test instead;
    a metric with a sequential test that is not significant still reads "n.s."."""
    rng = np.random.default_rng(47)
    conn = db.connection()
    eid, _ = create_experiment(
        conn, [("control", 1), ("candidate", 1)], metrics=["latency_p50", "error_rate"]
    )
    events: list[Event] = []
    for variant, scale in (("control", 300.0), ("candidate", 450.0)):
        for i in range(400):
            events.append(InteractionEvent(
                request_id=f"{eid}-{variant}-{i}", route="r", unit_id=f"{variant}-{i % 200}", unit_source="header",
                role="primary", mode="ab", endpoint="chat", model="m", upstream="up", status="ok", http_status=200,
                latency_ms=float(rng.gamma(8, scale / 8)), experiment_id=eid, variant=variant,
                ts=T0.timestamp() + i))  # fmt: skip
    ingest(db, events)
    report = build_report(conn, eid, now=T0.replace(hour=1), options=ReportOptions(timeseries=False))
    p50 = next(r for r in report.results if r.metric == "latency_p50" and not r.is_control)
    assert p50.p_value is not None and p50.p_value < 1e-6 and p50.p_value_sequential is None
    assert not p50.significant
    rows = {line.split("│")[1].strip(): line for line in _text(report).splitlines() if line.count("│") > 5}
    p50_row = next(
        line for metric, line in rows.items() if metric.startswith("latency_p50") and "candidate" in line
    )
    assert "fixed-horizon only" in p50_row and "n.s." not in p50_row, p50_row
    errors = next(
        line for metric, line in rows.items() if metric.startswith("error_rate") and "candidate" in line
    )
    assert "fixed-horizon only" not in errors
