"""The plan check: errors that refuse a plan, warnings it is accepted with, and the
detectable harm per guardrail per stage (pure, with the built-in catalogue)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from analytics.report.catalogue import BUILTINS, Metric
from analytics.rollout.check import BaselineStat, MdeRow, Traffic, check_plan
from analytics.stats import SampleStats, estimate, sequential_noninferiority, sequential_rate_noninferiority

CATALOGUE: dict[str, Metric] = dict(BUILTINS)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"stages": [10, 5]}, "strictly increasing"),
        ({"stages": [100]}, "no stage keeps control traffic"),
        ({"guardrails": ["nope"]}, "metric 'nope' is not defined"),
        ({"guardrails": ["latency_p95"]}, "latency_p95 is a quantile metric"),
        ({"guardrails": [{"metric": "error_rate", "absolute_margin": 1.0}]}, "can never be exceeded"),
        ({"guardrails": [{"metric": "turns_per_unit", "rate": True, "absolute_margin": 0.1}]}, "rate: true"),
        ({"success_metrics": ["ttft_p95"]}, "success metric ttft_p95 is a quantile"),
        ("stages: [5]", "JSON object"),
    ],
)
def test_a_plan_that_cannot_run_is_refused_with_a_reason(raw: Any, error: str) -> None:
    checked = check_plan(raw, CATALOGUE)
    assert not checked.ok
    assert any(error in e for e in checked.errors), checked.errors


def test_min_units_below_the_test_minimum_is_accepted_with_a_warning() -> None:
    checked = check_plan({"stages": [10, 25, 50, 100], "min_units": 20}, CATALOGUE)
    assert checked.ok and checked.promotion_stage == 2
    assert any("min_units 20 is below min_test_units 30" in w for w in checked.warnings)


def test_a_rate_with_only_a_relative_margin_and_an_empty_guardrail_list_are_warned_about() -> None:
    rel = check_plan({"guardrails": [{"metric": "error_rate", "margin": 0.25}]}, CATALOGUE)
    assert rel.ok and any("undefined while the control has no events" in w for w in rel.warnings)
    none = check_plan({"guardrails": []}, CATALOGUE)
    assert none.ok and any("promoted without evidence" in w for w in none.warnings)


def test_without_expected_traffic_the_check_says_what_it_could_not_check() -> None:
    checked = check_plan(None, CATALOGUE)
    assert checked.ok and not checked.mde
    assert any("expected traffic unknown" in w for w in checked.warnings)
    assert [g["test"] for g in checked.guardrails] == ["rate_score", "mean", "rate_score", "mean"]


def _rows(checked: Any, metric: str) -> list[MdeRow]:
    return [r for r in checked.mde if r.metric == metric]


def test_the_mde_table_has_every_evaluated_stage_and_warns_about_stages_too_short_to_see_harm() -> None:
    plan = {"expected_units_per_s": 1.0, "baselines": {"latency_mean": {"mean": 400, "sd": 150}}}
    checked = check_plan(plan, CATALOGUE)
    assert checked.ok and checked.traffic == Traffic(1.0, 1.0, "plan")
    rows = _rows(checked, "error_rate")
    assert [r.stage_percent for r in rows] == [1, 5, 10, 25, 50]  # 100% is the promotion itself
    assert rows[0].baseline == 0.01 and rows[0].baseline_source == "assumed"
    first = rows[0]
    # 1% of 1 unit/s: 9 candidate units in 900 s; the stage needs 100 (min_units) → 10,000 s
    assert first.seconds == pytest.approx(10_000) and first.units_candidate == pytest.approx(100)
    assert any(
        "stage 1%: ~9 candidate units expected in its 900 s; it needs 100" in w for w in checked.warnings
    )
    assert first.mde is not None and first.mde > 2 * 0.01 and first.detectable is False
    assert any(w.startswith("error_rate: at stage(s) 1%") for w in checked.warnings), checked.warnings
    lat = _rows(checked, "latency_mean")
    assert all(r.mde is not None and r.harm_scale == "relative" for r in lat)
    assert lat[-1].mde is not None and lat[-1].mde < lat[0].mde  # more traffic at 50%: finer
    promotion = rows[-1]
    assert promotion.noninferiority_s is not None and promotion.noninferiority_s > promotion.seconds
    assert any(
        "error_rate: showing non-inferiority at the promotion stage 50%" in w for w in checked.warnings
    )


def test_plan_baselines_take_precedence_over_the_route_and_fill_in_its_sd() -> None:
    route = {
        "latency_mean": BaselineStat(300.0, 120.0, "route r"),
        "error_rate": BaselineStat(0.02, 0.1, "route r"),
    }
    checked = check_plan({"baselines": {"latency_mean": 500}}, CATALOGUE, traffic=Traffic(50, 100, "route r"),
                         baselines=route)  # fmt: skip
    lat, err = _rows(checked, "latency_mean")[0], _rows(checked, "error_rate")[0]
    assert (lat.baseline, lat.baseline_source) == (500, "plan")
    assert (err.baseline, err.baseline_source) == (0.02, "route r")
    assert checked.traffic is not None and checked.traffic.source == "route r"


def test_the_stated_mde_is_caught_with_about_80_percent_power_at_the_end_of_the_stage() -> None:
    """Simulate the stage the table describes, with the harm it states, one look at its end."""
    rng = np.random.default_rng(8)
    plan = {"stages": [25, 50, 100], "min_duration_s": 600, "min_units": 30, "expected_units_per_s": 2.0,
            "expected_requests_per_s": 2.0, "guardrails": ["error_rate", "latency_mean"],
            "baselines": {"error_rate": 0.02, "latency_mean": {"mean": 400, "sd": 150}}}  # fmt: skip
    checked = check_plan(plan, CATALOGUE)
    alpha = 0.05 / (2 * 2)
    for metric in ("error_rate", "latency_mean"):
        row = _rows(checked, metric)[0]
        assert row.mde is not None and row.units_candidate is not None and row.units_control is not None
        n_t, n_c = round(row.units_candidate), round(row.units_control)
        hits, sims = 0, 400
        for _ in range(sims):
            if metric == "error_rate":
                t = rng.random(n_t) < 0.02 + row.mde
                c = rng.random(n_c) < 0.02
                ct = SampleStats.from_values(t.astype(float), np.ones(n_t))
                cc = SampleStats.from_values(c.astype(float), np.ones(n_c))
                r = sequential_rate_noninferiority(cc, ct, 0.01, "decrease", alpha, 10_000, with_bounds=False)
            else:
                t = rng.normal(400 * (1 + row.mde), 150, n_t)
                c = rng.normal(400, 150, n_c)
                r = sequential_noninferiority(estimate(SampleStats.from_values(c, np.ones(n_c)), "ratio"),
                                              estimate(SampleStats.from_values(t, np.ones(n_t)), "ratio"),
                                              0.10, "decrease", alpha, 10_000)  # fmt: skip
            hits += r.reject_harm
        assert 0.65 <= hits / sims <= 0.95, (metric, row, hits / sims)


def test_returning_users_make_distinct_units_grow_slower_than_time() -> None:
    """Measured windows: 200 distinct units in 60 s, 450 in 300 s, 500 in 900 s."""
    t = Traffic(500 / 900, 30.0, "route r", ((60.0, 200.0), (300.0, 450.0), (900.0, 500.0)))
    assert t.units_in(30) == pytest.approx(100) and t.units_in(180) == pytest.approx(325)
    assert t.units_in(1800) == pytest.approx(1000)  # beyond: the longest window's rate
    assert t.seconds_for(325) == pytest.approx(180, rel=1e-6)
    plan = {"stages": [10, 50, 100], "min_duration_s": 60, "min_units": 30}
    first = _rows(check_plan(plan, CATALOGUE, traffic=t), "error_rate")[0]
    # 30 candidate units at 10% = 300 distinct units: 156 s here (60 s + 100/250 of the next 240 s),
    # where the 900-s rate alone (0.56 units/s) would say 540 s
    assert first.seconds == pytest.approx(156, rel=1e-6)
