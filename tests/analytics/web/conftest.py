"""Fixtures of the dashboard tests: seeded experiments, the real analytics service in a
subprocess on a free port, and a real headless Chromium driven by Playwright."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, ViewportSize, sync_playwright
from sqlalchemy import Engine, text

from analytics.service.access import login_ticket
from tests.analytics.web.seed import (
    ExperimentSpec,
    VariantSpec,
    add_decisions,
    add_shadow_pairs,
    add_units,
    create_experiment,
)
from tests.known_secrets import secret
from tests.services import READ_TOKEN, analytics_service, http

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP: ViewportSize = {"width": 1366, "height": 768}
BATCHES = 4


@dataclass(frozen=True, slots=True)
class Seeded:
    ab: str
    rollout: str
    shadow: str
    empty: str


AB = ExperimentSpec(
    name="assistant-verbose",
    route="assistant",
    mode="ab",
    variants=(
        VariantSpec("baseline", 50, control=True),
        VariantSpec("candidate", 50, thumbs_up=0.28, latency_ms=860, tokens=240, task_thumbs={"math": 0.6}),
    ),
)
ROLLOUT = ExperimentSpec(
    name="coder-rollout",
    route="coder",
    mode="rollout",
    stage=2,
    rollout_plan={"stages": [1, 5, 10, 25, 50, 100]},
    variants=(VariantSpec("baseline", 90, control=True), VariantSpec("candidate", 10, error=0.012)),
)
EMPTY = ExperimentSpec(
    name="fresh-draft",
    route="fresh",
    mode="ab",
    status="draft",
    variants=(VariantSpec("baseline", 50, control=True), VariantSpec("candidate", 50)),
)
SHADOW = ExperimentSpec(
    name="search-shadow",
    route="search",
    mode="shadow",
    variants=(
        VariantSpec("baseline", 100, control=True),
        VariantSpec("candidate", 0, latency_ms=950, tokens=260),
    ),
)


@pytest.fixture(scope="session")
def admin_token() -> str:
    return secret("dash")


@pytest.fixture(scope="session")
def analytics_url(database_url: str, admin_token: str) -> Iterator[str]:
    """The real analytics service (``python -m analytics``) on a free port; snapshots only on
    demand and the rollout controller off, so the seeded data stays as written while
    pages and the API are compared."""
    with analytics_service(
        database_url,
        admin_token,
        snapshot_interval_s="0",
        report_max_age_s="3600",
        rollout_controller="false",
    ) as url:
        yield url


@pytest.fixture(scope="session")
def seeded(engine: Engine, analytics_url: str, admin_token: str) -> Seeded:
    """Three experiments, data in batches with a snapshot after each (the lift series)."""
    rng = np.random.default_rng(7)
    with engine.begin() as conn:
        ids = {spec.name: create_experiment(conn, spec) for spec in (AB, ROLLOUT, SHADOW)}
        create_experiment(conn, EMPTY)
        add_decisions(
            conn,
            ids[ROLLOUT.name],
            [
                (None, 0, "start", "rollout started at stage 1%"),
                (0, 1, "advance", "stage 1% met its minimums (30 min, 200 units); no guardrail hurt"),
                (1, 1, "hold", "waiting for 500 units per variant (312 so far)"),
                (1, 2, "advance", "stage 5% met its minimums (30 min, 500 units); no guardrail hurt"),
            ],
        )
    add_shadow_pairs(engine, ids[SHADOW.name], SHADOW, 400, rng)
    for batch in range(BATCHES):
        add_units(engine, ids[AB.name], AB, 1200, batch, rng)
        add_units(engine, ids[ROLLOUT.name], ROLLOUT, 600, batch, rng)
        add_units(engine, ids[SHADOW.name], SHADOW, 100, batch, rng)
        for name in ids:
            snapshot(analytics_url, admin_token, name)
    return Seeded(ab=AB.name, rollout=ROLLOUT.name, shadow=SHADOW.name, empty=EMPTY.name)


def snapshot(analytics_url: str, admin_token: str, name: str) -> None:
    headers = {"Authorization": f"Bearer {admin_token}"}
    status, body = http("POST", f"{analytics_url}/api/experiments/{name}/snapshot", headers, 60)
    assert status == 201, body[:500]


@pytest.fixture
def add_batch(engine: Engine, analytics_url: str, admin_token: str) -> Callable[[str], None]:
    """More units for an experiment, then a snapshot (what the snapshotter does on a timer)."""
    specs = {s.name: s for s in (AB, ROLLOUT, SHADOW)}
    rng = np.random.default_rng(11)

    def add(name: str) -> None:
        with engine.connect() as conn:
            eid = conn.execute(text("SELECT id FROM experiments WHERE name = :n"), {"n": name}).scalar_one()
            done = conn.execute(
                text("SELECT count(*) FROM analysis_snapshots WHERE experiment_id = :e"), {"e": eid}
            ).scalar_one()
        add_units(engine, int(eid), specs[name], 300, 100 + int(done), rng)
        snapshot(analytics_url, admin_token, name)

    return add


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@dataclass
class WatchedPage:
    """A page with every console error and uncaught exception recorded."""

    page: Page
    errors: list[str]


@pytest.fixture
def watched(browser: Browser, analytics_url: str, admin_token: str) -> Iterator[WatchedPage]:
    """A signed-in page: the one-time sign-in link ``liftgate up`` would print, opened first."""
    context = browser.new_context(viewport=LAPTOP, device_scale_factor=1)
    page = context.new_page()
    page.goto(f"{analytics_url}/dashboard/login?ticket={login_ticket(admin_token, READ_TOKEN)}")
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"console: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    try:
        yield WatchedPage(page, errors)
    finally:
        context.close()
