"""The significance dashboard in a real headless Chromium against the real analytics service:
pages load, charts draw, every number shown equals the report API's (with the documented
rounding), the page refreshes itself, and nothing reaches the console as an error."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.analytics.web.conftest import LAPTOP, Seeded, WatchedPage
from tests.analytics.web.formatting import FORMATS, resolve
from tests.services import READ_TOKEN, ROOT, get_json, http

AUTH = {"Authorization": f"Bearer {READ_TOKEN}"}

# The docs' screenshots are refreshed only on request (LIFTGATE_UPDATE_SCREENSHOTS=1), so a
# test run leaves the working tree clean; otherwise they go to a scratch folder.
SCREENSHOTS = (
    ROOT / "docs" / "img"
    if os.environ.get("LIFTGATE_UPDATE_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "liftgate-screenshots"
)
STATIC = ROOT / "analytics" / "web" / "static"
WAIT_MS = 30_000


def open_page(w: WatchedPage, url: str) -> None:
    w.page.goto(url)
    # A completed refresh cycle (report fetched and drawn), not a fixed sleep.
    try:
        w.page.wait_for_function(
            "window.liftgate && (window.liftgate.refreshes >= 1 || window.liftgate.lastError)",
            timeout=WAIT_MS,
        )
    except PlaywrightTimeoutError:
        raise AssertionError(f"{url} never refreshed; console: {w.errors}") from None
    last_error = w.page.evaluate("window.liftgate.lastError")
    assert last_error is None, f"page could not refresh: {last_error}; console: {w.errors}"


def shown_numbers(w: WatchedPage, scope: str = "main") -> list[dict[str, str]]:
    """Numbers under ``scope``; ``main`` means the report's (the rollout card has its own API)."""
    selector = "main .num:not(#rollout .num)" if scope == "main" else f"{scope} .num"
    rows: list[dict[str, str]] = w.page.eval_on_selector_all(
        selector,
        "els => els.map(e => ({ptr: e.dataset.ptr, fmt: e.dataset.fmt, raw: e.dataset.raw, text: e.textContent}))",
    )
    return rows


def assert_numbers_match(numbers: list[dict[str, str]], doc: Any) -> None:
    assert numbers, "no numbers on the page"
    for n in numbers:
        value = resolve(doc, n["ptr"])
        expected = FORMATS[n["fmt"]](value)
        assert n["text"] == expected, (
            f"{n['ptr']}: page shows {n['text']!r}, API value {value!r} → {expected!r}"
        )
        if value is None:
            assert n["raw"] == ""
        else:
            assert float(n["raw"]) == float(value), f"{n['ptr']}: raw {n['raw']} != {value}"


def canvas_has_pixels(w: WatchedPage, selector: str) -> bool:
    drawn: bool = w.page.eval_on_selector(
        selector,
        """c => {
            const chart = Chart.getChart(c);
            if (!chart) return false;
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let coloured = 0;
            for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0) coloured++;
            return coloured > 500;
        }""",
    )
    return drawn


def test_experiment_list_shows_every_experiment_with_the_apis_numbers(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard")
    api = get_json(f"{analytics_url}/api/experiments", READ_TOKEN)
    names = watched.page.eval_on_selector_all(
        "#experiments tbody tr", "rs => rs.map(r => r.dataset.experiment)"
    )
    assert names == [e["name"] for e in api]
    assert {seeded.ab, seeded.rollout, seeded.shadow} <= set(names)
    assert_numbers_match(shown_numbers(watched, "#experiments"), api)
    # A rollout's stage is the candidate's share (stage index 2 of [1, 5, 10, …] is 10%).
    stage = watched.page.inner_text(f'#experiments tr[data-experiment="{seeded.rollout}"] td:nth-child(5)')
    assert stage == "10.0%" and next(e for e in api if e["name"] == seeded.rollout)["stage_percent"] == 10
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched.page.screenshot(path=str(SCREENSHOTS / "experiments.png"))
    verdicts = watched.page.eval_on_selector_all(
        "#experiments tbody tr",
        "rs => rs.map(r => r.querySelector('[data-verdict]')?.dataset.verdict ?? null)",
    )
    assert verdicts == [e["verdict"] for e in api]
    assert watched.errors == []


def test_ab_experiment_page_draws_charts_and_matches_the_report(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.ab}")
    report = get_json(f"{analytics_url}/api/experiments/{seeded.ab}/report", READ_TOKEN)
    assert watched.page.inner_text("#head h1") == report["name"]
    assert_numbers_match(shown_numbers(watched), report)
    assert canvas_has_pixels(watched, "#forest")
    assert canvas_has_pixels(watched, "#timeseries")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    watched.page.screenshot(path=str(SCREENSHOTS / "experiment.png"), full_page=True)
    # What a laptop shows without scrolling (the README's picture).
    watched.page.screenshot(path=str(SCREENSHOTS / "experiment-laptop.png"))
    assert watched.errors == []


def test_selectors_fit_their_card_forest_labels_are_whole_and_p_columns_are_explained(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.ab}")
    boxes = watched.page.evaluate(
        """() => {
            const card = document.querySelector('#timeseries-card').getBoundingClientRect();
            // The visible selectors (the candidate one is hidden with a single candidate).
            return [...document.querySelectorAll('#timeseries-card select')].filter(s => s.offsetParent).map(s => {
                const r = s.getBoundingClientRect();
                return {left: r.left - card.left, right: card.right - r.right, width: r.width};
            });
        }"""
    )
    assert boxes and all(b["left"] >= 0 and b["right"] >= 0 and b["width"] > 40 for b in boxes), boxes
    # The forest's y labels: every metric's whole name (wrapped, never cut with "…"), and the
    # label column fits left of the plot inside the canvas.
    forest = watched.page.evaluate(
        """() => {
            const chart = Chart.getChart(document.querySelector('#forest'));
            const y = chart.scales.y;
            return {
                shown: y.ticks.map((t, i) => [].concat(y.options.ticks.callback(t.value, i)).join(' ')),
                names: window.liftgate.page.forest.rows.map(r => r.label),
                left: y.left, right: y.right, plotLeft: chart.chartArea.left,
                widest: y._labelSizes ? y._labelSizes.widest.width : 0,
                // Room between rows against the tallest label (lines × line height): no overlap.
                spacing: y.ticks.length > 1 ? y.getPixelForTick(1) - y.getPixelForTick(0) : 1e9,
                tallest: y._labelSizes ? Math.max(...y._labelSizes.heights) : 0,
            };
        }"""
    )
    assert forest["shown"] == forest["names"] and len(forest["names"]) >= 10
    assert not any("…" in n for n in forest["shown"])
    assert forest["left"] >= 0 and forest["right"] <= forest["plotLeft"] + 1
    assert 0 < forest["widest"] <= forest["right"] - forest["left"], forest
    assert forest["tallest"] > 14 and forest["spacing"] >= forest["tallest"], (
        forest
    )  # wrapped, not overlapping
    # The metrics table explains its p-value columns, in the page and on each header.
    notes = watched.page.inner_text("#p-notes")
    assert all(
        word in notes for word in ("p (fixed)", "p Holm", "seq. p Holm", "fixed-horizon", "always-valid")
    )
    titles = watched.page.eval_on_selector_all(
        "#results thead th",
        "ths => ths.filter(t => /p/.test(t.textContent) && t.title).map(t => t.textContent)",
    )
    assert {"p (fixed)", "p Holm", "seq. p Holm"} <= set(titles)
    assert watched.errors == []


def test_the_forest_is_drawn_at_its_new_height_in_the_same_update(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    """An update that changes the forest's row count draws it at the box's new height at once:
    Chart.js follows its container's size through a ResizeObserver, after the update, so a
    frame drawn in between put more rows in the old height and their labels overlapped (a
    CI run read the page in that frame: rows 12 px apart, labels 40 px tall)."""
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.ab}")
    drawn = watched.page.evaluate(
        """() => {
            const forest = window.liftgate.page.forest;
            const rows = forest.rows.concat(forest.rows.map(r => ({...r, label: r.label + " (again)"})));
            forest.update(rows);  // twice the rows: the box grows; read before any observer runs
            const chart = forest.chart;
            const y = chart.scales.y;
            return {
                rows: rows.length,
                box: chart.canvas.parentNode.getBoundingClientRect().height,
                canvas: chart.height,
                spacing: y.getPixelForTick(1) - y.getPixelForTick(0),
                tallest: Math.max(...y._labelSizes.heights),
            };
        }"""
    )
    assert drawn["rows"] >= 20
    assert abs(drawn["canvas"] - drawn["box"]) <= 1, drawn
    assert drawn["spacing"] >= drawn["tallest"] > 14, drawn


def test_segment_selector_switches_forest_and_table_to_the_segment_results(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.ab}")
    report = get_json(f"{analytics_url}/api/experiments/{seeded.ab}/report", READ_TOKEN)
    assert report["segments"], "the seeded experiment has task segments"
    k = next(i for i, s in enumerate(report["segments"]) if s["segment"] == "task=math")
    watched.page.select_option("#segment", "task=math")
    ptrs = [n["ptr"] for n in shown_numbers(watched, "#results")]
    assert ptrs and all(ptr.startswith(f"/segments/{k}/results/") for ptr in ptrs)
    assert_numbers_match(shown_numbers(watched), report)
    labels = watched.page.evaluate("Chart.getChart(document.querySelector('#forest')).data.labels.length")
    candidates = [r for r in report["segments"][k]["results"] if not r["is_control"]]
    assert labels == len(candidates)
    assert watched.errors == []


def test_shadow_experiment_shows_the_paired_comparison(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.shadow}")
    report = get_json(f"{analytics_url}/api/experiments/{seeded.shadow}/report", READ_TOKEN)
    assert report["paired"] and report["paired"][0]["pairs"] > 0
    assert watched.page.is_visible("#paired-card")
    shown = {m["name"] for m in report["paired"][0]["metrics"]}
    rows = watched.page.eval_on_selector_all(
        "#paired tr[data-paired-metric]", "rs => rs.map(r => r.dataset.pairedMetric)"
    )
    assert set(rows) == shown
    paired_numbers = shown_numbers(watched, "#paired")
    assert any(n["ptr"].endswith("/mean_difference") for n in paired_numbers)
    assert_numbers_match(shown_numbers(watched), report)
    watched.page.screenshot(path=str(SCREENSHOTS / "shadow.png"), full_page=True)
    assert watched.errors == []


def test_page_refreshes_in_place_when_a_new_snapshot_arrives(
    watched: WatchedPage, analytics_url: str, seeded: Seeded, add_batch: Callable[[str], None]
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.ab}?refresh=1")
    before = watched.page.get_attribute("#generated", "data-generated")
    watched.page.evaluate("window.__sameDocument = true")
    points_before = watched.page.evaluate(
        "Chart.getChart(document.querySelector('#timeseries')).data.datasets[4].data.length"
    )
    add_batch(seeded.ab)
    watched.page.wait_for_function(
        "b => document.querySelector('#generated').dataset.generated !== b", arg=before, timeout=WAIT_MS
    )
    assert watched.page.evaluate("window.__sameDocument === true"), "the page reloaded instead of redrawing"
    report = get_json(f"{analytics_url}/api/experiments/{seeded.ab}/report", READ_TOKEN)
    assert watched.page.get_attribute("#generated", "data-generated") == report["generated_at"]
    assert_numbers_match(shown_numbers(watched), report)
    points_after = watched.page.evaluate(
        "Chart.getChart(document.querySelector('#timeseries')).data.datasets[4].data.length"
    )
    assert points_after == points_before + 1
    assert watched.errors == []


def test_rollout_page_shows_the_stage_timeline_from_the_rollout_api(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.rollout}")
    report = get_json(f"{analytics_url}/api/experiments/{seeded.rollout}/report", READ_TOKEN)
    rollout = get_json(f"{analytics_url}/api/experiments/{seeded.rollout}/rollout", READ_TOKEN)
    assert watched.page.is_visible("#rollout-card")
    decisions = watched.page.eval_on_selector_all(
        "#rollout-timeline tr[data-decision]", "rs => rs.map(r => r.dataset.decision)"
    )
    newest_first = sorted(rollout["decisions"], key=lambda d: (d["created_at"], d["id"]), reverse=True)
    assert decisions == [d["decision"] for d in newest_first]
    reasons = watched.page.eval_on_selector_all(
        "#rollout-timeline tr[data-decision] td:nth-child(4)", "ts => ts.map(t => t.textContent)"
    )
    assert reasons == [d["reason"] for d in newest_first]
    current = watched.page.get_attribute(".ladder li.current", "data-stage")
    assert current == str(rollout["stage"])
    assert_numbers_match(shown_numbers(watched, "#rollout"), rollout)
    assert_numbers_match(shown_numbers(watched, "main"), report)
    # The header names the stage by the candidate's share, as the rollout card does.
    assert report["rollout"]["stage_percent"] == rollout["stage_percent"] == 10
    assert "stage 10.0%" in watched.page.inner_text("#head .facts")
    watched.page.screenshot(path=str(SCREENSHOTS / "rollout.png"), full_page=True)
    assert watched.errors == []


def test_experiment_without_traffic_renders_without_errors(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.empty}")
    report = get_json(f"{analytics_url}/api/experiments/{seeded.empty}/report", READ_TOKEN)
    assert report["units"] == 0
    assert watched.page.inner_text("#head h1") == seeded.empty
    shown = watched.page.eval_on_selector_all("#head [data-verdict]", "bs => bs.map(b => b.dataset.verdict)")
    assert shown == [v["verdict"] for v in report["verdicts"]]
    assert watched.page.is_visible("#ts-empty")
    assert_numbers_match(shown_numbers(watched), report)
    assert watched.errors == []


def test_unknown_experiment_says_so_in_the_page(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    watched.page.goto(f"{analytics_url}/dashboard/experiments/no-such-experiment")
    watched.page.wait_for_function("window.liftgate && window.liftgate.lastError", timeout=WAIT_MS)
    assert "No such experiment" in watched.page.inner_text("#head")
    assert "not found" in watched.page.inner_text("#refresh-status")
    # The browser logs the API's 404 itself; no script error may accompany it.
    assert [e for e in watched.errors if "404" not in e] == []


def test_assets_are_served_from_the_package_and_nothing_from_elsewhere(analytics_url: str) -> None:
    status, html = http("GET", f"{analytics_url}/dashboard", AUTH)
    assert status == 200
    refs = re.findall(rb'(?:src|href)="([^"]+)"', html)
    assets = [r.decode() for r in refs if not r.startswith(b"data:")]
    assert assets and all(a.startswith("/dashboard") or a.startswith("/api") for a in assets), assets
    for asset in assets:
        if asset.startswith("/dashboard/static/"):
            code, body = http("GET", f"{analytics_url}{asset}", AUTH)
            assert code == 200 and body, asset
    for js in (STATIC / "js").glob("*.js"):
        imports = re.findall(r'from "([^"]+)"', js.read_text())
        assert all(i.startswith("./") for i in imports), f"{js.name} imports {imports}"
    code, _ = http("GET", f"{analytics_url}/dashboard/static/%2e%2e/pages.py", AUTH)
    assert code == 404
    code, _ = http("GET", f"{analytics_url}/dashboard/static/js/missing.js", AUTH)
    assert code == 404


def test_a_browser_without_a_session_signs_in_with_the_token_and_lands_where_it_was_going(
    browser: Browser, analytics_url: str, seeded: Seeded
) -> None:
    context = browser.new_context(viewport=LAPTOP)
    try:
        page = context.new_page()
        page.goto(f"{analytics_url}/dashboard/experiments/{seeded.ab}")
        assert "/dashboard/login" in page.url and page.locator("input[name=password]").is_visible()
        page.fill("input[name=password]", "not-the-token-" + "x" * 8)
        page.click("button[type=submit]")
        assert "not valid" in page.inner_text("form")
        page.fill("input[name=password]", READ_TOKEN)
        page.click("button[type=submit]")
        page.wait_for_function("window.liftgate && window.liftgate.refreshes >= 1", timeout=WAIT_MS)
        assert page.url.endswith(f"/dashboard/experiments/{seeded.ab}")
        cookie = next(c for c in context.cookies() if c["name"] == "lg_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and READ_TOKEN not in cookie["value"]
    finally:
        context.close()


def test_the_metrics_table_names_each_rows_method_as_the_report_does(
    watched: WatchedPage, analytics_url: str, seeded: Seeded
) -> None:
    open_page(watched, f"{analytics_url}/dashboard/experiments/{seeded.ab}")
    report = get_json(f"{analytics_url}/api/experiments/{seeded.ab}/report", READ_TOKEN)
    shown = watched.page.eval_on_selector_all(
        "#results tbody tr",
        """rs => rs.map(r => {
            const t = r.querySelector('.tag.method');
            return {metric: r.dataset.metric, variant: r.dataset.variant,
                    method: t ? {test: t.dataset.test, interval: t.dataset.interval, cuped: t.dataset.cuped,
                                 sequential: t.dataset.sequential, title: t.title} : null};
        })""",
    )
    expected = {
        (r["metric"], r["variant"]): r.get("method") for r in report["results"] if not r["is_control"]
    }
    assert shown and len(shown) == len(expected)
    with_method = 0
    for row in shown:
        api = expected[(row["metric"], row["variant"])]
        if api is None:
            assert row["method"] is None, row
            continue
        with_method += 1
        got = row["method"]
        assert got is not None, row
        assert {k: got[k] for k in ("test", "interval", "cuped", "sequential")} == {
            k: api[k] for k in ("test", "interval", "cuped", "sequential")
        }
        assert f"tuned at {api['planned_units']} units" in got["title"]
        assert ("Welch t test" in got["title"]) == (api["test"] == "welch_t")
    assert with_method >= 1
    caption = watched.page.inner_text("#results-method")
    assert "always-valid" in caption and "one planned look" in caption
    assert watched.errors == []


def test_a_report_in_another_convention_is_computed_and_a_bad_one_refused_with_a_reason(
    analytics_url: str, seeded: Seeded
) -> None:
    url = f"{analytics_url}/api/experiments/{seeded.ab}/report"
    status, body = http("GET", url + "?cuped_theta=sideways", AUTH)
    assert status == 422 and b"cuped_theta" in body and b"per_arm" in body, body
    status, body = http("GET", url + "?proportion_test=fisher", AUTH)
    assert status == 422 and b"proportion_test" in body and b"pooled_z" in body, body
    default = get_json(url, READ_TOKEN)
    chosen = get_json(url + "?proportion_test=pooled_z&cuped_theta=per_arm", READ_TOKEN)
    kinds = {m["name"]: m["kind"] for m in chosen["metrics"]}
    tested = [r for r in chosen["results"] if r.get("method")]
    assert tested, "the A/B experiment has candidate rows with a test"
    for r in tested:
        assert r["method"]["test"] == ("pooled_z" if kinds[r["metric"]] == "proportion" else "welch_t")
        assert r["method"]["cuped"] in ("none", "per_arm")
    assert all(r["method"]["cuped"] != "per_arm" for r in default["results"] if r.get("method"))
