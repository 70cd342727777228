"""The examples and shadow-pair pages in a real Chromium against the real analytics service,
over traffic written by the real ingest: each column and each pair shows what the API
returns for the same filters, pages and filters follow the API's cursor and parameters,
the report's metrics table links to the requests behind a metric, long answers are
collapsed, the content-logging states are explained, and markup in a stored answer is
shown as text and never runs."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import numpy as np
import pytest
from playwright.sync_api import Browser, Page
from sqlalchemy import Engine

from tests.analytics.examples_data import XSS, Seeded, seed_ab, seed_shadow
from tests.analytics.web.conftest import LAPTOP, WatchedPage, snapshot
from tests.analytics.web.formatting import num
from tests.analytics.web.test_actions import new_user
from tests.analytics.web.test_dashboard import SCREENSHOTS, WAIT_MS, open_page
from tests.services import READ_TOKEN, get_json, http

# Stored prompts and answers are an operator's read: the API is asked with the admin token.
_CALLER: dict[str, str] = {}
FULL, OFF, HASHED, SHADOW = "chat-examples", "chat-examples-off", "chat-examples-hashed", "search-pairs"


@pytest.fixture(scope="module")
def data(engine: Engine, analytics_url: str, admin_token: str) -> dict[str, Seeded]:
    _CALLER["token"] = admin_token
    rng = np.random.default_rng(23)
    out = {
        FULL: seed_ab(engine, FULL, "full", 120, rng),
        OFF: seed_ab(engine, OFF, "none", 12, rng),
        HASHED: seed_ab(engine, HASHED, "hashed", 12, rng),
        SHADOW: seed_shadow(engine, SHADOW, 40, rng),
    }
    snapshot(analytics_url, admin_token, FULL)  # the report whose metrics table links here
    return out


def api(analytics_url: str, ref: str, path: str = "examples", **params: Any) -> dict[str, Any]:
    doc = get_json(
        f"{analytics_url}/api/experiments/{ref}/{path}?{urlencode(params, doseq=True)}", _CALLER["token"]
    )
    assert isinstance(doc, dict)
    return doc


def shown_examples(w: WatchedPage, scope: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = w.page.eval_on_selector_all(
        f"{scope} article.example",
        """els => els.map(e => {
            const part = (f) => {
              const c = e.querySelector(`.content[data-field=${f}]`);
              const t = c.querySelector('pre, code.digest');
              return {state: c.dataset.state, text: t ? t.textContent : null};
            };
            return {request_id: e.dataset.requestId, variant: e.dataset.variant,
                    prompt: part('prompt'), response: part('response'),
                    scores: [...e.querySelectorAll('.score')].map(s => s.textContent),
                    feedback: [...e.querySelectorAll('.fb')].map(s => s.textContent)};
        })""",
    )
    return rows


def expected(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def part(c: dict[str, Any]) -> dict[str, Any]:
        return {"state": c["state"], "text": c["text"] if c["state"] in ("full", "hashed") else None}

    def score(j: dict[str, Any]) -> str:
        return f"{j['judge']}: " + (f"no score ({j['status']})" if j["score"] is None else num(j["score"]))

    return [{"request_id": it["request_id"], "variant": it["variant"], "prompt": part(it["prompt"]),
             "response": part(it["response"]), "scores": [score(j) for j in it["judgements"]],
             "feedback": [f"rating {f['value']:g}" if f["kind"] == "rating" else f["kind"] for f in it["feedback"]]}
            for it in items]  # fmt: skip


def column(w: WatchedPage, variant: str) -> str:
    return f'section.column[data-column="{variant}"]'


def page_to(w: WatchedPage, scope: str, sel: str) -> None:
    """Click "next" in a column until ``sel`` is on the page (at most 10 pages)."""
    for page in range(2, 12):
        if w.page.query_selector(sel):
            return
        w.page.click(f"{scope} button.next")
        w.page.wait_for_function(
            f"document.querySelector('{scope} .page-info').textContent.startsWith('page {page} ')",
            timeout=WAIT_MS,
        )
    assert w.page.query_selector(sel), f"{sel} not within 10 pages"


def page_url(analytics_url: str, ref: str, path: str = "examples", **params: Any) -> str:
    return f"{analytics_url}/dashboard/experiments/{ref}/{path}?{urlencode({'refresh': 0, **params}, doseq=True)}"


def test_the_examples_page_shows_each_variants_sample_beside_the_other_as_the_api_returns_it(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, FULL, category="math"))
    names = watched.page.eval_on_selector_all("section.column", "els => els.map(e => e.dataset.column)")
    assert names == ["baseline", "candidate"]
    for variant in names:
        doc = api(analytics_url, FULL, variant=variant, category="math")
        assert doc["items"] and len(doc["items"]) == 20
        assert shown_examples(watched, column(watched, variant)) == expected(doc["items"])
    note = watched.page.eval_on_selector("#content-note", "e => [e.dataset.contentLogging, e.textContent]")
    assert note == ["full", api(analytics_url, FULL)["note"]]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched.page.screenshot(path=str(SCREENSHOTS / "examples.png"), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1366, "height": 900})  # fmt: skip
    assert watched.errors == []


def test_next_and_previous_in_a_column_follow_the_apis_cursor(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, FULL))
    first = api(analytics_url, FULL, variant="candidate")
    second = api(analytics_url, FULL, variant="candidate", cursor=first["next_cursor"])
    scope = column(watched, "candidate")
    watched.page.click(f"{scope} button.next")
    watched.page.wait_for_function(
        f"document.querySelector('{scope} .page-info').textContent.startsWith('page 2')", timeout=WAIT_MS
    )
    assert shown_examples(watched, scope) == expected(second["items"])
    # The other column stays on its first page.
    assert shown_examples(watched, column(watched, "baseline")) == expected(
        api(analytics_url, FULL, variant="baseline")["items"]
    )
    watched.page.click(f"{scope} button.prev")
    watched.page.wait_for_function(
        f"document.querySelector('{scope} .page-info').textContent.startsWith('page 1')", timeout=WAIT_MS
    )
    assert shown_examples(watched, scope) == expected(first["items"])
    assert watched.errors == []


def test_the_filter_form_puts_the_filters_in_the_url_and_the_page_shows_the_apis_answer_for_them(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, FULL))
    assert not watched.page.is_checked('#filters input[name=variant][value="baseline"]')
    watched.page.check('#filters input[name=variant][value="candidate"]')
    watched.page.fill("#filters input[name=feedback]", "thumbs_down")
    watched.page.select_option("#filters select[name=error]", "false")
    watched.page.fill("#filters input[name=score_max]", "0.9")
    with watched.page.expect_navigation():
        watched.page.click("#filters button[type=submit]")
    watched.page.wait_for_function("window.liftgate && window.liftgate.refreshes >= 1", timeout=WAIT_MS)
    query = parse_qs(urlparse(watched.page.url).query)
    assert query == {"variant": ["candidate"], "feedback": ["thumbs_down"], "score_max": ["0.9"],
                     "error": ["false"], "refresh": ["0"]}  # fmt: skip
    doc = api(analytics_url, FULL, variant="candidate", feedback="thumbs_down", error="false", score_max=0.9)
    names = watched.page.eval_on_selector_all("section.column", "els => els.map(e => e.dataset.column)")
    assert names == ["candidate"]
    shown = shown_examples(watched, column(watched, "candidate"))
    assert shown == expected(doc["items"]) and shown
    assert all("thumbs_down" in s["feedback"] for s in shown)
    assert watched.errors == []


def test_a_bad_filter_shows_the_apis_reason_instead_of_an_empty_page(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, FULL, score_min=0.9, score_max=0.1))
    assert watched.page.inner_text("#refused") == (
        "These filters were refused: score_min (0.9) is above score_max (0.1)"
    )
    assert watched.page.eval_on_selector_all("article.example", "els => els.length") == 0
    assert watched.page.input_value("#filters input[name=score_min]") == "0.9"
    # The browser logs the refused request itself; nothing else may reach the console.
    assert [e for e in watched.errors if "status of 422" not in e] == []


def test_a_long_answer_is_collapsed_until_the_reader_expands_it(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    long_req = data[FULL].where(variant="baseline")[0]
    assert long_req.response is not None and len(long_req.response) > 3000
    # The long answer's category narrows the page enough to find it on page 1 or later.
    open_page(
        watched, page_url(analytics_url, FULL, variant="baseline", category=long_req.category, error="false")
    )
    sel = f'article.example[data-request-id="{long_req.request_id}"]'
    scope = column(watched, "baseline")
    page_to(watched, scope, sel)
    pre = f"{sel} pre[data-field=response]"
    heights = watched.page.eval_on_selector(pre, "p => [p.clientHeight, p.scrollHeight, p.className]")
    collapsed = heights[0]
    assert collapsed < 100 and collapsed * 2 < heights[1] and "collapsed" in heights[2]
    assert (
        watched.page.inner_text(f"{sel} button.expand") == f"show all {len(long_req.response):,} characters"
    )
    watched.page.click(f"{sel} button.expand")
    heights = watched.page.eval_on_selector(pre, "p => [p.clientHeight, p.scrollHeight, p.className]")
    assert "collapsed" not in heights[2] and heights[0] == heights[1] > collapsed * 2
    assert watched.page.eval_on_selector(pre, "p => p.textContent") == long_req.response
    assert watched.errors == []


def test_markup_in_a_stored_answer_is_shown_as_text_and_never_runs(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    marked = next(r for r in data[FULL].requests if r.response and XSS in r.response)
    doc = api(analytics_url, FULL, variant="candidate", category=marked.category, limit=100)
    assert marked.request_id in [i["request_id"] for i in doc["items"]]
    open_page(watched, page_url(analytics_url, FULL, variant="candidate", category=marked.category))
    # Page through to the marked answer (bounded).
    sel = f'article.example[data-request-id="{marked.request_id}"]'
    scope = column(watched, "candidate")
    page_to(watched, scope, sel)
    assert (
        watched.page.eval_on_selector(f"{sel} pre[data-field=response]", "p => p.textContent")
        == marked.response
    )
    assert watched.page.evaluate("window.__xss === undefined")
    assert watched.page.eval_on_selector_all("#columns script, #columns img", "els => els.length") == 0
    open_page(watched, page_url(analytics_url, SHADOW, "shadow-pairs"))
    assert "<script>" in watched.page.inner_text("#pairs")
    assert watched.page.evaluate("window.__xss === undefined")
    assert watched.page.eval_on_selector_all("#pairs script, #pairs img", "els => els.length") == 0
    assert watched.errors == []


def test_with_content_logging_off_the_page_says_so_and_shows_metadata_only(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, OFF))
    doc = api(analytics_url, OFF, variant="candidate")
    note = watched.page.eval_on_selector("#content-note", "e => [e.dataset.contentLogging, e.textContent]")
    assert note == ["none", doc["note"]] and note[1].startswith("Content logging is off")
    shown = shown_examples(watched, column(watched, "candidate"))
    assert shown == expected(doc["items"]) and len(shown) == 12
    assert {s["response"]["state"] for s in shown} == {"none"}
    assert watched.page.inner_text(f"{column(watched, 'candidate')} .content[data-field=prompt]").endswith(
        "not logged"
    )
    assert watched.errors == []


def test_with_hashed_content_the_page_shows_digests_and_explains_them(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, HASHED))
    doc = api(analytics_url, HASHED, variant="baseline")
    assert shown_examples(watched, column(watched, "baseline")) == expected(doc["items"])
    assert watched.page.inner_text("#content-note") == doc["note"] and "keyed digests" in doc["note"]
    assert len(watched.page.inner_text(f"{column(watched, 'baseline')} code.digest >> nth=0")) == 64
    assert watched.errors == []


def test_the_shadow_pair_page_shows_both_answers_side_by_side_as_the_api_returns_them(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, SHADOW, "shadow-pairs"))
    doc = api(analytics_url, SHADOW, "shadow-pairs")
    pairs = watched.page.eval_on_selector_all("#pairs .pair", "els => els.map(e => e.dataset.pairId)")
    assert pairs == [p["pair_id"] for p in doc["pairs"]] and len(pairs) == 20
    for p in doc["pairs"]:
        box = f'#pairs .pair[data-pair-id="{p["pair_id"]}"]'
        for side in ("primary", "shadow"):
            assert shown_examples(watched, f'{box} .side[data-side="{side}"]') == expected([p[side]])
        same = watched.page.eval_on_selector_all(
            f"{box} .lost-head .tag", "els => els.map(e => e.textContent)"
        )
        assert same == (["same answer"] if p["same_response"] else [])
    watched.page.click("#next")
    watched.page.wait_for_function("document.querySelector('#page-info').textContent.startsWith('page 2')")
    nxt = api(analytics_url, SHADOW, "shadow-pairs", cursor=doc["next_cursor"])
    shown = watched.page.eval_on_selector_all("#pairs .pair", "els => els.map(e => e.dataset.pairId)")
    assert shown == [p["pair_id"] for p in nxt["pairs"]]
    watched.page.click("#prev")
    watched.page.wait_for_function("document.querySelector('#page-info').textContent.startsWith('page 1')")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched.page.screenshot(path=str(SCREENSHOTS / "shadow-pairs.png"), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1366, "height": 900})  # fmt: skip
    assert watched.errors == []


def test_see_examples_on_a_metric_row_opens_the_requests_behind_that_metric(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{FULL}?refresh=0")
    row = '#results tr[data-metric="thumbs_down_rate"][data-variant="candidate"]'
    with watched.page.expect_navigation():
        watched.page.click(f"{row} a.ex-link")
    watched.page.wait_for_function("window.liftgate && window.liftgate.refreshes >= 1", timeout=WAIT_MS)
    url = urlparse(watched.page.url)
    assert url.path == f"/dashboard/experiments/{FULL}/examples"
    assert parse_qs(url.query) == {"metric": ["thumbs_down_rate"], "variant": ["baseline", "candidate"]}
    for variant in ("baseline", "candidate"):
        doc = api(analytics_url, FULL, variant=variant, metric="thumbs_down_rate")
        assert doc["filter"] == {"variant": variant, "feedback": "thumbs_down"}
        shown = shown_examples(watched, column(watched, variant))
        assert shown == expected(doc["items"]) and shown
        assert all("thumbs_down" in s["feedback"] for s in shown)
    want = {r.request_id for r in data[FULL].where(variant="candidate") if "thumbs_down" in r.feedback}
    got = {s["request_id"] for s in shown_examples(watched, column(watched, "candidate"))}
    assert got <= want and len(got) == min(20, len(want))
    assert "thumbs_down_rate" in watched.page.inner_text("#metric-pill")
    assert watched.errors == []


def test_the_shadow_pair_filters_narrow_to_the_shadow_calls_the_api_returns_for_them(
    watched: WatchedPage, analytics_url: str, data: dict[str, Seeded]
) -> None:
    open_page(watched, page_url(analytics_url, SHADOW, "shadow-pairs"))
    options = watched.page.eval_on_selector_all(
        "#filters select[name=variant] option", "els => els.map(e => e.value)"
    )
    assert options == ["", "candidate"]  # the control is never mirrored
    watched.page.select_option("#filters select[name=variant]", "candidate")
    watched.page.select_option("#filters select[name=error]", "true")
    with watched.page.expect_navigation():
        watched.page.click("#filters button[type=submit]")
    watched.page.wait_for_function("window.liftgate && window.liftgate.refreshes >= 1", timeout=WAIT_MS)
    assert parse_qs(urlparse(watched.page.url).query) == {
        "variant": ["candidate"],
        "error": ["true"],
        "refresh": ["0"],
    }
    doc = api(analytics_url, SHADOW, "shadow-pairs", variant="candidate", error="true")
    want = {r.request_id for r in data[SHADOW].where(role="shadow") if r.failed}
    assert {p["shadow"]["request_id"] for p in doc["pairs"]} == want and want
    pairs = watched.page.eval_on_selector_all("#pairs .pair", "els => els.map(e => e.dataset.pairId)")
    assert pairs == [p["pair_id"] for p in doc["pairs"]]
    answers = watched.page.eval_on_selector_all(
        '#pairs .side[data-side="shadow"] .content[data-field=response]', "els => els.map(e => e.textContent)"
    )
    assert answers == ["answerno answer (the call failed)"] * len(pairs)
    assert watched.errors == []


def _sign_in_through_the_form(page: Page, name: str, password: str) -> None:
    assert "/dashboard/login" in page.url
    page.fill("#name", name)
    page.fill("#password", password)
    page.click("button[type=submit]")


def test_signing_in_from_a_filtered_examples_link_returns_to_that_exact_url(
    browser: Browser, analytics_url: str, admin_token: str, data: dict[str, Seeded]
) -> None:
    """A link shared in a chat (a filtered examples page) opened signed out: after signing in,
    the reader lands on the very same URL — path, filters and order — and sees those requests."""
    name, password = new_user(analytics_url, admin_token, "operator")
    target = page_url(analytics_url, FULL, variant="candidate", feedback="thumbs_down", category="math",
                      error="false")  # fmt: skip
    context = browser.new_context(viewport=LAPTOP)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(target)
        _sign_in_through_the_form(page, name, password)
        page.wait_for_function("window.liftgate && window.liftgate.refreshes >= 1", timeout=WAIT_MS)
        assert page.url == target
        w = WatchedPage(page, errors)
        doc = api(
            analytics_url, FULL, variant="candidate", feedback="thumbs_down", category="math", error="false"
        )
        shown = shown_examples(w, column(w, "candidate"))
        assert shown == expected(doc["items"]) and shown
        assert page.input_value("#filters input[name=feedback]") == "thumbs_down"
        assert errors == []
    finally:
        context.close()


def test_a_viewer_is_told_stored_content_needs_an_operator_and_sees_none_of_it(
    browser: Browser, analytics_url: str, admin_token: str, data: dict[str, Seeded]
) -> None:
    name, password = new_user(analytics_url, admin_token, "viewer")
    context = browser.new_context(viewport=LAPTOP)
    try:
        page = context.new_page()
        for path in ("examples", "shadow-pairs"):
            ref = SHADOW if path == "shadow-pairs" else FULL
            page.goto(page_url(analytics_url, ref, path))
            if "/dashboard/login" in page.url:
                _sign_in_through_the_form(page, name, password)
            page.wait_for_selector("#refused:not([hidden])", timeout=WAIT_MS)
            assert page.inner_text("#refused").startswith(
                "Not shown: stored prompts and answers are for operators and admins"
            )
            assert "needs operator" in page.inner_text("#refused")
            assert page.eval_on_selector_all("article.example, .pair", "els => els.length") == 0
            assert XSS not in page.content()
            assert page.eval_on_selector_all("pre, code.digest", "els => els.length") == 0
    finally:
        context.close()
    status, _ = http(
        "GET", f"{analytics_url}/api/experiments/{FULL}/examples", {"Authorization": f"Bearer {READ_TOKEN}"}
    )
    assert status == 403  # the read token is a viewer too
