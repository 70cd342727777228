"""The notifications page in a real Chromium against the real analytics service: webhooks and
the delivery log as the API has them, the test button delivering a signed notification to a
real receiver (admin), refused for a reader, and reporting a receiver that is down."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.analytics.web.conftest import CHROMIUM_ARGS, LAPTOP, WatchedPage
from tests.analytics.web.test_dashboard import SCREENSHOTS, WAIT_MS, open_page
from tests.control.webhook_receiver import Receiver, running
from tests.known_secrets import secret
from tests.services import READ_TOKEN, get_json, http

SECRET = secret("dash-webhook")
assert CHROMIUM_ARGS  # the browser fixture's flags (same Chromium as every dashboard test)


@pytest.fixture
def receiver(analytics_url: str, admin_token: str) -> Iterator[Receiver]:
    admin = {"Authorization": f"Bearer {admin_token}", "X-Liftgate-Actor": "dash-test"}
    with running(SECRET) as rec:
        for body in (
            {"name": "ops-pager", "url": rec.url, "secret": SECRET, "events": ["rollout.rollback"]},
            {"name": "team-chat", "url": "http://127.0.0.1:9/services/T0/B0/x", "format": "slack",
             "events": ["rollout.rollback", "rollout.promote"]},
        ):  # fmt: skip
            status, out = http("POST", f"{analytics_url}/admin/webhooks", admin, body=body)
            assert status == 201, out
        try:
            yield rec
        finally:
            for name in ("ops-pager", "team-chat"):
                http("DELETE", f"{analytics_url}/admin/webhooks/{name}", admin)


def _test_button(w: WatchedPage, name: str) -> str:
    w.page.click(f'button[data-test="{name}"]')
    w.page.wait_for_function(
        "document.querySelector('#test-result').dataset.status !== undefined", timeout=WAIT_MS
    )
    status: str = w.page.eval_on_selector("#test-result", "e => e.dataset.status")
    w.page.evaluate("delete document.querySelector('#test-result').dataset.status")
    return status


def test_a_reader_sees_webhooks_but_the_test_button_needs_an_admin(
    browser: Browser, analytics_url: str, receiver: Receiver
) -> None:
    # A read-only caller (the read token; the one-time sign-in link is an admin session).
    context = browser.new_context(
        viewport=LAPTOP, device_scale_factor=1, extra_http_headers={"Authorization": f"Bearer {READ_TOKEN}"}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    watched = WatchedPage(page, errors)
    try:
        _reader_checks(watched, analytics_url, receiver)
    finally:
        context.close()


def _reader_checks(watched: WatchedPage, analytics_url: str, receiver: Receiver) -> None:
    open_page(watched, f"{analytics_url}/dashboard/notifications")
    names = watched.page.eval_on_selector_all("#webhooks tbody tr", "rs => rs.map(r => r.dataset.webhook)")
    api = get_json(f"{analytics_url}/api/notifications/webhooks", READ_TOKEN)
    assert names == [h["name"] for h in api] and set(names) >= {"ops-pager", "team-chat"}
    assert SECRET not in watched.page.content() and "/services/T0" not in watched.page.content()
    assert _test_button(watched, "ops-pager") == "error"
    assert "needs an admin sign-in" in watched.page.inner_text("#test-result")
    assert receiver.requests == []
    assert watched.errors == [] or all("403" in e or "401" in e for e in watched.errors)


def test_the_test_button_delivers_a_signed_notification_and_the_log_shows_it(
    browser: Browser, analytics_url: str, admin_token: str, receiver: Receiver
) -> None:
    context = browser.new_context(
        viewport=LAPTOP, device_scale_factor=1, extra_http_headers={"Authorization": f"Bearer {admin_token}"}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    w = WatchedPage(page, errors)
    try:
        open_page(w, f"{analytics_url}/dashboard/notifications")
        assert _test_button(w, "ops-pager") == "delivered"
        (req,) = receiver.requests
        assert req.verdict is None and json.loads(req.body)["type"] == "test"
        assert "ops-pager: delivered evt_" in page.inner_text("#test-result")
        assert _test_button(w, "team-chat") == "failed"
        assert "team-chat: not delivered" in page.inner_text("#test-result")
        page.wait_for_function(
            "document.querySelectorAll('#deliveries tbody tr').length >= 2", timeout=WAIT_MS
        )
        log = get_json(f"{analytics_url}/api/notifications/deliveries?limit=50", READ_TOKEN)
        shown = page.eval_on_selector_all(
            "#deliveries tbody tr", "rs => rs.map(r => [Number(r.dataset.delivery), r.dataset.status])"
        )
        assert shown == [[d["id"], d["status"]] for d in log]
        assert [d["status"] for d in log[:2]] == ["failed", "delivered"]
        # Every button sits inside its card (nothing spills out at laptop width).
        inside = page.eval_on_selector_all(
            "#webhooks button",
            """bs => bs.map(b => { const c = b.closest('.card').getBoundingClientRect();
                                   const r = b.getBoundingClientRect();
                                   return r.left >= c.left && r.right <= c.right; })""",
        )
        assert inside and all(inside)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "notifications.png"))
        assert errors == []
    finally:
        context.close()
