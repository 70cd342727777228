"""The one credential check (pure logic: tokens, sessions, tickets, modes)."""

from __future__ import annotations

import secrets

import pytest
from starlette.datastructures import Headers

from analytics.service.access import SESSION_COOKIE, Access, Denied, login_ticket

ADMIN = "adm-" + secrets.token_hex(16)
READ = "rd-" + secrets.token_hex(16)


def _bearer(token: str) -> Headers:
    return Headers({"authorization": f"Bearer {token}"})


def test_tokens_grant_their_role_and_anything_else_is_refused() -> None:
    access = Access(ADMIN, READ, "token", 3600)
    assert access.principal(_bearer(ADMIN), {}).admin
    reader = access.principal(_bearer(READ), {})
    assert reader.role == "read" and not reader.admin
    with pytest.raises(Denied) as wrong:
        access.principal(_bearer(READ + "x"), {})
    assert wrong.value.status == 403
    with pytest.raises(Denied) as none:
        access.principal(Headers({}), {})
    assert none.value.status == 401
    with pytest.raises(Denied) as basic:
        access.principal(Headers({"authorization": f"Basic {READ}"}), {})
    assert basic.value.status == 401


def test_without_a_read_token_only_the_admin_token_reads() -> None:
    access = Access(ADMIN, None, "token", 3600)
    assert access.role_of(ADMIN) == "admin" and access.role_of("") is None and access.role_of(READ) is None


def test_open_mode_lets_anyone_read_but_a_wrong_token_is_still_refused() -> None:
    access = Access(ADMIN, READ, "open", 3600)
    anyone = access.principal(Headers({}), {})
    assert anyone.role == "read" and anyone.name == "anonymous"
    with pytest.raises(Denied):
        access.principal(_bearer("nope-" + secrets.token_hex(8)), {})


def test_sessions_read_only_and_die_with_either_token() -> None:
    access = Access(ADMIN, READ, "token", 3600)
    cookie = {SESSION_COOKIE: access.new_session()}
    assert access.principal(Headers({}), cookie).role == "read"
    for rotated in (Access(ADMIN, READ + "2", "token", 3600), Access(ADMIN + "2", READ, "token", 3600)):
        with pytest.raises(Denied):
            rotated.principal(Headers({}), cookie)
    expired = Access(ADMIN, READ, "token", -1)
    with pytest.raises(Denied):
        access.principal(Headers({}), {SESSION_COOKIE: expired.new_session()})
    for junk in ("", "x", "1.2.3", "99999999999999999999.a.b", "²²².a.b"):
        with pytest.raises(Denied):
            access.principal(Headers({}), {SESSION_COOKIE: junk})


def test_a_ticket_is_redeemed_once_and_is_not_a_session() -> None:
    access = Access(ADMIN, READ, "token", 3600)
    ticket = login_ticket(ADMIN, READ)
    with pytest.raises(Denied):
        access.principal(Headers({}), {SESSION_COOKIE: ticket})  # signed for another purpose
    assert access.redeem(ticket) and not access.redeem(ticket)
    assert not access.redeem(login_ticket(ADMIN, READ, ttl_s=-5))
    assert not access.redeem(ticket.replace(".", "x", 1))
