"""Users, roles and their credentials against the real analytics service and PostgreSQL:
hashed storage, API tokens with the user's role, the audit actor, CSRF on session changes,
the sign-in lockout and one-time links."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from typing import Any

from sqlalchemy import Engine, text

from analytics.service.access import login_ticket
from tests.conftest import fresh_database
from tests.control.conftest import TOKEN, AdminService, start_admin_service


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Browser:
    """A cookie-keeping HTTP client that does not follow redirects (stdlib only)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def call(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, str] | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Message, bytes]:
        data = None
        hdrs = dict(headers or {})
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=hdrs)
        try:
            with self.opener.open(req, timeout=30) as res:
                return res.status, res.headers, res.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def sign_in(self, name: str, password: str) -> int:
        status, _, page = self.call("GET", "/dashboard/login")
        assert status == 200
        match = re.search(rb'name="csrf" value="([^"]+)"', page)
        assert match is not None
        form = {"name": name, "password": password, "csrf": match.group(1).decode(), "next": "/dashboard"}
        return self.call("POST", "/dashboard/login", form=form)[0]


def _user(svc: AdminService, role: str, password: str | None = None) -> tuple[str, str]:
    name = f"{role}-{secrets.token_hex(4)}"
    password = password or secrets.token_urlsafe(16)
    status, body = svc.call("POST", "/admin/users", {"name": name, "role": role, "password": password})
    assert status == 201, body
    return name, password


def _token(svc: AdminService, name: str, label: str = "cli") -> str:
    status, body = svc.call("POST", f"/admin/users/{name}/tokens", {"label": label})
    assert status == 201, body
    assert body["token"].startswith("lgu_")
    return str(body["token"])


def _upstream(svc: AdminService) -> str:
    name = f"up-{secrets.token_hex(4)}"
    assert svc.call("POST", "/admin/upstreams", {"name": name, "base_url": "http://127.0.0.1:9/v1"})[0] == 201
    return name


def _experiment(upstream: str) -> dict[str, Any]:
    return {
        "name": f"exp-{secrets.token_hex(4)}",
        "route": f"route-{secrets.token_hex(4)}",
        "mode": "ab",
        "variants": [
            {"name": "baseline", "upstream": upstream, "model": "m", "weight": 50, "is_control": True},
            {"name": "candidate", "upstream": upstream, "model": "m2", "weight": 50},
        ],
    }


def test_passwords_and_api_tokens_are_stored_only_as_hashes(
    admin_service: AdminService, engine: Engine
) -> None:
    name, password = _user(admin_service, "operator")
    token = _token(admin_service, name)
    with engine.connect() as conn:
        dump = " ".join(
            str(row)
            for table in ("users", "user_tokens", "audit_log", "user_sessions")
            for row in conn.execute(text(f"SELECT * FROM {table}"))
        )
        stored = conn.execute(
            text("SELECT password_hash FROM users WHERE name = :n"), {"n": name}
        ).scalar_one()
    assert password not in dump and token not in dump and token[4:] not in dump
    assert stored.startswith("scrypt$15$8$1$")
    status, tokens = admin_service.call("GET", f"/admin/users/{name}/tokens")
    assert status == 200 and tokens[0]["prefix"] == token[:10] and "token" not in tokens[0]


def test_a_users_token_acts_with_their_role_and_the_audit_names_them(
    admin_service: AdminService, engine: Engine
) -> None:
    upstream = _upstream(admin_service)
    operator_name, _ = _user(admin_service, "operator")
    operator = _token(admin_service, operator_name)
    viewer_name, _ = _user(admin_service, "viewer")
    viewer = _token(admin_service, viewer_name)
    spec = _experiment(upstream)
    assert admin_service.call("GET", "/admin/experiments", token=viewer)[0] == 200
    status, body = admin_service.call("POST", "/admin/experiments", spec, token=viewer)
    assert status == 403 and "needs operator" in body["detail"]
    status, created = admin_service.call("POST", "/admin/experiments", spec, token=operator)
    assert status == 201, created
    status, body = admin_service.call(
        "POST", "/admin/api-keys", {"name": "k-" + secrets.token_hex(3)}, token=operator
    )
    assert status == 403 and "needs admin" in body["detail"]
    assert (
        admin_service.call(
            "POST", "/admin/users", {"name": "x", "role": "admin", "password": "p" * 16}, token=operator
        )[0]
        == 403
    )
    # A user cannot rename themself in the audit log.
    status, _ = admin_service.call(
        "POST", f"/admin/experiments/{spec['name']}/stop", token=operator, actor="someone-else"
    )
    assert status == 200
    with engine.connect() as conn:
        actors = conn.execute(
            text(
                "SELECT action, actor FROM audit_log WHERE entity = 'experiment' AND entity_id = :e ORDER BY id"
            ),
            {"e": str(created["id"])},
        ).all()
    assert actors == [("create", f"user:{operator_name}"), ("stop", f"user:{operator_name}")]


def test_a_disabled_user_or_a_revoked_token_is_refused_at_once(admin_service: AdminService) -> None:
    name, _ = _user(admin_service, "viewer")
    first, second = _token(admin_service, name, "one"), _token(admin_service, name, "two")
    assert admin_service.call("GET", "/admin/me", token=first)[1]["actor"] == f"user:{name}"
    assert admin_service.call("DELETE", f"/admin/users/{name}/tokens/one")[0] == 200
    assert admin_service.call("GET", "/admin/me", token=first)[0] == 403
    assert admin_service.call("GET", "/admin/me", token=second)[0] == 200
    assert admin_service.call("PATCH", f"/admin/users/{name}", {"disabled": True})[0] == 200
    assert admin_service.call("GET", "/admin/me", token=second)[0] == 403
    assert admin_service.call("GET", "/api/experiments", token=second)[0] == 403


def test_weak_passwords_bad_roles_and_duplicates_are_refused_with_a_reason(
    admin_service: AdminService,
) -> None:
    name = f"u-{secrets.token_hex(4)}"
    status, body = admin_service.call(
        "POST", "/admin/users", {"name": name, "role": "viewer", "password": "short"}
    )
    assert status == 422 and "12 characters" in body["detail"]
    status, body = admin_service.call(
        "POST", "/admin/users", {"name": name, "role": "root", "password": "p" * 16}
    )
    assert status == 422 and "role" in body["detail"]
    status, body = admin_service.call(
        "POST", "/admin/users", {"name": "a b\x00", "role": "viewer", "password": "p" * 16}
    )
    assert status == 422
    assert (
        admin_service.call("POST", "/admin/users", {"name": name, "role": "viewer", "password": "p" * 16})[0]
        == 201
    )
    assert (
        admin_service.call("POST", "/admin/users", {"name": name, "role": "viewer", "password": "p" * 16})[0]
        == 409
    )


def test_a_browser_session_changes_things_only_with_its_csrf_token(
    admin_service: AdminService, engine: Engine
) -> None:
    upstream = _upstream(admin_service)
    name, password = _user(admin_service, "operator")
    browser = Browser(admin_service.url)
    assert browser.sign_in(name, password) == 303
    session = browser.cookie("lg_session")
    assert session is not None
    with engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM user_sessions WHERE id_hash = :s"), {"s": session}
            ).scalar_one()
            == 0
        )
    status, _, me = browser.call("GET", "/admin/me")
    csrf = json.loads(me)["csrf"]
    assert status == 200 and json.loads(me)["role"] == "operator" and csrf
    spec = _experiment(upstream)
    status, _, body = browser.call("POST", "/admin/experiments", body=spec)
    assert status == 403 and b"CSRF" in body
    status, _, body = browser.call(
        "POST", "/admin/experiments", body=spec, headers={"X-CSRF-Token": "forged"}
    )
    assert status == 403 and b"CSRF" in body
    status, _, body = browser.call("POST", "/admin/experiments", body=spec, headers={"X-CSRF-Token": csrf})
    assert status == 201, body
    # Signing out needs the token too, and ends the session in the database.
    assert browser.call("POST", "/dashboard/logout", form={"csrf": "forged"})[0] == 403
    assert browser.call("POST", "/dashboard/logout", form={"csrf": csrf})[0] == 303
    assert (
        Browser(admin_service.url).call("GET", "/admin/me", headers={"Cookie": f"lg_session={session}"})[0]
        == 401
    )


def test_the_sign_in_form_refuses_a_post_without_its_csrf_token(admin_service: AdminService) -> None:
    name, password = _user(admin_service, "viewer")
    browser = Browser(admin_service.url)
    status, _, page = browser.call("POST", "/dashboard/login", form={"name": name, "password": password})
    assert status == 403 and b"CSRF" in page and browser.cookie("lg_session") is None


def test_failed_sign_ins_lock_the_name_even_for_the_right_password(admin_service: AdminService) -> None:
    name, password = _user(admin_service, "viewer")
    browser = Browser(admin_service.url)
    for _ in range(5):
        assert browser.sign_in(name, "wrong-" + secrets.token_hex(6)) == 401
    assert browser.sign_in(name, password) == 429
    # An unknown name is answered like a known one (no enumeration) and locks the same way.
    ghost = f"ghost-{secrets.token_hex(4)}"
    assert [browser.sign_in(ghost, "x" * 12) for _ in range(6)] == [401] * 5 + [429]
    other, other_password = _user(admin_service, "viewer")
    assert browser.sign_in(other, other_password) == 303


def test_a_one_time_sign_in_link_works_once_and_signs_in_as_the_admin(admin_service: AdminService) -> None:
    ticket = login_ticket(TOKEN, None)
    first = Browser(admin_service.url)
    status, headers, _ = first.call("GET", f"/dashboard/login?ticket={ticket}")
    cookie = next(c for c in headers.get_all("set-cookie") or [] if c.startswith("lg_session="))
    assert status == 303 and "HttpOnly" in cookie and "SameSite=lax" in cookie and "Secure" not in cookie
    assert json.loads(first.call("GET", "/admin/me")[2])["role"] == "admin"
    again = Browser(admin_service.url)
    status, _, page = again.call("GET", f"/dashboard/login?ticket={ticket}")
    assert status == 401 and b"already used" in page and again.cookie("lg_session") is None


def _cli(
    svc: AdminService, *args: str, stdin: str = "", token: str = TOKEN
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "liftgate", "users", *args, "--admin-url", svc.url, "--token", token],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_the_cli_adds_a_user_with_the_password_from_stdin_and_makes_a_token_that_works(
    admin_service: AdminService,
) -> None:
    name, password = f"cli-{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    added = _cli(admin_service, "add", name, "--role", "operator", stdin=password + "\n")
    assert added.returncode == 0, added.stderr
    assert password not in added.stdout + added.stderr
    made = _cli(admin_service, "token", name, "--label", "laptop")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("lgu_") and "shown once" in made.stderr
    assert admin_service.call("GET", "/admin/me", token=token)[1]["actor"] == f"user:{name}"
    listed = _cli(admin_service, "list")
    assert any(line.split() == [name, "operator", "active"] for line in listed.stdout.splitlines())
    # An operator's own token cannot manage users; the CLI says why and fails.
    refused = _cli(admin_service, "list", token=token)
    assert refused.returncode == 1 and "needs admin" in refused.stderr
    assert _cli(admin_service, "add", f"x-{name}", stdin="").returncode == 2  # no password, no user
    assert _cli(admin_service, "disable", name).returncode == 0
    assert admin_service.call("GET", "/admin/me", token=token)[0] == 403


def test_the_cli_lists_no_users_with_a_hint_to_add_one(pg_admin_url: str) -> None:
    """A new deployment has no users: the list says so (on stderr, so --json and scripts reading
    stdout see nothing), and says how to add one, instead of printing nothing."""
    with fresh_database(pg_admin_url) as url, start_admin_service(url) as svc:
        empty = _cli(svc, "list")
        assert empty.returncode == 0, empty.stderr
        assert empty.stdout == "" and "no users yet" in empty.stderr and "liftgate users add" in empty.stderr
        name = f"cli-{secrets.token_hex(4)}"
        assert (
            _cli(svc, "add", name, "--role", "viewer", stdin=secrets.token_urlsafe(16) + "\n").returncode == 0
        )
        listed = _cli(svc, "list")
        assert listed.stdout.split() == [name, "viewer", "active"] and "no users yet" not in listed.stderr
