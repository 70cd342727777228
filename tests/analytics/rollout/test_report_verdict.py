"""A rollout's verdict from the controller's evidence, and the differences with the
cumulative table (pure logic over the evidence JSON the controller records)."""

from __future__ import annotations

from typing import Any

import pytest

from analytics.report.schema import Guardrail, SrmCheck, VariantResult, Verdict
from analytics.rollout.view import Basis, differences, rollout_verdict

OK_SRM = SrmCheck(chi2=0.1, p_value=0.7, flagged=False, method="per_stage")
DIRECTIONS = {"error_rate": "decrease", "latency_mean": "decrease", "thumbs_up_rate": "increase"}


def _g(metric: str, outcome: str, **kw: Any) -> dict[str, Any]:
    return {"metric": metric, "outcome": outcome, "margin": 0.25, "harm": 0.02, "lower": -0.1, "upper": 0.15,
            "n_control": 400, "n_candidate": 380, "message": None, **kw}  # fmt: skip


def _basis(guardrails: list[dict[str, Any]], **ev: Any) -> Basis:
    evidence = {
        "stage_percent": 25.0,
        "guardrails": guardrails,
        "srm": {"flagged": False, "p_value": 0.5},
        **ev,
    }
    return Basis(evidence, "promoted at 25% on stage-window evidence", "promoted at 25% … (by controller)")


def _verdict(basis: Basis, srm: SrmCheck = OK_SRM) -> Verdict:
    return rollout_verdict("candidate", basis, srm, DIRECTIONS)


def test_every_guardrail_shown_non_inferior_ships_and_names_its_basis() -> None:
    v = _verdict(_basis([_g("error_rate", "noninferior"), _g("latency_mean", "noninferior")]))
    assert v.verdict == "ship" and v.basis == "promoted at 25% … (by controller)"
    assert "error_rate, latency_mean" in v.reason


def test_a_harmed_guardrail_is_harm_with_its_estimate_and_bound() -> None:
    v = _verdict(_basis([_g("error_rate", "harm", harm=0.8, lower=0.4), _g("latency_mean", "noninferior")]))
    assert v.verdict == "harm" and v.failed_guardrails == ["error_rate"]
    assert "harm +80.0%" in v.reason and "lower bound +40.0%" in v.reason


@pytest.mark.parametrize("outcome", ["no_data", "undefined_margin", None])
def test_a_guardrail_without_evidence_is_insufficient_data_never_a_pass(outcome: str | None) -> None:
    msg = "12 units in the smaller variant; the test needs 30"
    v = _verdict(_basis([_g("error_rate", "noninferior"), _g("latency_mean", outcome, message=msg)]))  # type: ignore[arg-type]
    assert v.verdict == "insufficient_data"
    assert "latency_mean" in v.reason


def test_inconclusive_guardrails_are_no_difference_yet_and_a_plan_without_guardrails_never_ships() -> None:
    v = _verdict(_basis([_g("error_rate", "noninferior"), _g("latency_mean", "inconclusive")]))
    assert v.verdict == "no_difference_yet" and "latency_mean" in v.reason
    v = _verdict(_basis([]))
    assert v.verdict == "no_difference_yet" and "no guardrail" in v.reason


def test_a_mismatched_split_in_the_report_or_in_the_look_is_srm() -> None:
    guards = [_g("error_rate", "noninferior")]
    flagged = SrmCheck(chi2=30.0, p_value=1e-6, flagged=True, method="per_stage")
    assert _verdict(_basis(guards), flagged).verdict == "srm"
    assert _verdict(_basis(guards, srm={"flagged": True, "p_value": 1e-5})).verdict == "srm"


def test_a_success_metric_worse_with_confidence_is_harm_and_says_it_never_gates() -> None:
    success = [{"metric": "thumbs_up_rate", "lift": -0.2, "lower": -0.3, "upper": -0.1, "p_value": 0.001}]
    v = _verdict(_basis([_g("error_rate", "noninferior")], success=success))
    assert v.verdict == "harm" and v.worse == ["thumbs_up_rate"] and "never gating" in v.reason


def test_no_evidence_or_an_invalid_plan_is_insufficient_data() -> None:
    assert _verdict(Basis(None, "no controller evidence", "none")).verdict == "insufficient_data"
    v = rollout_verdict(
        "candidate", _basis([]), OK_SRM, DIRECTIONS, "invalid rollout plan: stages must increase"
    )
    assert v.verdict == "insufficient_data" and v.reason.startswith("invalid rollout plan")


def _row(metric: str, **kw: Any) -> VariantResult:
    return VariantResult(metric=metric, variant="candidate", is_control=False, units=500, mean=1.0, **kw)


def test_differences_name_the_evidence_and_why_the_cumulative_table_disagrees() -> None:
    basis = _basis([_g("error_rate", "noninferior"), _g("latency_mean", "harm", harm=0.3, lower=0.2)])
    v = _verdict(basis)
    rows = [
        _row("latency_p95", guardrail=Guardrail(outcome="fail", margin=0.1, bound=0.5, test="fixed_horizon")),
        _row("error_rate", guardrail=Guardrail(outcome="fail", margin=0.25, bound=0.6)),
        _row("latency_mean", guardrail=Guardrail(outcome="pass", margin=0.25, bound=0.1)),
        _row("thumbs_up_rate", significant=True, better=False),
        _row("copy_rate", significant=True, better=True),
    ]
    notes = differences(v, basis, rows, ["error_rate", "latency_mean"], "stage")
    assert notes[0] == (
        "promoted at 25% on stage-window evidence; the cumulative report now shows latency_p95 failed — "
        "fixed-horizon, request-level; not a plan guardrail (quantiles have no per-unit always-valid test)"
    )
    assert (
        "error_rate failed — always-valid, on every unit since the start; the controller compares" in notes[1]
    )
    assert "latency_mean harmed; the cumulative report shows it within its margin" in notes[2]
    assert "thumbs_up_rate significantly worse" in notes[3]
    assert len(notes) == 4
