"""Who may read and who may change, as the analytics service asks it.

The credentials and roles are the control plane's (:mod:`control.auth`, the one check):
the admin token, the read token (a viewer), a user's API token, or the dashboard's session
cookie with its CSRF token for changes. This module adds what only the service has:

- ``LIFTGATE_READ_ACCESS=open`` lets anyone read (behind an authenticating proxy, say) as an
  anonymous viewer; changes still need a credential with the right role;
- one-time **sign-in links** (``/dashboard/login?ticket=…``, what ``liftgate up`` prints):
  an HMAC-signed expiry and nonce (key derived from the admin and read tokens), redeemed at
  most once — the nonce is recorded in PostgreSQL, so a second use fails in any process and
  after a restart. A link signs the browser in as the bootstrap admin;
- the dependencies of the service's routes (:func:`require_read`, :func:`require_operator`,
  :func:`require_admin`, :func:`require_read_page`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Final, Literal
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request

from control import users
from control.auth import SCOPE_KEY, Authenticator, Denied, Principal, Role, denial

SESSION_COOKIE: Final = "lg_session"
LOGIN_PATH: Final = "/dashboard/login"
#: A sign-in link is short-lived: it is meant to be clicked right after ``liftgate up`` prints it.
LINK_TTL_S: Final = 15 * 60.0
ANONYMOUS: Final = Principal("anonymous", "viewer", "anonymous")

__all__ = ["ANONYMOUS", "Access", "login_ticket"]


def session_key(admin_token: str, read_token: str | None) -> bytes:
    """The key that signs sign-in links (changes with either token)."""
    return hmac.new(
        admin_token.encode(), b"liftgate-session\x00" + (read_token or "").encode(), "sha256"
    ).digest()


def _sign(key: bytes, kind: str, expires: int, nonce: str) -> str:
    mac = hmac.new(key, f"{kind}.{expires}.{nonce}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _check(key: bytes, kind: str, value: str, now: float) -> tuple[str, int] | None:
    """(nonce, expiry) of a valid, unexpired signed value, else None."""
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit() or len(parts[0]) > 12:
        return None
    expires, nonce, mac = int(parts[0]), parts[1], parts[2]
    if expires < now or not hmac.compare_digest(mac, _sign(key, kind, expires, nonce)):
        return None
    return nonce, expires


def login_ticket(admin_token: str, read_token: str | None, ttl_s: float = LINK_TTL_S) -> str:
    """A one-time sign-in ticket for ``/dashboard/login?ticket=…`` (``liftgate up`` prints one)."""
    expires = int(time.time() + ttl_s)
    nonce = secrets.token_urlsafe(12)
    return f"{expires}.{nonce}.{_sign(session_key(admin_token, read_token), 'ticket', expires, nonce)}"


class Access:
    """The service's view of :class:`control.auth.Authenticator` (see the module docstring)."""

    def __init__(
        self,
        auth: Authenticator,
        mode: Literal["token", "open"],
        session_ttl_s: float,
        lockout: users.LockoutPolicy | None = None,
    ) -> None:
        self.auth = auth
        self.mode = mode
        self.session_ttl_s = session_ttl_s
        self.lockout = lockout or users.LockoutPolicy()
        self._key = session_key(auth.admin_token, auth.read_token)

    def principal(self, method: str, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Principal:
        """Who is calling; raises :class:`Denied` when they may not even read."""
        found = self.auth.resolve(method, headers, cookies)
        if found is not None:
            return found
        if self.mode == "open":
            return ANONYMOUS
        raise Denied(401, "a read token is required (Authorization: Bearer, or sign in at /dashboard/login)")

    def redeem(self, ticket: str) -> bool:
        """Whether ``ticket`` is valid and unused (it is used up now)."""
        found = _check(self._key, "ticket", ticket, time.time())
        if found is None:
            return False
        nonce, expires = found
        with self.auth.engine.begin() as conn:
            return users.redeem_link(conn, nonce, datetime.fromtimestamp(expires, UTC), users.utcnow())


def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


def _resolved(request: Request, need: Role) -> Principal:
    """The caller (resolved once per request). Reads never need a CSRF token, so a read
    route resolves the request as a GET (a read-only POST such as the plan check included)."""
    cached: Principal | None = request.scope.get(SCOPE_KEY)
    if cached is not None:
        return cached
    method = "GET" if need == "viewer" else request.method
    found = get_access(request).principal(method, request.headers, request.cookies)
    if method == request.method:
        request.scope[SCOPE_KEY] = found
    return found


def _require(request: Request, need: Role) -> Principal:
    try:
        found = _resolved(request, need)
        refused = denial(found, need)
    except Denied as exc:
        refused = exc
    if refused is not None:
        headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
        raise HTTPException(refused.status, refused.reason, headers=headers)
    return found


def require_read(request: Request) -> Principal:
    """Dependency of every read route: 401 without a credential, 403 with a wrong one."""
    return _require(request, "viewer")


def require_operator(request: Request) -> str:
    """Dependency of the service's own changes (snapshots, ``?fresh=true``): the audit actor."""
    return _require(request, "operator").actor


def require_admin(request: Request) -> str:
    """Dependency of admin-only routes (datasets of production content): the audit actor."""
    return _require(request, "admin").actor


def require_read_page(request: Request) -> Principal:
    """Dependency of the dashboard's pages: without a credential, off to the sign-in page."""
    try:
        return _resolved(request, "viewer")
    except Denied as exc:
        if exc.status == 403:
            raise HTTPException(403, exc.reason) from None
        # The whole URL, query string included: a filtered page (examples?variant=…&feedback=…)
        # must come back exactly as it was asked for once signed in.
        wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        target = quote(wanted, safe="/")
        raise HTTPException(
            303, "sign in first", headers={"Location": f"{LOGIN_PATH}?next={target}"}
        ) from None


Reader = Annotated[Principal, Depends(require_read)]
Operator = Annotated[str, Depends(require_operator)]
Admin = Annotated[str, Depends(require_admin)]
