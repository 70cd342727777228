"""Reports over events stored by the real ingest function (the consumer's and Direct sink's path)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from sqlalchemy.orm import Session
from statsmodels.stats.contingency_tables import mcnemar

from analytics.ingest.write import ingest
from analytics.report.assembly import ReportOptions, build_report
from contracts.events import Event, FeedbackEvent, InteractionEvent
from tests.analytics.report_data import T0, create_experiment

OPTS = ReportOptions(timeseries=False)


def _interaction(eid: int, name: str, variant: str, unit: str, rid: str, rng: np.random.Generator, **kw: object) -> InteractionEvent:  # fmt: skip
    fields: dict[str, object] = {
        "request_id": rid, "route": f"route-{name}", "unit_id": unit, "unit_source": "header", "role": "primary",
        "mode": "ab", "endpoint": "chat", "model": f"{variant}-m", "upstream": f"{variant}-up", "status": "ok",
        "http_status": 200, "latency_ms": float(rng.gamma(4, 50)), "experiment_id": eid, "experiment": name,
        "variant": variant, "completion_tokens": int(rng.integers(50, 150) * (1.3 if variant == "candidate" else 1)),
        "prompt_tokens": 10, "response_chars": 100, "ts": T0.timestamp() + float(rng.uniform(0, 3600)),
    }  # fmt: skip
    fields.update(kw)
    return InteractionEvent(**fields)  # type: ignore[arg-type]


def test_report_over_ingested_events_matches_per_unit_computation(db: Session) -> None:
    rng = np.random.default_rng(17)
    conn = db.connection()
    eid, name = create_experiment(conn, [("control", 1), ("candidate", 1)],
                                  metrics=["thumbs_up_rate", "completion_tokens_per_response", "tokens_per_unit"])  # fmt: skip
    events: list[Event] = []
    per_unit: dict[str, dict[str, list[float]]] = {"control": {"up": [], "req": [], "tok": [], "all": []},
                                                   "candidate": {"up": [], "req": [], "tok": [], "all": []}}  # fmt: skip
    for u in range(300):
        variant = "control" if u % 2 == 0 else "candidate"
        p_up = 0.2 if variant == "control" else 0.35
        n_req = int(rng.integers(1, 6))
        ups = tok = 0
        for k in range(n_req):
            rid = f"{eid}-{u}-{k}"
            task = "code" if u % 3 == 0 else "chat"
            ev = _interaction(eid, name, variant, f"unit-{u}", rid, rng, tags={"task": task})
            events.append(ev)
            tok += ev.completion_tokens or 0
            if rng.random() < p_up:
                ups += 1
                events.append(FeedbackEvent(request_id=rid, unit_id=f"unit-{u}", kind="thumbs_up"))
        d = per_unit[variant]
        for key, value in (("up", ups), ("req", n_req), ("tok", tok), ("all", tok + 10 * n_req)):
            d[key].append(value)
    # feedback first for some: the ingest attributes it when the interaction arrives
    events = [events[i] for i in rng.permutation(len(events))]
    result = ingest(db, events)
    assert result.interactions == sum(sum(per_unit[v]["req"]) for v in per_unit)
    report = build_report(conn, eid, options=OPTS)
    assert report.units == 300
    arr = {v: {k: np.array(x, dtype=float) for k, x in d.items()} for v, d in per_unit.items()}
    for variant in ("control", "candidate"):
        row = report.result("thumbs_up_rate", variant)
        assert row is not None
        assert row.mean == pytest.approx(arr[variant]["up"].sum() / arr[variant]["req"].sum())
        tok_row = report.result("completion_tokens_per_response", variant)
        assert tok_row is not None and tok_row.mean == pytest.approx(
            arr[variant]["tok"].sum() / arr[variant]["req"].sum()
        )
    cand = report.result("tokens_per_unit", "candidate")
    assert cand is not None
    expected = sps.ttest_ind(arr["candidate"]["all"], arr["control"]["all"], equal_var=False)
    assert cand.p_value == pytest.approx(expected.pvalue, rel=1e-6)
    # tag segments come from the ingest's segment rollups
    assert {s.segment for s in report.segments} == {"task=code", "task=chat"}
    code = next(s for s in report.segments if s.value == "code")
    assert code.units == 100


def test_shadow_experiment_reports_paired_comparison_on_same_prompts(db: Session) -> None:
    rng = np.random.default_rng(9)
    conn = db.connection()
    eid, name = create_experiment(conn, [("baseline", 1), ("shadow-cand", 0)], mode="shadow",
                                  metrics=["error_rate"])  # fmt: skip
    events: list[Event] = []
    base_lat, cand_lat, base_err, cand_err = [], [], [], []
    for i in range(200):
        rid = f"{eid}-p{i}"
        lat = float(rng.gamma(4, 50))
        b_err, c_err = rng.random() < 0.05, rng.random() < 0.15
        events.append(_interaction(eid, name, "baseline", f"u{i % 40}", rid, rng, mode="shadow", latency_ms=lat,
                                   status="error" if b_err else "ok", response="same" if i % 2 else "a"))  # fmt: skip
        c = lat * 1.3 + float(rng.normal(0, 10))
        events.append(_interaction(eid, name, "shadow-cand", f"u{i % 40}", f"{rid}-s", rng, mode="shadow", role="shadow",
                                   pair_id=rid, latency_ms=c, status="error" if c_err else "ok", response="same"))  # fmt: skip
        base_lat.append(lat)
        cand_lat.append(c)
        base_err.append(b_err)
        cand_err.append(c_err)
    ingest(db, events)
    report = build_report(conn, eid, now=T0.replace(hour=2), options=OPTS)
    assert report.srm.error is not None and report.srm.error.code == "not_applicable"
    [paired] = report.paired
    assert paired.pairs == 200 and paired.baseline == "baseline" and paired.variant == "shadow-cand"
    latency = next(m for m in paired.metrics if m.name == "latency_ms")
    diff = np.array(cand_lat) - np.array(base_lat)
    assert latency.mean_difference == pytest.approx(diff.mean())
    assert latency.p_value == pytest.approx(sps.ttest_rel(cand_lat, base_lat).pvalue, rel=1e-6)
    errors = next(m for m in paired.metrics if m.name == "error")
    assert errors.candidate_mean == pytest.approx(np.mean(cand_err))
    b = sum(1 for x, y in zip(base_err, cand_err, strict=True) if x and not y)
    c = sum(1 for x, y in zip(base_err, cand_err, strict=True) if y and not x)
    table = [[0, b], [c, 0]]  # only discordant pairs matter
    expected_p = mcnemar(table, exact=b + c < 25, correction=True).pvalue
    assert errors.p_value == pytest.approx(expected_p, rel=1e-6)
    assert paired.agreement == pytest.approx(0.5)  # content logged: identical on odd prompts
    assert paired.agreement_basis == "identical response content"
    assert [v.verdict for v in report.verdicts] == ["no_difference_yet"]
