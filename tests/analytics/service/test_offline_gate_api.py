"""``GET /api/experiments/{ref}/offline-gate`` on the real analytics service, over real gate
runs (the demo suite against the simulator, decided by the real gate) in real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from statsmodels.stats.proportion import proportion_confint

from liftgate.simulator_process import SimulatorProcess
from tests.analytics.offline_gate_data import MARKUP, MARKUP_ITEMS, demo_gated, markup_gated, stub_upstream
from tests.evals.conftest import SIM_MODELS, Arm, make_experiment
from tests.known_secrets import secret
from tests.services import READ_TOKEN, analytics_service, get_json, http

DEMO, MARKED, BARE = "gate-demo", "gate-markup", "gate-bare"


@pytest.fixture(scope="module")
def gate_engine(module_database_url: str) -> Iterator[Engine]:
    eng = create_engine(module_database_url, pool_size=5, max_overflow=10)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def service(
    module_database_url: str, gate_engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with SimulatorProcess(SIM_MODELS) as sim, stub_upstream() as stub:
        demo_gated(gate_engine, sim.url + "/v1", DEMO)
        markup_gated(gate_engine, stub, MARKED, tmp_path_factory.mktemp("markup"))
    make_experiment(gate_engine, [Arm("baseline", "base", "http://127.0.0.1:9/v1", True),
                                  Arm("candidate", "cand", "http://127.0.0.1:9/v1")], name=BARE)  # fmt: skip
    with analytics_service(module_database_url, secret("gate-admin"), snapshot_interval_s="0",
                           rollout_controller="false") as url:  # fmt: skip
        yield url


def gate_of(url: str, ref: str, query: str = "") -> dict[str, Any]:
    doc = get_json(f"{url}/api/experiments/{ref}/offline-gate{query}", READ_TOKEN)
    assert isinstance(doc, dict)
    return doc


def test_the_api_shows_the_forgetting_decision_with_its_evidence_and_the_hook_holding_the_candidate(
    service: str, gate_engine: Engine
) -> None:
    doc = gate_of(service, DEMO)
    assert doc["experiment"]["name"] == DEMO and doc["control"] == "baseline"
    assert doc["declaration"]["suites"] == ["demo"] and doc["declared_by"] == "test" and doc["required"]
    (cand,) = doc["candidates"]
    decision = cand["decision"]
    with gate_engine.connect() as conn:
        row = conn.execute(text("SELECT d.id, d.reasons, d.evidence FROM gate_decisions d JOIN experiments x"
                                " ON x.id = d.experiment_id WHERE x.name = :n ORDER BY d.id DESC LIMIT 1"),
                           {"n": DEMO}).one()  # fmt: skip
    assert (
        decision["id"] == row.id
        and decision["reasons"] == row.reasons
        and decision["categories"] == row.evidence
    )
    assert decision["verdict"] == "fail" and not decision["passed"] and decision["current"]
    assert [r for r in decision["reasons"] if r.startswith("forgetting: code −")] == decision["reasons"]
    code = next(c for c in decision["categories"] if c["category"] == "code")
    assert code["verdict"] == "forgetting" and code["difference"] < -0.2 and code["ci_upper"] < 0
    assert code["p_worse_holm"] < 0.05 and code["margin"] == 0.05 and code["n"] >= 50
    assert cand["check"] == {"required": True, "passed": False, "decision_id": row.id,
                             "reason": f"offline gate failed (decision {row.id}): {row.reasons[0]}"}  # fmt: skip


def test_each_matrix_cell_is_the_runs_pass_rate_with_a_wilson_interval_and_the_decisions_verdict(
    service: str, gate_engine: Engine
) -> None:
    doc = gate_of(service, DEMO)
    matrix = doc["matrix"]
    assert matrix["variants"] == ["baseline", "candidate"]
    with gate_engine.connect() as conn:
        truth = conn.execute(text(
            "SELECT r.variant, res.category, count(*), count(*) FILTER (WHERE res.passed) FROM eval_results res"
            " JOIN eval_runs r ON r.id = res.run_id JOIN experiments x ON x.id = r.experiment_id"
            " WHERE x.name = :n GROUP BY 1, 2"), {"n": DEMO}).all()  # fmt: skip
    assert {(row["category"], v) for row in matrix["rows"] for v in row["cells"]} == {
        (t[1], t[0]) for t in truth
    }
    verdicts = {c["category"]: c["verdict"] for c in doc["candidates"][0]["decision"]["categories"]}
    for variant, category, outputs, passed in truth:
        cell = next(r for r in matrix["rows"] if r["category"] == category)["cells"][variant]
        lo, hi = proportion_confint(passed, outputs, alpha=0.05, method="wilson")
        assert (cell["outputs"], cell["passed"], cell["items"], cell["errors"]) == (
            outputs,
            passed,
            outputs,
            0,
        )
        assert cell["pass_rate"] == pytest.approx(passed / outputs)
        assert (cell["ci_lower"], cell["ci_upper"]) == (pytest.approx(lo), pytest.approx(hi))
        assert cell["verdict"] == (verdicts[category] if variant == "candidate" else None)
    assert verdicts["code"] == "forgetting" and verdicts["math"] == "pass"


def test_failing_items_are_the_pairs_the_candidate_lost_paged_with_both_outputs_and_reasons(
    service: str, gate_engine: Engine
) -> None:
    first = gate_of(service, DEMO, "?items=5")["failing_items"]
    second = gate_of(service, DEMO, "?items=5&offset=5")["failing_items"]
    both = gate_of(service, DEMO, "?items=10")["failing_items"]
    with gate_engine.connect() as conn:
        lost = conn.execute(text(
            "SELECT c.item_id, b.output, c.output, b.reason, c.reason FROM eval_results c"
            " JOIN eval_runs rc ON rc.id = c.run_id AND rc.variant = 'candidate'"
            " JOIN eval_runs rb ON rb.experiment_id = rc.experiment_id AND rb.variant = 'baseline'"
            " JOIN eval_results b ON b.run_id = rb.id AND b.item_id = c.item_id AND b.sample = c.sample"
            " JOIN experiments x ON x.id = rc.experiment_id WHERE x.name = :n AND b.passed AND NOT c.passed"),
            {"n": DEMO}).all()  # fmt: skip
    truth = {r[0]: r[1:] for r in lost}
    assert first["total"] == second["total"] == len(truth) >= 10
    assert (first["limit"], first["offset"], second["offset"], len(first["items"])) == (5, 0, 5, 5)
    assert first["items"] + second["items"] == both["items"]
    assert len({i["item_id"] for i in both["items"]}) == 10
    for item in both["items"]:
        expected = truth[item["item_id"]]
        got = (
            item["baseline_output"],
            item["candidate_output"],
            item["baseline_reason"],
            item["candidate_reason"],
        )
        assert got == expected and item["variant"] == "candidate" and item["dataset"] == "demo"
    beyond = gate_of(service, DEMO, f"?offset={len(truth)}")["failing_items"]
    assert beyond["items"] == [] and beyond["total"] == len(truth)
    everything = gate_of(service, DEMO, "?items=100")["failing_items"]["items"]
    assert {i["item_id"] for i in everything} == set(truth) or len(everything) == 100


def test_model_output_with_markup_is_returned_verbatim(service: str) -> None:
    doc = gate_of(service, MARKED)
    items = doc["failing_items"]["items"]
    assert len(items) == MARKUP_ITEMS == doc["failing_items"]["total"]
    assert all(i["candidate_output"].startswith(MARKUP) for i in items)
    (chat,) = doc["candidates"][0]["decision"]["categories"]
    assert chat["verdict"] == "insufficient"  # 6 items, fewer than the default 20


def test_a_changed_candidate_makes_the_decision_stale_and_the_hook_closed(
    service: str, gate_engine: Engine
) -> None:
    with gate_engine.begin() as conn:
        conn.execute(text("UPDATE variants SET model = 'other' WHERE name = 'candidate' AND experiment_id ="
                          " (SELECT id FROM experiments WHERE name = :n)"), {"n": MARKED})  # fmt: skip
    try:
        (cand,) = gate_of(service, MARKED)["candidates"]
        assert cand["decision"]["current"] is False
        assert not cand["check"]["passed"] and cand["check"]["reason"].startswith(
            "offline gate: no decision for"
        )
    finally:
        with gate_engine.begin() as conn:
            conn.execute(text("UPDATE variants SET model = 'evil' WHERE name = 'candidate' AND experiment_id ="
                              " (SELECT id FROM experiments WHERE name = :n)"), {"n": MARKED})  # fmt: skip


def test_a_running_ab_test_whose_gate_fails_is_shown_as_still_serving_its_candidate(
    service: str, gate_engine: Engine
) -> None:
    """The gate holds a candidate when an A/B test starts; one declared or failed later leaves
    its users with it. The document says so (``serving``) instead of implying it is held."""
    (cand,) = gate_of(service, DEMO)["candidates"]
    assert not cand["check"]["passed"] and cand["serving"] is False  # a draft serves no one
    states = [("running", 1.0, 1.0, True), ("running", 0.0, 1.0, False), ("running", 1.0, 0.0, False),
              ("paused", 1.0, 1.0, False)]  # fmt: skip
    try:
        for status, weight, coverage, serving in states:
            with gate_engine.begin() as conn:
                conn.execute(text("UPDATE experiments SET status = :s, coverage = :c WHERE name = :n"),
                             {"s": status, "c": coverage, "n": DEMO})  # fmt: skip
                conn.execute(text("UPDATE variants SET weight = :w WHERE name = 'candidate' AND experiment_id ="
                                  " (SELECT id FROM experiments WHERE name = :n)"), {"w": weight, "n": DEMO})  # fmt: skip
            doc = gate_of(service, DEMO)
            (cand,) = doc["candidates"]
            assert doc["experiment"]["status"] == status
            assert (cand["serving"], cand["check"]["passed"]) == (serving, False), (status, weight, coverage)
    finally:
        with gate_engine.begin() as conn:
            conn.execute(
                text("UPDATE experiments SET status = 'draft', coverage = 1 WHERE name = :n"), {"n": DEMO}
            )
            conn.execute(text("UPDATE variants SET weight = 50 WHERE name = 'candidate' AND experiment_id ="
                              " (SELECT id FROM experiments WHERE name = :n)"), {"n": DEMO})  # fmt: skip


def test_an_experiment_without_runs_answers_an_explicit_empty_shape(service: str) -> None:
    doc = gate_of(service, BARE)
    assert doc["declaration"] is None and doc["required"] is False and doc["runs"] == []
    assert doc["matrix"] == {"variants": ["baseline", "candidate"], "rows": []}
    assert doc["failing_items"] == {"total": 0, "offset": 0, "limit": 20, "items": []}
    assert doc["candidates"] == [
        {
            "variant": "candidate",
            "decision": None,
            "check": {
                "required": False,
                "passed": True,
                "reason": "no offline gate declared",
                "decision_id": None,
            },
            "serving": False,
        }
    ]


@pytest.mark.parametrize(
    "query", ["?items=101", "?items=-1", "?offset=-1", "?items=x", "?offset=10000000000"]
)
def test_out_of_range_paging_is_refused_with_422(service: str, query: str) -> None:
    status, body = http("GET", f"{service}/api/experiments/{DEMO}/offline-gate{query}",
                        {"Authorization": f"Bearer {READ_TOKEN}"})  # fmt: skip
    assert status == 422, body
    assert "detail" in json.loads(body)


def test_unknown_experiments_are_404_and_reads_need_a_credential(service: str) -> None:
    status, body = http(
        "GET", f"{service}/api/experiments/no-such/offline-gate", {"Authorization": f"Bearer {READ_TOKEN}"}
    )
    assert status == 404 and "not found" in json.loads(body)["detail"]
    assert (
        http(
            "GET", f"{service}/api/experiments/999999/offline-gate", {"Authorization": f"Bearer {READ_TOKEN}"}
        )[0]
        == 404
    )
    assert http("GET", f"{service}/api/experiments/{DEMO}/offline-gate")[0] == 401
    assert (
        http("GET", f"{service}/api/experiments/{DEMO}/offline-gate", {"Authorization": "Bearer wrong"})[0]
        == 403
    )


def test_the_page_query_keeps_outputs_bounded(service: str) -> None:
    # Every output is cut at the documented length; its full length is reported beside it.
    from analytics.report.offline_gate import MAX_OUTPUT_CHARS

    items = gate_of(service, DEMO, "?items=100")["failing_items"]["items"]
    for i in items:
        assert len(i["candidate_output"]) <= MAX_OUTPUT_CHARS and i["candidate_output_chars"] >= len(
            i["candidate_output"]
        )
