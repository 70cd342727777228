"""The report's numbers equal direct computations on the per-unit data we inserted."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import psycopg
import pytest
from scipy import stats as sps
from sqlalchemy import text
from sqlalchemy.orm import Session
from statsmodels.stats.multitest import multipletests

from analytics.report.aggregate import variant_stats
from analytics.report.assembly import ReportOptions, build_report
from analytics.report.catalogue import BUILTINS
from analytics.report.schema import Report
from analytics.rollout import view
from tests.analytics.report_data import T0, Units, create_experiment, insert_units, simulate_units

METRICS = [
    "thumbs_up_rate",
    "tokens_per_unit",
    "thumbs_up_units",
    "error_rate",
    "completion_tokens_per_response",
]
Arms = tuple[int, dict[str, dict[str, np.ndarray]]]
OPTS = ReportOptions(segments=True, timeseries=False, rollout=view.report_part)


def _welch(xc: np.ndarray, xt: np.ndarray) -> tuple[float, float, float]:
    """(difference, standard error, Welch dof) of two per-unit samples."""
    vc, vt = xc.var(ddof=1) / len(xc), xt.var(ddof=1) / len(xt)
    dof = (vc + vt) ** 2 / (vc**2 / (len(xc) - 1) + vt**2 / (len(xt) - 1))
    return float(xt.mean() - xc.mean()), math.sqrt(vc + vt), dof


def _ratio_lin(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    r = x.sum() / y.sum()
    return float(r), (x - r * y) / y.mean()


@pytest.fixture
def two_arms(db: Session) -> tuple[int, dict[str, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(7)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 50), ("candidate", 50)], metrics=METRICS)
    control = simulate_units(rng, 600, thumbs_p=0.20, tokens=100, error_p=0.02)
    candidate = simulate_units(rng, 620, thumbs_p=0.26, tokens=115, error_p=0.02)
    insert_units(conn, eid, "control", control)
    insert_units(conn, eid, "candidate", candidate)
    return eid, {"control": control.columns, "candidate": candidate.columns}


def test_mean_metric_matches_scipy_welch_test(db: Session, two_arms: Arms) -> None:
    eid, data = two_arms
    report = build_report(db.connection(), eid, options=OPTS)
    c = data["control"]["prompt_tokens"] + data["control"]["completion_tokens"]
    t = data["candidate"]["prompt_tokens"] + data["candidate"]["completion_tokens"]
    row = report.result("tokens_per_unit", "candidate")
    assert row is not None and row.error is None
    expected = sps.ttest_ind(t, c, equal_var=False)
    assert row.mean == pytest.approx(t.mean())
    assert row.lift_absolute == pytest.approx(t.mean() - c.mean())
    assert row.lift_relative == pytest.approx((t.mean() - c.mean()) / c.mean())
    assert row.p_value == pytest.approx(expected.pvalue, rel=1e-6)
    ci = expected.confidence_interval(0.95)
    assert row.ci_absolute is not None
    assert (row.ci_absolute.lower, row.ci_absolute.upper) == pytest.approx((ci.low, ci.high), rel=1e-6)
    assert row.units == len(t)


def test_ratio_metric_uses_the_delta_method_per_unit(db: Session, two_arms: Arms) -> None:
    eid, data = two_arms
    report = build_report(db.connection(), eid, options=OPTS)
    rc, lc = _ratio_lin(data["control"]["thumbs_up"], data["control"]["requests"])
    rt, lt = _ratio_lin(data["candidate"]["thumbs_up"], data["candidate"]["requests"])
    vc, vt = lc.var(ddof=1) / len(lc), lt.var(ddof=1) / len(lt)
    se = math.sqrt(vc + vt)
    dof = (vc + vt) ** 2 / (vc**2 / (len(lc) - 1) + vt**2 / (len(lt) - 1))
    p = 2 * sps.t.sf(abs(rt - rc) / se, dof)
    row = report.result("thumbs_up_rate", "candidate")
    ctrl = report.result("thumbs_up_rate", "control")
    assert row is not None and ctrl is not None
    assert ctrl.mean == pytest.approx(rc) and row.mean == pytest.approx(rt)
    assert row.lift_absolute == pytest.approx(rt - rc)
    assert row.p_value == pytest.approx(p, rel=1e-6)
    # relative lift SE by the delta method: Var = vt/rc² + rt²·vc/rc⁴
    rel_se = math.sqrt(vt / rc**2 + rt**2 * vc / rc**4)
    q = sps.t.ppf(0.975, dof)
    assert row.ci_relative is not None
    assert row.ci_relative.lower == pytest.approx((rt - rc) / rc - q * rel_se, rel=1e-6)
    # the sequential interval is wider than the fixed-horizon one (always valid)
    assert row.sequential_ci_relative is not None
    assert row.sequential_ci_relative.lower < row.ci_relative.lower
    assert row.sequential_ci_relative.upper > row.ci_relative.upper
    assert row.better is True
    assert row.chance_to_beat_control == pytest.approx(sps.norm.cdf(((rt - rc) / rc) / rel_se), abs=1e-9)


def test_proportion_metric_is_share_of_units(db: Session, two_arms: Arms) -> None:
    eid, data = two_arms
    report = build_report(db.connection(), eid, options=OPTS)
    c = (data["control"]["thumbs_up"] > 0).astype(float)
    t = (data["candidate"]["thumbs_up"] > 0).astype(float)
    row = report.result("thumbs_up_units", "candidate")
    assert row is not None
    assert row.mean == pytest.approx(t.mean())
    assert row.p_value == pytest.approx(sps.ttest_ind(t, c, equal_var=False).pvalue, rel=1e-6)


def test_holm_and_bh_are_applied_across_metrics_and_candidates(db: Session, two_arms: Arms) -> None:
    eid, _ = two_arms
    report = build_report(db.connection(), eid, options=OPTS)
    rows = [r for r in report.results if not r.is_control and r.p_value is not None]
    assert len(rows) == len(METRICS)
    raw = [r.p_value for r in rows]
    holm = multipletests(raw, method="holm")[1]
    bh = multipletests(raw, method="fdr_bh")[1]
    assert [r.p_holm for r in rows] == pytest.approx(list(holm))
    assert [r.p_bh for r in rows] == pytest.approx(list(bh))
    seq_holm = multipletests([r.p_value_sequential for r in rows], method="holm")[1]
    assert [r.p_sequential_holm for r in rows] == pytest.approx(list(seq_holm))
    assert all(
        r.significant == (r.p_sequential_holm is not None and r.p_sequential_holm < 0.05) for r in rows
    )


def test_clear_improvement_ships_and_a_harmful_candidate_is_flagged(db: Session) -> None:
    rng = np.random.default_rng(11)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("good", 1), ("bad", 1)],
                               metrics=["thumbs_up_rate", "error_rate"])  # fmt: skip
    # Guardrails must be shown non-inferior (not merely "not significantly worse") to ship.
    insert_units(conn, eid, "control", simulate_units(rng, 3000, thumbs_p=0.20, tokens=100, error_p=0.10))
    insert_units(conn, eid, "good", simulate_units(rng, 3000, thumbs_p=0.30, tokens=100, error_p=0.10))
    insert_units(conn, eid, "bad", simulate_units(rng, 3000, thumbs_p=0.20, tokens=100, error_p=0.30))
    report = build_report(conn, eid, options=OPTS)
    verdicts = {v.variant: v for v in report.verdicts}
    assert verdicts["good"].verdict == "ship", verdicts["good"].reason
    assert verdicts["good"].better == ["thumbs_up_rate"]
    assert verdicts["bad"].verdict == "harm"
    assert "error_rate" in verdicts["bad"].failed_guardrails
    bad_err = report.result("error_rate", "bad")
    assert bad_err is not None and bad_err.guardrail is not None and bad_err.guardrail.outcome == "fail"
    assert report.headline() == "harm"
    assert not report.srm.flagged


def test_an_ab_candidate_its_offline_gate_failed_or_has_not_passed_is_never_ship(db: Session) -> None:
    """Users may like a candidate that forgot a skill: an A/B test whose offline gate was
    declared after the start (as the `liftgate up` demo does) keeps serving, but its report
    must not say "ship" for a candidate the gate failed ("harm", naming the gate's reason)
    or has no passing decision for as configured now ("no_difference_yet", saying why); a
    passing decision leaves the online verdict as it is."""
    import orjson

    from contracts.offline_gate import candidate_fingerprint

    rng = np.random.default_rng(11)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("good", 1)], metrics=["thumbs_up_rate", "error_rate"])
    insert_units(conn, eid, "control", simulate_units(rng, 3000, thumbs_p=0.20, tokens=100, error_p=0.10))
    insert_units(conn, eid, "good", simulate_units(rng, 3000, thumbs_p=0.30, tokens=100, error_p=0.10))
    assert build_report(conn, eid, options=OPTS).verdicts[0].verdict == "ship"
    declaration = {"suites": ["demo"]}
    conn.execute(
        text(
            "INSERT INTO offline_gates (experiment_id, declaration, updated_by) VALUES (:e, CAST(:d AS jsonb), 't')"
        ),
        {"e": eid, "d": orjson.dumps(declaration).decode()},
    )
    (verdict,) = build_report(conn, eid, options=OPTS).verdicts
    assert verdict.verdict == "no_difference_yet", verdict
    assert "offline gate" in verdict.reason and "better on thumbs_up_rate" in verdict.reason, verdict.reason
    up, base_url = conn.execute(
        text(
            "SELECT u.name, u.base_url FROM variants v JOIN upstreams u ON u.id = v.upstream_id WHERE v.experiment_id = :e LIMIT 1"
        ),
        {"e": eid},
    ).one()

    def decide(passed: bool, reasons: list[str]) -> None:
        conn.execute(
            text(
                "INSERT INTO gate_decisions (experiment_id, variant, baseline_variant, candidate_fingerprint,"
                " baseline_fingerprint, upstream, model, params, passed, verdict, reasons, declaration, actor)"
                " VALUES (:e, 'good', 'control', :f, :f, :u, 'm', '{}'::jsonb, :ok, :v, CAST(:r AS jsonb),"
                " CAST(:d AS jsonb), 't')"
            ),
            {"e": eid, "f": candidate_fingerprint(up, base_url, "m", {}), "u": up, "ok": passed,
             "v": "pass" if passed else "fail", "r": orjson.dumps(reasons).decode(),
             "d": orjson.dumps(declaration).decode()},
        )  # fmt: skip

    decide(False, ["forgetting: code -28.3 pts"])
    (verdict,) = build_report(conn, eid, options=OPTS).verdicts
    assert verdict.verdict == "harm" and "forgetting: code -28.3 pts" in verdict.reason, verdict
    assert verdict.better == ["thumbs_up_rate"]
    decide(True, [])
    (verdict,) = build_report(conn, eid, options=OPTS).verdicts
    assert verdict.verdict == "ship", verdict


def test_skewed_split_is_flagged_as_srm(db: Session) -> None:
    rng = np.random.default_rng(3)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 50), ("candidate", 50)], metrics=["thumbs_up_rate"])
    insert_units(conn, eid, "control", simulate_units(rng, 1000, thumbs_p=0.2, tokens=100, error_p=0.02))
    insert_units(conn, eid, "candidate", simulate_units(rng, 850, thumbs_p=0.2, tokens=100, error_p=0.02))
    report = build_report(conn, eid, options=OPTS)
    expected = sps.chisquare([1000, 850], [925, 925])
    assert report.srm.p_value == pytest.approx(expected.pvalue)
    assert report.srm.chi2 == pytest.approx(expected.statistic)
    assert report.srm.flagged
    assert [v.verdict for v in report.verdicts] == ["srm"]
    shares = {a.variant: a.observed_units for a in report.allocation}
    assert shares == {"control": 1000, "candidate": 850}


def test_segments_carry_their_own_table_with_correction_across_segments(db: Session) -> None:
    rng = np.random.default_rng(5)
    conn = db.connection()
    eid, _ = create_experiment(
        conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate", "error_rate"]
    )
    data: dict[tuple[str, str], np.ndarray] = {}
    for variant, code_p in (("control", 0.3), ("candidate", 0.15)):
        code = simulate_units(rng, 500, thumbs_p=code_p, tokens=100, error_p=0.02)
        chat = simulate_units(
            rng, 500, thumbs_p=0.2 if variant == "control" else 0.3, tokens=100, error_p=0.02
        )
        insert_units(conn, eid, variant, code, segment="task=code", prefix=f"{variant}-code")
        insert_units(conn, eid, variant, chat, segment="task=chat", prefix=f"{variant}-chat")
        both = {k: np.concatenate([code[k], chat[k]]) for k in code.columns}
        insert_units(conn, eid, variant, type(code)(both), prefix=f"{variant}-all")
        data[(variant, "code")] = code["thumbs_up"]
    report = build_report(conn, eid, options=OPTS)
    assert [s.segment for s in report.segments] == ["task=chat", "task=code"]
    seg = next(s for s in report.segments if s.value == "code")
    assert seg.tag == "task" and seg.units == 1000
    row = next(r for r in seg.results if r.metric == "thumbs_up_rate" and r.variant == "candidate")
    assert row.better is False and row.lift_relative is not None and row.lift_relative < -0.3
    flat = [r for s in report.segments for r in s.results if not r.is_control and r.p_value is not None]
    assert len(flat) == 4  # 2 metrics × 1 candidate × 2 segments: one family
    assert [r.p_holm for r in flat] == pytest.approx(
        list(multipletests([r.p_value for r in flat], method="holm")[1])
    )


def test_the_report_names_the_declared_keys_and_shows_only_their_segments_and_rollout_stage(
    db: Session,
) -> None:
    # Rows of a key no longer declared (left from before) are not shown.
    rng = np.random.default_rng(6)
    conn = db.connection()
    eid, _ = create_experiment(
        conn, [("control", 1), ("candidate", 1)], metrics=["error_rate"], segment_tags=["lang"]
    )
    for variant in ("control", "candidate"):
        units = simulate_units(rng, 200, thumbs_p=0.2, tokens=100, error_p=0.02)
        insert_units(conn, eid, variant, units, prefix=f"{variant}-all")
        for segment in ("lang=en", "task=code", "rollout_stage=0"):
            insert_units(conn, eid, variant, units, segment=segment, prefix=f"{variant}-{segment}")
    report = build_report(conn, eid, options=OPTS)
    assert report.segment_tags == ["lang"]
    assert [s.segment for s in report.segments] == ["lang=en", "rollout_stage=0"]


def test_empty_experiment_reports_no_data_without_nan(db: Session) -> None:
    eid, _ = create_experiment(db.connection(), [("control", 1), ("candidate", 1)])
    report = build_report(db.connection(), eid, options=OPTS)
    assert report.units == 0
    assert "no_data" in {e.code for e in report.errors}
    assert report.srm.error is not None and not report.srm.flagged
    assert {v.verdict for v in report.verdicts} == {"insufficient_data"}
    assert all(r.error is not None for r in report.results)
    text = report.model_dump_json()
    assert "NaN" not in text and "Infinity" not in text
    assert Report.model_validate_json(text) == report


def test_one_empty_variant_gives_error_codes_on_its_rows(db: Session) -> None:
    rng = np.random.default_rng(1)
    conn = db.connection()
    eid, _ = create_experiment(
        conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate", "latency_p95"]
    )
    insert_units(conn, eid, "control", simulate_units(rng, 50, thumbs_p=0.2, tokens=100, error_p=0.0))
    report = build_report(conn, eid, options=OPTS)
    cand = report.result("thumbs_up_rate", "candidate")
    assert cand is not None and cand.error is not None and cand.error.code == "empty_variant"
    p95 = report.result("latency_p95", "candidate")
    assert p95 is not None and p95.error is not None and p95.error.code == "no_data"
    # zero variance (no errors anywhere) is reported, not raised
    assert report.verdicts[0].verdict == "insufficient_data"
    assert "NaN" not in report.model_dump_json()


def test_no_control_variant_is_an_error_not_an_exception(db: Session) -> None:
    conn = db.connection()
    eid, _ = create_experiment(conn, [("a", 1), ("b", 1)])
    conn.exec_driver_sql("UPDATE variants SET is_control = false WHERE experiment_id = %s", (eid,))
    report = build_report(conn, eid, options=OPTS)
    assert [e.code for e in report.errors] == ["no_control"]
    assert report.results == []


def test_segments_are_bounded_to_the_largest_and_match_single_segment_queries(db: Session) -> None:
    rng = np.random.default_rng(13)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate"])
    sizes = {"lang=en": 120, "lang=de": 80, "lang=fr": 30, "lang=it": 10}
    for seg, n in sizes.items():
        for variant in ("control", "candidate"):
            units = simulate_units(rng, n, thumbs_p=0.2, tokens=100, error_p=0.05)
            insert_units(conn, eid, variant, units, segment=seg, prefix=f"{variant}-{seg}")
            insert_units(conn, eid, variant, units, prefix=f"{variant}-{seg}")
    report = build_report(conn, eid, options=ReportOptions(timeseries=False, max_segments=2))
    assert [s.segment for s in report.segments] == ["lang=de", "lang=en"]
    assert [s.units for s in report.segments] == [160, 240]
    assert "segments_truncated" in {e.code for e in report.errors}
    metric = BUILTINS["thumbs_up_rate"]
    pg = conn.connection.driver_connection
    assert isinstance(pg, psycopg.Connection)
    direct = variant_stats(pg, eid, [metric], "lang=de")["thumbs_up_rate"]
    row = next(r for r in report.segments[0].results if r.variant == "candidate")
    assert row.mean == pytest.approx(direct["candidate"].sum_x / direct["candidate"].sum_y)
    assert row.units == direct["candidate"].n == 80


def test_cuped_uses_the_preperiod_covariate_with_a_pooled_theta(db: Session) -> None:
    rng = np.random.default_rng(23)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], metrics=["tokens_per_unit"])
    x: dict[str, np.ndarray] = {}
    c: dict[str, np.ndarray] = {}
    for variant, lift in (("control", 0.0), ("candidate", 5.0)):
        habit = rng.gamma(2.0, 200.0, 500)  # each unit's own level, visible before the experiment
        c[variant] = habit + rng.normal(0, 20, 500)
        x[variant] = habit + lift + rng.normal(0, 40, 500)
        insert_units(conn, eid, variant, Units({"completion_tokens": x[variant]}))
        conn.execute(
            text(
                "INSERT INTO preperiod_rollups (experiment_id, unit_id, completion_tokens) VALUES (:e, :u, :v)"
            ),
            [{"e": eid, "u": f"{variant}-{i}", "v": float(v)} for i, v in enumerate(c[variant])],
        )
    report = build_report(conn, eid, options=OPTS)
    row = report.result("tokens_per_unit", "candidate")
    assert row is not None and row.cuped is not None
    num = sum((len(x[v]) - 1) * np.cov(x[v], c[v])[0, 1] for v in x)
    theta = num / sum((len(c[v]) - 1) * c[v].var(ddof=1) for v in c)
    c_bar = np.concatenate(list(c.values())).mean()
    adj = {v: x[v] - theta * (c[v] - c_bar) for v in x}
    means = {v: x[v].mean() - theta * (c[v].mean() - c_bar) for v in x}
    assert row.cuped.theta == pytest.approx(theta, rel=1e-6)
    raw_var = sum((len(x[v]) - 1) * x[v].var(ddof=1) for v in x)
    adj_var = sum((len(adj[v]) - 1) * adj[v].var(ddof=1) for v in adj)
    assert row.cuped.variance_reduction == pytest.approx(1 - adj_var / raw_var, rel=1e-6)
    assert row.cuped.variance_reduction > 0.8
    assert row.lift_absolute == pytest.approx(means["candidate"] - means["control"], rel=1e-6)
    assert row.p_value == pytest.approx(
        sps.ttest_ind(adj["candidate"], adj["control"], equal_var=False).pvalue, rel=1e-4
    )
    assert row.mean == pytest.approx(x["candidate"].mean())  # the table shows the raw mean


def test_rollout_srm_counts_only_units_that_arrived_in_the_current_stage(db: Session) -> None:
    rng = np.random.default_rng(31)
    conn = db.connection()
    stage_start = T0 + timedelta(hours=1)
    eid, _ = create_experiment(conn, [("control", 50), ("candidate", 50)], mode="rollout",
                               metrics=["thumbs_up_rate"], stage_started_at=stage_start)  # fmt: skip
    # the earlier 95/5 stage left a skewed cumulative split; the current 50/50 stage is balanced
    insert_units(
        conn, eid, "control", simulate_units(rng, 950, thumbs_p=0.2, tokens=100, error_p=0.05), prefix="c-old"
    )
    insert_units(
        conn,
        eid,
        "candidate",
        simulate_units(rng, 50, thumbs_p=0.2, tokens=100, error_p=0.05),
        prefix="t-old",
    )
    later = stage_start + timedelta(seconds=10)
    for variant in ("control", "candidate"):
        units = simulate_units(rng, 400, thumbs_p=0.2, tokens=100, error_p=0.05)
        insert_units(conn, eid, variant, units, prefix=f"{variant}-new", first_ts=later)
    report = build_report(conn, eid, options=OPTS)
    assert report.units == 1800
    assert report.srm.p_value is not None and report.srm.p_value > 0.5 and not report.srm.flagged
    assert report.verdicts[0].verdict != "srm"


def test_a_guardrail_with_no_events_in_either_arm_passes_and_does_not_block_shipping(db: Session) -> None:
    rng = np.random.default_rng(19)
    conn = db.connection()
    eid, _ = create_experiment(
        conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate", "error_rate"]
    )
    insert_units(conn, eid, "control", simulate_units(rng, 3000, thumbs_p=0.20, tokens=100, error_p=0.0))
    insert_units(conn, eid, "candidate", simulate_units(rng, 3000, thumbs_p=0.30, tokens=100, error_p=0.0))
    report = build_report(conn, eid, options=OPTS)
    row = report.result("error_rate", "candidate")
    assert row is not None and row.error is not None and row.error.code == "zero_variance"
    assert row.guardrail is not None and row.guardrail.outcome == "pass"
    assert report.verdicts[0].verdict == "ship"


def _latency_histogram(rng: np.random.Generator, calls: int, median_ms: float) -> dict[int, int]:
    from analytics.report.aggregate import bucket_of

    counts: dict[int, int] = {}
    for ms in rng.lognormal(math.log(median_ms), 0.5, calls):
        b = bucket_of(float(ms))
        counts[b] = counts.get(b, 0) + 1
    return counts


def _slow_p95_experiment(db: Session, status: str, units: int) -> int:
    """A/B where the candidate's request latency is 50% higher (the p95 guardrail's case)."""
    from tests.analytics.report_data import insert_histogram

    rng = np.random.default_rng(41)
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status=status,
                               metrics=["thumbs_up_rate", "latency_p95"])  # fmt: skip
    for variant, median in (("control", 400.0), ("candidate", 600.0)):
        insert_units(conn, eid, variant, simulate_units(rng, units, thumbs_p=0.2, tokens=100, error_p=0.02))
        insert_histogram(conn, eid, variant, "latency", _latency_histogram(rng, units * 4, median))
    return eid


def test_a_fixed_horizon_quantile_guardrail_cannot_fail_a_running_experiment_before_its_planned_sample(
    db: Session,
) -> None:
    eid = _slow_p95_experiment(db, "running", units=200)
    report = build_report(db.connection(), eid, options=OPTS)
    row = report.result("latency_p95", "candidate")
    assert row is not None and row.guardrail is not None
    # the fixed-horizon interval is far beyond the 10% margin: at the planned look it would fail
    assert row.ci_relative is not None and row.ci_relative.lower > 0.3
    assert row.guardrail.test == "fixed_horizon"
    assert row.guardrail.outcome == "inconclusive"
    assert row.guardrail.error is not None and row.guardrail.error.code == "not_yet_valid"
    assert "fixed-horizon" in row.guardrail.error.message
    [verdict] = report.verdicts
    assert verdict.verdict != "harm" and verdict.failed_guardrails == []
    assert report.headline() != "harm"


def test_the_same_quantile_guardrail_fails_at_the_planned_sample_or_once_the_experiment_stopped(
    db: Session,
) -> None:
    running = _slow_p95_experiment(db, "running", units=200)
    planned = build_report(db.connection(), running, options=ReportOptions(segments=False, timeseries=False,
                                                                           planned_units=400))  # fmt: skip
    stopped = build_report(db.connection(), _slow_p95_experiment(db, "stopped", units=200), options=OPTS)
    for report in (planned, stopped):
        row = report.result("latency_p95", "candidate")
        assert row is not None and row.guardrail is not None
        assert row.guardrail.outcome == "fail" and row.guardrail.error is None
        assert report.verdicts[0].verdict == "harm"
        assert report.verdicts[0].failed_guardrails == ["latency_p95"]


def _constant_ratio_units(n: int, tokens_per_request: float) -> Units:
    """Units whose every response has the same length: a ratio with no variation at all."""
    requests = np.arange(1, n + 1, dtype=float) % 5 + 1.0
    return Units({"requests": requests, "completion_tokens": requests * tokens_per_request,
                  "errors": np.zeros(n), "thumbs_up": np.zeros(n)})  # fmt: skip


def test_a_zero_width_interval_is_insufficient_data_and_never_significant(db: Session) -> None:
    conn = db.connection()
    eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)],
                               metrics=["completion_tokens_per_response"])  # fmt: skip
    for variant, tokens in (("control", 100.0), ("candidate", 160.2)):
        units = _constant_ratio_units(400, tokens)
        insert_units(conn, eid, variant, units)
        insert_units(conn, eid, variant, units, segment="task=code")
    report = build_report(conn, eid, options=OPTS)
    rows = [report.result("completion_tokens_per_response", "candidate")]
    rows += [r for s in report.segments for r in s.results if not r.is_control]
    assert len(rows) == 2
    for row in rows:
        assert row is not None
        assert row.lift_relative == pytest.approx(0.602)
        assert row.error is not None and row.error.code == "insufficient_data", row
        assert "zero-width" in row.error.message
        assert not row.significant and row.p_value is None and row.p_sequential_holm is None
        assert row.ci_relative is None and row.sequential_ci_relative is None
    assert report.verdicts[0].verdict != "harm" and report.verdicts[0].worse == []


def test_an_arm_below_the_tests_minimum_is_insufficient_data_never_significant(db: Session) -> None:
    rng = np.random.default_rng(43)
    conn = db.connection()
    eid, _ = create_experiment(
        conn, [("control", 1), ("candidate", 1)], metrics=["thumbs_up_rate", "error_rate"]
    )
    insert_units(conn, eid, "control", simulate_units(rng, 400, thumbs_p=0.05, tokens=100, error_p=0.01))
    # a handful of units with a huge difference: the asymptotic tests do not hold yet
    insert_units(conn, eid, "candidate", simulate_units(rng, 12, thumbs_p=0.9, tokens=100, error_p=0.01))
    insert_units(conn, eid, "control", simulate_units(rng, 400, thumbs_p=0.05, tokens=100, error_p=0.01),
                 segment="task=chat")  # fmt: skip
    insert_units(conn, eid, "candidate", simulate_units(rng, 12, thumbs_p=0.9, tokens=100, error_p=0.01),
                 segment="task=chat")  # fmt: skip
    report = build_report(conn, eid, options=OPTS)
    rows = [r for r in report.results if not r.is_control]
    rows += [r for s in report.segments for r in s.results if not r.is_control]
    assert len(rows) == 4
    for row in rows:
        assert row.error is not None and row.error.code == "insufficient_data", row
        assert "12" in row.error.message and "30" in row.error.message
        assert not row.significant and row.p_value is None
        assert row.guardrail is None or row.guardrail.outcome == "inconclusive"
    up = report.result("thumbs_up_rate", "candidate")
    assert (
        up is not None and up.lift_relative is not None and up.lift_relative > 5
    )  # the estimate is still shown
    [verdict] = report.verdicts
    assert verdict.verdict == "insufficient_data" and "30" in verdict.reason


def test_the_reports_test_minimum_is_the_controllers() -> None:
    from analytics.report.comparison import MIN_TEST_UNITS
    from analytics.rollout.plan import RolloutPlan

    assert MIN_TEST_UNITS == RolloutPlan().min_test_units == ReportOptions().min_units
