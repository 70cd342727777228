"""Acting from the dashboard in a real Chromium: signing in as a user, experiment and
rollout actions, weights, a new experiment from pasted YAML, upstreams and client keys —
and the refusals: CSRF, a viewer acting, an operator managing keys."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Browser, Page
from sqlalchemy import Engine, text

from tests.analytics.web.conftest import LAPTOP, snapshot
from tests.analytics.web.seed import ExperimentSpec, VariantSpec, add_units, create_experiment
from tests.analytics.web.test_dashboard import SCREENSHOTS
from tests.services import http

WAIT_MS = 20_000


def admin_call(url: str, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, raw = http(method, url + path, {"Authorization": f"Bearer {token}"}, 30, body)
    return status, json.loads(raw) if raw else None


def new_user(url: str, token: str, role: str) -> tuple[str, str]:
    name, password = f"{role}-{secrets.token_hex(3)}", secrets.token_urlsafe(15)
    status, body = admin_call(
        url, token, "POST", "/admin/users", {"name": name, "role": role, "password": password}
    )
    assert status == 201, body
    return name, password


def experiment_body(upstream: str, name: str | None = None) -> dict[str, Any]:
    return {
        "name": name or f"ui-{secrets.token_hex(3)}",
        "route": f"ui-route-{secrets.token_hex(3)}",
        "mode": "ab",
        "variants": [
            {"name": "baseline", "upstream": upstream, "model": "m1", "weight": 50, "is_control": True},
            {"name": "candidate", "upstream": upstream, "model": "m2", "weight": 50},
        ],
    }


@pytest.fixture(scope="module")
def upstream(analytics_url: str, admin_token: str) -> str:
    name = f"ui-up-{secrets.token_hex(3)}"
    status, body = admin_call(
        analytics_url,
        admin_token,
        "POST",
        "/admin/upstreams",
        {"name": name, "base_url": "http://127.0.0.1:9/v1"},
    )
    assert status == 201, body
    return name


@pytest.fixture
def signed_in(browser: Browser, analytics_url: str, admin_token: str) -> Iterator[Any]:
    """Sign a fresh browser context in as a new user of the given role, through the form."""
    contexts = []

    def sign_in(role: str) -> tuple[Page, str, list[str]]:
        name, password = new_user(analytics_url, admin_token, role)
        context = browser.new_context(viewport=LAPTOP, device_scale_factor=1)
        contexts.append(context)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{analytics_url}/dashboard")
        assert "/dashboard/login" in page.url
        page.fill("#name", name)
        page.fill("#password", password)
        page.click("button[type=submit]")
        page.wait_for_selector("#who-name", timeout=WAIT_MS)
        assert page.inner_text("#who-name") == f"{name} · {role}"
        return page, name, errors

    yield sign_in
    for context in contexts:
        context.close()


def actors(engine: Engine, entity: str, entity_id: str) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT action, actor FROM audit_log WHERE entity = :e AND entity_id = :i ORDER BY id"),
            {"e": entity, "i": entity_id},
        ).all()
    return [(r.action, r.actor) for r in rows]


def test_a_wrong_password_is_refused_and_the_sign_in_page_says_so(
    browser: Browser, analytics_url: str, admin_token: str
) -> None:
    name, _ = new_user(analytics_url, admin_token, "viewer")
    context = browser.new_context(viewport=LAPTOP)
    try:
        page = context.new_page()
        page.goto(f"{analytics_url}/dashboard/login")
        page.fill("#name", name)
        page.fill("#password", "not-the-password")
        page.click("button[type=submit]")
        assert "Wrong user name or password" in page.inner_text(".error")
        assert not any(c["name"] == "lg_session" for c in context.cookies())
        page.screenshot(path=str(SCREENSHOTS / "sign-in.png"))
    finally:
        context.close()


def test_an_operator_starts_pauses_and_stops_an_experiment_and_is_the_audited_actor(
    signed_in: Any, analytics_url: str, admin_token: str, upstream: str, engine: Engine
) -> None:
    status, created = admin_call(
        analytics_url, admin_token, "POST", "/admin/experiments", experiment_body(upstream)
    )
    assert status == 201, created
    page, name, errors = signed_in("operator")
    page.goto(f"{analytics_url}/dashboard/experiments/{created['name']}")
    page.wait_for_selector("#experiment-actions button[data-action=start]", timeout=WAIT_MS)
    assert page.locator("#weights-form").count() == 1  # a draft's split is editable
    for action, status_after in (("start", "running"), ("pause", "paused"), ("stop", "stopped")):
        page.click(f"#experiment-actions button[data-action={action}]")
        page.wait_for_function(
            f"document.querySelector('#action-status')?.textContent === '{status_after}'", timeout=WAIT_MS
        )
        assert f"{action}: done" in page.inner_text("#action-result")
        # A started A/B test's split is fixed (the API refuses a change): shown, not offered.
        assert page.locator("#weights-form").count() == 0
        assert "fixed once an A/B test has started" in page.inner_text("#weights-fixed")
        assert "candidate 50" in page.inner_text("#weights-fixed")
    assert actors(engine, "experiment", str(created["id"]))[1:] == [
        ("start", f"user:{name}"),
        ("pause", f"user:{name}"),
        ("stop", f"user:{name}"),
    ]
    assert errors == []


def test_weights_are_edited_on_the_page_and_a_refusal_shows_the_apis_reason(
    signed_in: Any, analytics_url: str, admin_token: str, upstream: str
) -> None:
    status, created = admin_call(
        analytics_url, admin_token, "POST", "/admin/experiments", experiment_body(upstream)
    )
    assert status == 201
    page, _, errors = signed_in("operator")
    page.goto(f"{analytics_url}/dashboard/experiments/{created['name']}")
    page.wait_for_selector("#weights-form input[data-variant=candidate]", timeout=WAIT_MS)
    page.fill("#weights-form input[data-variant=candidate]", "20")
    page.fill("#weights-form input[data-variant=baseline]", "80")
    page.click("#weights-form button[type=submit]")
    page.wait_for_function(
        "document.querySelector('#action-result').textContent.startsWith('weights: done')", timeout=WAIT_MS
    )
    _, after = admin_call(analytics_url, admin_token, "GET", f"/admin/experiments/{created['name']}")
    assert {v["name"]: v["weight"] for v in after["variants"]} == {"baseline": 80, "candidate": 20}
    # A negative weight is stopped by the form itself (min=0); one the API refuses shows its reason.
    page.fill("#weights-form input[data-variant=candidate]", "2000000")
    page.click("#weights-form button[type=submit]")
    page.wait_for_function(
        "document.querySelector('#action-result').textContent.includes('422')", timeout=WAIT_MS
    )
    assert "less than or equal to 1000000" in page.inner_text("#action-result")
    assert errors == []


@pytest.fixture(scope="module")
def rollout_experiment(engine: Engine, analytics_url: str, admin_token: str) -> str:
    spec = ExperimentSpec(
        name=f"ui-rollout-{secrets.token_hex(3)}",
        route=f"ui-rollout-{secrets.token_hex(3)}",
        mode="rollout",
        stage=1,
        rollout_plan={"stages": [1, 5, 10, 25, 50, 100]},
        variants=(VariantSpec("baseline", 95, control=True), VariantSpec("candidate", 5)),
    )
    with engine.begin() as conn:
        eid = create_experiment(conn, spec)
    add_units(engine, eid, spec, 400, 0, np.random.default_rng(3))
    snapshot(analytics_url, admin_token, spec.name)
    return spec.name


def test_a_rollback_needs_a_confirmation_that_shows_the_current_evidence(
    signed_in: Any, analytics_url: str, admin_token: str, rollout_experiment: str
) -> None:
    page, name, errors = signed_in("operator")
    page.goto(f"{analytics_url}/dashboard/experiments/{rollout_experiment}")
    page.wait_for_selector("#rollout-actions button[data-rollout=rollback]", timeout=WAIT_MS)
    page.click("#rollout-actions button[data-rollout=rollback]")
    page.wait_for_selector("#confirm-dialog[open]", timeout=WAIT_MS)
    page.wait_for_function(
        "document.querySelector('#confirm-evidence').textContent.includes('stage')", timeout=WAIT_MS
    )
    evidence = page.inner_text("#confirm-evidence")
    assert "5%" in evidence and "running" in evidence and "plan guardrails" in evidence
    page.screenshot(path=str(SCREENSHOTS / "rollback-confirm.png"))
    page.click("#confirm-cancel")
    _, state = admin_call(analytics_url, admin_token, "GET", f"/api/experiments/{rollout_experiment}/rollout")
    assert state["status"] == "running" and state["stage"] == 1  # cancelled: nothing happened
    page.click("#rollout-actions button[data-rollout=rollback]")
    page.wait_for_selector("#confirm-dialog[open]", timeout=WAIT_MS)
    page.click("#confirm-ok")
    # Confirmed at once, before the evidence finished loading: the answer counts, and does
    # not wait for the evidence (whose report may be slow) to arrive first.
    page.wait_for_function(
        "document.querySelector('#action-result').textContent.startsWith('rollout rollback:')",
        timeout=WAIT_MS,
    )
    assert page.inner_text("#action-result").startswith("rollout rollback: done"), page.inner_text(
        "#action-result"
    )
    _, state = admin_call(analytics_url, admin_token, "GET", f"/api/experiments/{rollout_experiment}/rollout")
    last = state["decisions"][-1]
    assert last["decision"] == "rollback" and last["actor"] == f"user:{name}"
    assert errors == []


def test_a_new_experiment_from_pasted_yaml_is_checked_live_with_the_apis_reasons(
    signed_in: Any, analytics_url: str, admin_token: str, upstream: str, engine: Engine
) -> None:
    page, name, errors = signed_in("operator")
    page.goto(f"{analytics_url}/dashboard/new")
    exp = experiment_body("no-such-upstream")
    status, refused = admin_call(analytics_url, admin_token, "POST", "/admin/experiments", exp)
    assert status == 422
    yaml_text = f"name: {exp['name']}\nroute: {exp['route']}\nmode: ab\nvariants:\n" + "".join(
        f"  - {{name: {v['name']}, upstream: {v['upstream']}, model: {v['model']}, weight: {v['weight']}"
        + (", is_control: true" if v.get("is_control") else "")
        + "}\n"
        for v in exp["variants"]
    )
    page.fill("#yaml", yaml_text)
    page.wait_for_function(
        "t => document.querySelector('#check-result').textContent.includes(t)",
        arg=refused["detail"],
        timeout=WAIT_MS,
    )
    assert page.inner_text("#check-result") == f"422 {refused['detail']}"
    assert page.is_disabled("#create")
    page.fill("#yaml", yaml_text.replace("no-such-upstream", upstream))
    page.wait_for_function(
        "document.querySelector('#check-result').textContent.startsWith('valid')", timeout=WAIT_MS
    )
    with engine.connect() as conn:  # the check wrote nothing
        assert (
            conn.execute(
                text("SELECT count(*) FROM experiments WHERE name = :n"), {"n": exp["name"]}
            ).scalar_one()
            == 0
        )
    page.screenshot(path=str(SCREENSHOTS / "new-experiment.png"), full_page=True)
    page.click("#create")
    page.wait_for_selector("#create-result a", timeout=WAIT_MS)
    status, made = admin_call(analytics_url, admin_token, "GET", f"/admin/experiments/{exp['name']}")
    assert status == 200 and made["status"] == "draft" and made["route"] == exp["route"]
    assert actors(engine, "experiment", str(made["id"])) == [("create", f"user:{name}")]
    assert errors == []


def test_an_admin_manages_upstreams_and_client_keys_and_a_key_is_shown_once(
    signed_in: Any, analytics_url: str, admin_token: str
) -> None:
    page, _, errors = signed_in("admin")
    page.goto(f"{analytics_url}/dashboard/admin")
    page.wait_for_selector("#users tbody tr", timeout=WAIT_MS)
    up, key = f"ui-up-{secrets.token_hex(3)}", f"ui-key-{secrets.token_hex(3)}"
    page.fill("#upstream-form input[name=name]", up)
    page.fill("#upstream-form input[name=base_url]", "http://127.0.0.1:9/v1")
    page.fill("#upstream-form input[name=api_key]", "sk-" + secrets.token_hex(12))
    page.click("#upstream-form button[type=submit]")
    page.wait_for_selector(f"#upstreams tr[data-upstream='{up}']", timeout=WAIT_MS)
    assert "***" in page.inner_text(f"#upstreams tr[data-upstream='{up}']")
    page.fill("#key-form input[name=name]", key)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#new-key", timeout=WAIT_MS)
    shown = page.inner_text("#new-key")
    assert shown.startswith("lg-")
    _, keys = admin_call(analytics_url, admin_token, "GET", "/admin/api-keys")
    assert shown not in json.dumps(keys) and any(k["name"] == key for k in keys)
    page.screenshot(path=str(SCREENSHOTS / "settings.png"), full_page=True)
    page.once("dialog", lambda d: d.accept())
    page.click(f"#keys button[data-revoke-key='{key}']")
    page.wait_for_function(
        f"document.querySelector(\"#keys tr[data-key='{key}']\")?.textContent.includes('revoked')",
        timeout=WAIT_MS,
    )
    page.once("dialog", lambda d: d.accept())
    page.click(f"#upstreams button[data-delete-upstream='{up}']")
    page.wait_for_function(
        f"!document.querySelector(\"#upstreams tr[data-upstream='{up}']\")", timeout=WAIT_MS
    )
    assert errors == []


def test_a_viewer_sees_no_actions_and_the_api_refuses_one_forced_from_the_page(
    signed_in: Any, analytics_url: str, admin_token: str, upstream: str
) -> None:
    status, created = admin_call(
        analytics_url, admin_token, "POST", "/admin/experiments", experiment_body(upstream)
    )
    assert status == 201
    page, _, _ = signed_in("viewer")
    page.goto(f"{analytics_url}/dashboard/experiments/{created['name']}")
    page.wait_for_function(
        "window.liftgate && window.liftgate.refreshes + (window.liftgate.lastError ? 1 : 0) >= 1",
        timeout=WAIT_MS,
    )
    assert page.locator("#actions-card").is_hidden() and page.locator("#new-experiment-link").count() == 0
    forced = page.evaluate(
        """async (ref) => {
          const me = await (await fetch('/admin/me')).json();
          const res = await fetch(`/admin/experiments/${ref}/start`, {method: 'POST', headers: {'X-CSRF-Token': me.csrf}});
          return [res.status, (await res.json()).detail];
        }""",
        created["name"],
    )
    assert forced[0] == 403 and "needs operator" in forced[1]
    _, after = admin_call(analytics_url, admin_token, "GET", f"/admin/experiments/{created['name']}")
    assert after["status"] == "draft"


def test_an_operator_is_refused_client_keys_and_users_on_the_settings_page(
    signed_in: Any, analytics_url: str
) -> None:
    page, _, errors = signed_in("operator")
    page.goto(f"{analytics_url}/dashboard/admin")
    page.wait_for_function(
        "document.querySelector('#keys-result').textContent.includes('403')", timeout=WAIT_MS
    )
    assert "needs admin" in page.inner_text("#keys-result")
    assert "needs admin" in page.inner_text("#users-result")
    page.fill("#key-form input[name=name]", "sneaky")
    page.click("#key-form button[type=submit]")
    # The refresh after the action is refused too: its reason is added to the action's
    # outcome, which stays (it was once written over, a flash a busy browser could miss).
    page.wait_for_function(
        "(t => t.startsWith('create key sneaky: 403') && t.includes(' · list: 403'))"
        "(document.querySelector('#keys-result').textContent)",
        timeout=WAIT_MS,
    )
    assert "needs admin" in page.inner_text("#keys-result").split(" · list: ")[0]
    assert errors == []


def test_a_change_without_the_csrf_token_is_refused_even_with_the_session_cookie(
    signed_in: Any, analytics_url: str, admin_token: str, upstream: str
) -> None:
    status, created = admin_call(
        analytics_url, admin_token, "POST", "/admin/experiments", experiment_body(upstream)
    )
    assert status == 201
    page, _, _ = signed_in("admin")
    answers = page.evaluate(
        """async (ref) => {
          const out = [];
          for (const token of [null, 'forged']) {
            const headers = token ? {'X-CSRF-Token': token} : {};
            const res = await fetch(`/admin/experiments/${ref}/start`, {method: 'POST', headers});
            out.push([res.status, (await res.json()).detail]);
          }
          return out;
        }""",
        created["name"],
    )
    assert [a[0] for a in answers] == [403, 403] and all("CSRF" in a[1] for a in answers)
    _, after = admin_call(analytics_url, admin_token, "GET", f"/admin/experiments/{created['name']}")
    assert after["status"] == "draft"


def test_the_short_form_builds_the_same_experiment_and_is_checked_live(
    signed_in: Any, analytics_url: str, admin_token: str, upstream: str
) -> None:
    page, _, errors = signed_in("operator")
    page.goto(f"{analytics_url}/dashboard/new")
    page.click(".tabs button[data-tab=form]")
    name = f"ui-form-{secrets.token_hex(3)}"
    for field, value in (
        ("name", name),
        ("route", f"{name}-route"),
        ("b_upstream", upstream),
        ("b_model", "m1"),
    ):
        page.fill(f"#form-mode [name={field}]", value)
    page.fill("#form-mode [name=c_upstream]", "nowhere")
    page.fill("#form-mode [name=c_model]", "m2")
    page.wait_for_function(
        "document.querySelector('#check-result').textContent.includes(\"unknown upstream 'nowhere'\")",
        timeout=WAIT_MS,
    )
    page.fill("#form-mode [name=c_upstream]", upstream)
    page.fill("#form-mode [name=c_weight]", "10")
    page.wait_for_function(
        "document.querySelector('#check-result').textContent.startsWith('valid')", timeout=WAIT_MS
    )
    page.click("#create")
    page.wait_for_selector("#create-result a", timeout=WAIT_MS)
    _, made = admin_call(analytics_url, admin_token, "GET", f"/admin/experiments/{name}")
    assert {v["name"]: v["weight"] for v in made["variants"]} == {"baseline": 90, "candidate": 10}
    assert errors == []
