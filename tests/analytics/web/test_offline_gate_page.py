"""The offline gate page in a real Chromium against the real analytics service, over real
gate runs: every number equals the API's, the matrix is coloured by the decision's verdicts,
the hook says the candidate gets no traffic, lost items show both outputs, and model output
full of markup is shown as text and never runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text

from liftgate.simulator_process import SimulatorProcess
from tests.analytics.offline_gate_data import MARKUP, MARKUP_ITEMS, demo_gated, markup_gated, stub_upstream
from tests.analytics.web.conftest import WatchedPage
from tests.analytics.web.test_dashboard import SCREENSHOTS, assert_numbers_match, open_page, shown_numbers
from tests.evals.conftest import SIM_MODELS
from tests.services import READ_TOKEN, get_json

PAGE = 20


@dataclass(frozen=True, slots=True)
class Gated:
    demo: str
    markup: str


@pytest.fixture(scope="module")
def gated(engine: Engine, analytics_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    with SimulatorProcess(SIM_MODELS) as sim, stub_upstream() as stub:
        demo = demo_gated(engine, sim.url + "/v1", "coder-offline-gate")
        markup = markup_gated(engine, stub, "chat-markup-gate", tmp_path_factory.mktemp("markup"))
    yield Gated(demo, markup)


def api_doc(analytics_url: str, ref: str, offset: int = 0) -> dict[str, Any]:
    doc = get_json(
        f"{analytics_url}/api/experiments/{ref}/offline-gate?items={PAGE}&offset={offset}", READ_TOKEN
    )
    assert isinstance(doc, dict)
    return doc


def page_url(analytics_url: str, ref: str) -> str:
    return f"{analytics_url}/dashboard/experiments/{ref}/offline-gate?refresh=0"


def lost_items(w: WatchedPage) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = w.page.eval_on_selector_all(
        "#failing .lost",
        """els => els.map(e => ({item: e.dataset.item,
            baseline: e.querySelector('pre[data-side=baseline]').textContent,
            candidate: e.querySelector('pre[data-side=candidate]').textContent,
            baseline_reason: e.querySelector('.reason[data-side=baseline]').textContent,
            candidate_reason: e.querySelector('.reason[data-side=candidate]').textContent}))""",
    )
    return rows


def expected_items(doc: dict[str, Any]) -> list[dict[str, str]]:
    return [{"item": f"{i['dataset']}/{i['item_id']}/{i['sample']}", "baseline": i["baseline_output"] or "",
             "candidate": i["candidate_output"] or "", "baseline_reason": i["baseline_reason"] or "",
             "candidate_reason": i["candidate_reason"] or ""} for i in doc["failing_items"]["items"]]  # fmt: skip


def test_the_gate_page_numbers_colours_hook_and_lost_items_equal_the_api(
    watched: WatchedPage, analytics_url: str, gated: Gated
) -> None:
    open_page(watched, page_url(analytics_url, gated.demo))
    doc = api_doc(analytics_url, gated.demo)
    numbers = shown_numbers(watched)
    assert_numbers_match(numbers, doc)
    ptrs = {n["ptr"] for n in numbers}
    (cand,) = doc["candidates"]
    for i in range(len(cand["decision"]["categories"])):
        for field in (
            "n",
            "baseline",
            "candidate",
            "difference",
            "ci_lower",
            "ci_upper",
            "p_worse_holm",
            "margin",
        ):
            assert f"/candidates/0/decision/categories/{i}/{field}" in ptrs
    for i, row in enumerate(doc["matrix"]["rows"]):
        for variant, cell in row["cells"].items():
            assert f"/matrix/rows/{i}/cells/{variant}/ci_lower" in ptrs
            shown = watched.page.eval_on_selector(
                f'#gate-matrix tr[data-row="{row["dataset"]}/{row["category"]}"] td[data-variant="{variant}"]',
                "td => [td.dataset.verdict, td.className]",
            )
            tone = {"pass": "good", "forgetting": "bad", "insufficient": "warn", None: "neutral"}[
                cell["verdict"]
            ]
            assert shown[0] == (cell["verdict"] or "") and tone in shown[1].split()
    verdicts = {c["category"]: c["verdict"] for c in cand["decision"]["categories"]}
    assert verdicts["code"] == "forgetting" and verdicts["math"] == "pass"

    hook = watched.page.locator('[data-hook="candidate"]')
    assert hook.get_attribute("data-passed") == "false" and hook.get_attribute("data-required") == "true"
    assert "candidate gets no traffic until the offline gate passes" in hook.inner_text()
    assert hook.locator(".hook-reason").inner_text() == f"({cand['check']['reason']})"
    reasons = watched.page.eval_on_selector_all(
        ".gate-decision ul.reasons li", "ls => ls.map(l => l.textContent)"
    )
    assert reasons == cand["decision"]["reasons"] and reasons[0].startswith("forgetting: code −")

    assert doc["failing_items"]["total"] > PAGE
    assert lost_items(watched) == expected_items(doc)
    assert watched.page.inner_text("#page-info") == f"1–{PAGE} of {doc['failing_items']['total']}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # The decision, the matrix and the first lost items (the whole list is pages long).
    watched.page.screenshot(path=str(SCREENSHOTS / "offline-gate.png"), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1366, "height": 1100})  # fmt: skip
    assert watched.errors == []


def test_the_next_page_of_lost_items_is_the_apis_next_page(
    watched: WatchedPage, analytics_url: str, gated: Gated
) -> None:
    open_page(watched, page_url(analytics_url, gated.demo))
    watched.page.click("#next")
    watched.page.wait_for_function(
        f"document.querySelector('#page-info').textContent.startsWith('{PAGE + 1}–')"
    )
    doc = api_doc(analytics_url, gated.demo, PAGE)
    assert lost_items(watched) == expected_items(doc)
    assert_numbers_match(shown_numbers(watched), doc)
    watched.page.click("#prev")
    watched.page.wait_for_function("document.querySelector('#page-info').textContent.startsWith('1–')")
    assert lost_items(watched) == expected_items(api_doc(analytics_url, gated.demo))
    assert watched.errors == []


def test_model_output_with_script_tags_renders_as_text_and_never_runs(
    watched: WatchedPage, analytics_url: str, gated: Gated
) -> None:
    open_page(watched, page_url(analytics_url, gated.markup))
    doc = api_doc(analytics_url, gated.markup)
    shown = lost_items(watched)
    assert len(shown) == MARKUP_ITEMS and shown == expected_items(doc)
    assert all(s["candidate"].startswith(MARKUP) for s in shown)
    assert watched.page.evaluate("window.__xss === undefined")
    assert watched.page.eval_on_selector_all("#failing script, #failing img", "els => els.length") == 0
    chat = watched.page.eval_on_selector(
        '#gate-matrix td[data-variant="candidate"]', "td => td.dataset.verdict"
    )
    assert chat == "insufficient"
    assert watched.errors == []


def test_the_experiment_page_links_to_its_offline_gate_page(
    watched: WatchedPage, analytics_url: str, gated: Gated
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{gated.demo}?refresh=0")
    watched.page.click("#offline-gate-link")
    watched.page.wait_for_url(f"**/dashboard/experiments/{gated.demo}/offline-gate")
    watched.page.wait_for_function("window.liftgate && window.liftgate.refreshes >= 1")
    assert watched.page.inner_text("#head h1") == gated.demo
    assert watched.errors == []


def test_a_running_ab_tests_failed_gate_says_the_candidate_still_gets_traffic(
    watched: WatchedPage, analytics_url: str, gated: Gated, engine: Engine
) -> None:
    """The gate holds a candidate when an A/B test starts; declared or failed later, it leaves
    the users with it. The page said "gets no traffic" there (the demo's case); now it says
    what is true and how to stop it."""
    set_status = text("UPDATE experiments SET status = :s WHERE name = :n")
    with engine.begin() as conn:
        conn.execute(set_status, {"s": "running", "n": gated.demo})
    try:
        open_page(watched, page_url(analytics_url, gated.demo))
        (cand,) = api_doc(analytics_url, gated.demo)["candidates"]
        assert cand["serving"] is True and cand["check"]["passed"] is False
        hook = watched.page.locator('[data-hook="candidate"]')
        assert hook.get_attribute("data-serving") == "true" and hook.get_attribute("data-passed") == "false"
        shown = hook.inner_text()
        assert "candidate is still getting traffic" in shown and "Pause the experiment" in shown
        assert "gets no traffic" not in shown
        assert watched.errors == []
    finally:
        with engine.begin() as conn:
            conn.execute(set_status, {"s": "draft", "n": gated.demo})
