"""The "RL risks" panel in a real headless Chromium against the real analytics service: a
reward-hacking candidate (ingested events: judge scores, stored texts, feedback) shows its
alarms, matrix, length decomposition, judge-vs-user chart and phrase table, and every
number on the panel equals the report API's and the /rl-risks endpoint's."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from contracts.ngrams import NgramKey, hash_label
from tests.analytics.report_data import create_experiment
from tests.analytics.risks_data import hashed_events, scenario_events
from tests.analytics.web.conftest import WatchedPage, snapshot
from tests.analytics.web.test_dashboard import SCREENSHOTS, assert_numbers_match, canvas_has_pixels, open_page
from tests.known_secrets import secret
from tests.services import READ_TOKEN, get_json

# Stopped, not running: the session's snapshotters (other modules' service processes) snapshot
# every running experiment, and these carry raw responses the RL-risk section reads.
STOPPED = "stopped"


@pytest.fixture(scope="module")
def hacker(engine: Engine, analytics_url: str, admin_token: str) -> str:
    with engine.begin() as conn:
        eid, name = create_experiment(
            conn, [("control", 1), ("candidate", 1)], status=STOPPED, name="rl-hacker"
        )
    ingest(engine, scenario_events(eid, "reward-hacking", 500, seed=31))
    snapshot(analytics_url, admin_token, name)
    return name


def test_the_rl_risks_panel_shows_the_apis_numbers_and_the_hackers_alarms(
    watched: WatchedPage, analytics_url: str, hacker: str
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{hacker}")
    report = get_json(f"{analytics_url}/api/experiments/{hacker}/report", READ_TOKEN)
    risks = get_json(f"{analytics_url}/api/experiments/{hacker}/rl-risks", READ_TOKEN)
    numbers: list[dict[str, str]] = watched.page.eval_on_selector_all(
        "#risks .num",
        "els => els.map(e => ({ptr: e.dataset.ptr, fmt: e.dataset.fmt, raw: e.dataset.raw, text: e.textContent}))",
    )
    assert len(numbers) > 60
    assert_numbers_match(numbers, report)
    assert_numbers_match(numbers, risks)  # the same pointers resolve in the endpoint's body
    shown = watched.page.eval_on_selector_all(
        "#risks [data-alarm]", "els => els.map(e => [e.dataset.alarm, e.dataset.firing, e.dataset.state])"
    )
    api = [[a["name"], str(a["firing"]).lower(), a["state"]] for a in risks["rl_risks"][0]["alarms"]]
    assert shown == api
    firing = {a for a, f, _ in shown if f == "true"}
    assert {"verbosity", "goodhart", "stuffing"} <= firing
    flagged = watched.page.eval_on_selector_all(
        "#risks tr.tone-bad[data-phrase]", "rs => rs.map(r => r.dataset.phrase)"
    )
    assert "great question" in flagged
    cells = watched.page.eval_on_selector_all("#risks td[data-cell]", "cs => cs.map(c => c.dataset.cell)")
    matrix = risks["rl_risks"][0]["capability"]
    assert sorted(cells) == sorted(f"{c['category']}/{c['metric']}" for c in matrix["cells"])
    assert canvas_has_pixels(watched, "#risk-judge-0")
    summary = watched.page.inner_text("#risks [data-judge-summary]")
    assert summary.startswith("the judge says +")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched.page.eval_on_selector("#risks-card", "e => e.scrollIntoView()")
    watched.page.locator("#risks-card").screenshot(path=str(SCREENSHOTS / "rl-risks.png"))
    assert watched.errors == []


def test_an_experiment_without_responses_shows_the_panel_empty_without_errors(
    watched: WatchedPage, analytics_url: str, engine: Engine, admin_token: str
) -> None:
    with engine.begin() as conn:
        _, name = create_experiment(conn, [("control", 1), ("candidate", 1)], status=STOPPED, name="rl-empty")
    open_page(watched, f"{analytics_url}/dashboard/experiments/{name}")
    assert "No RL-risk analysis yet" in watched.page.inner_text("#risks")
    assert watched.errors == []


def test_the_phrase_table_of_a_hashed_experiment_shows_the_hashes(
    watched: WatchedPage, analytics_url: str, engine: Engine, admin_token: str
) -> None:
    key = NgramKey(secret("ngram"))
    with engine.begin() as conn:
        eid, name = create_experiment(
            conn, [("control", 1), ("candidate", 1)], status=STOPPED, name="rl-hashed"
        )
        conn.execute(text("UPDATE experiments SET content_logging = 'hashed' WHERE id = :e"), {"e": eid})
    ingest(engine, hashed_events(scenario_events(eid, "reward-hacking", 300, seed=37), key))
    snapshot(analytics_url, admin_token, name)
    open_page(watched, f"{analytics_url}/dashboard/experiments/{name}")
    risks = get_json(f"{analytics_url}/api/experiments/{name}/rl-risks", READ_TOKEN)
    part = risks["rl_risks"][0]["phrases"]
    stuffed = hash_label(key.hash("great question"))
    assert part["source"] == "hashed" and stuffed in part["flagged"]
    flagged = watched.page.eval_on_selector_all(
        "#risks tr.tone-bad[data-phrase]", "rs => rs.map(r => r.dataset.phrase)"
    )
    assert flagged == [p for p in part["flagged"]][: len(flagged)] and stuffed in flagged
    hashes = watched.page.eval_on_selector_all("#risks code.hash", "cs => cs.map(c => c.textContent)")
    assert f"#{stuffed}" in hashes
    assert "great question" not in watched.page.inner_text("#risks").lower()
    numbers: list[dict[str, str]] = watched.page.eval_on_selector_all(
        "#risks .num",
        "els => els.map(e => ({ptr: e.dataset.ptr, fmt: e.dataset.fmt, raw: e.dataset.raw, text: e.textContent}))",
    )
    assert_numbers_match(numbers, risks)
    assert "hashed (sampled) responses" in watched.page.inner_text("#risks")
    assert watched.errors == []
