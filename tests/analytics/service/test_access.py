"""The one credential and role check as the service asks it: tokens, roles, sessions,
one-time links and open mode (sessions and links against real PostgreSQL)."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy import Engine
from starlette.datastructures import Headers

from analytics.service.access import SESSION_COOKIE, Access, login_ticket
from control import users
from control.auth import Authenticator, Denied, Principal, denial, fingerprint

ADMIN = "adm-" + secrets.token_hex(16)
READ = "rd-" + secrets.token_hex(16)


def _bearer(token: str) -> Headers:
    return Headers({"authorization": f"Bearer {token}"})


def _no_db() -> Engine:
    raise AssertionError("the bootstrap tokens are checked without the database")


def _access(
    admin: str = ADMIN, read: str | None = READ, mode: str = "token", engine: Engine | None = None
) -> Access:
    auth = Authenticator(admin, read, (lambda: engine) if engine is not None else _no_db)
    return Access(auth, "open" if mode == "open" else "token", 3600)


def test_tokens_grant_their_role_and_anything_else_is_refused() -> None:
    access = _access()
    assert access.principal("GET", _bearer(ADMIN), {}).role == "admin"
    reader = access.principal("GET", _bearer(READ), {})
    assert reader.role == "viewer" and not reader.may("operator")
    with pytest.raises(Denied) as wrong:
        access.principal("GET", _bearer(READ + "x"), {})
    assert wrong.value.status == 403
    with pytest.raises(Denied) as none:
        access.principal("GET", Headers({}), {})
    assert none.value.status == 401
    with pytest.raises(Denied) as basic:
        access.principal("GET", Headers({"authorization": f"Basic {READ}"}), {})
    assert basic.value.status == 401


def test_roles_are_ordered_viewer_operator_admin_and_compared_in_one_place() -> None:
    viewer, operator, admin = (Principal(r, r, r) for r in ("viewer", "operator", "admin"))  # type: ignore[arg-type]
    assert denial(viewer, "viewer") is None and denial(operator, "operator") is None
    refused = denial(viewer, "operator")
    assert refused is not None and refused.status == 403 and "needs operator" in refused.reason
    assert denial(operator, "admin") is not None and denial(admin, "admin") is None
    unknown = denial(None, "viewer")
    assert unknown is not None and unknown.status == 401


def test_the_admin_token_actor_is_named_by_its_header_and_a_reader_cannot_rename_itself() -> None:
    access = _access()
    named = access.principal(
        "GET", Headers({"authorization": f"Bearer {ADMIN}", "x-liftgate-actor": "ana"}), {}
    )
    assert named.actor == "admin:ana"
    reader = access.principal(
        "GET", Headers({"authorization": f"Bearer {READ}", "x-liftgate-actor": "ana"}), {}
    )
    assert reader.actor == "reader"


def test_open_mode_lets_anyone_read_but_a_wrong_token_is_still_refused() -> None:
    access = _access(mode="open")
    anyone = access.principal("GET", Headers({}), {})
    assert anyone.role == "viewer" and anyone.name == "anonymous"
    with pytest.raises(Denied):
        access.principal("GET", _bearer("nope-" + secrets.token_hex(8)), {})


def _session(engine: Engine, who: users.Identity, basis: str, ttl_s: float = 3600) -> tuple[str, str]:
    with engine.begin() as conn:
        return users.open_session(conn, who, basis, ttl_s, users.utcnow())


def test_a_bootstrap_session_dies_with_its_token_and_when_it_expires(engine: Engine) -> None:
    access = _access(engine=engine)
    cookie, _ = _session(engine, users.Identity(None, "reader", "viewer"), fingerprint(READ))
    assert access.principal("GET", Headers({}), {SESSION_COOKIE: cookie}).role == "viewer"
    rotated = _access(read=READ + "2", engine=engine)
    with pytest.raises(Denied):
        rotated.principal("GET", Headers({}), {SESSION_COOKIE: cookie})
    expired, _ = _session(engine, users.Identity(None, "reader", "viewer"), fingerprint(READ), ttl_s=-1)
    with pytest.raises(Denied):
        access.principal("GET", Headers({}), {SESSION_COOKIE: expired})
    for junk in ("", "x", "1.2.3", "a" * 500, "²²²"):
        with pytest.raises(Denied):
            access.principal("GET", Headers({}), {SESSION_COOKIE: junk})


def test_a_change_with_only_the_session_cookie_needs_its_csrf_token(engine: Engine) -> None:
    access = _access(engine=engine)
    cookie, csrf = _session(engine, users.Identity(None, "admin", "admin"), fingerprint(ADMIN))
    jar = {SESSION_COOKIE: cookie}
    for headers in (Headers({}), Headers({"x-csrf-token": "forged"}), Headers({"x-csrf-token": csrf[:-1]})):
        with pytest.raises(Denied) as refused:
            access.principal("POST", headers, jar)
        assert refused.value.status == 403 and "CSRF" in refused.value.reason
    assert access.principal("POST", Headers({"x-csrf-token": csrf}), jar).role == "admin"
    assert access.principal("GET", Headers({}), jar).csrf == csrf


def test_a_sign_in_link_is_redeemed_once_even_by_another_process(engine: Engine) -> None:
    first, second = _access(engine=engine), _access(engine=engine)
    ticket = login_ticket(ADMIN, READ)
    assert first.redeem(ticket) and not second.redeem(ticket) and not first.redeem(ticket)
    assert not first.redeem(login_ticket(ADMIN, READ, ttl_s=-5))
    assert not first.redeem(ticket.replace(".", "x", 1))
    assert not first.redeem(login_ticket(ADMIN + "x", READ))
