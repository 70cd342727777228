"""Who may read and who may change: the analytics service's one credential check.

Credentials:

- the **admin token** (``LIFTGATE_ADMIN_TOKEN``) as ``Authorization: Bearer``: reads and
  changes (mutating endpoints, ``?fresh=true``);
- the **read token** (``LIFTGATE_READ_TOKEN``, optional) as ``Authorization: Bearer``:
  reads only;
- the dashboard's **session cookie** (``lg_session``): reads only. The browser gets it
  from ``/dashboard/login`` — a form taking the read or admin token, or a one-time
  sign-in link (``?ticket=``, what ``liftgate up`` prints). It is signed with a key derived
  from both tokens, so changing either token ends every session.

``LIFTGATE_READ_ACCESS=open`` lets anyone read (behind an authenticating proxy, say);
changes still need the admin token. Every route resolves the caller through
:meth:`Access.principal` (the ``require_*`` dependencies and the request guard), so roles
added later plug in here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Final, Literal
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from starlette.datastructures import Headers

from control.auth import ACTOR_HEADER, actor

Role = Literal["admin", "read"]
SESSION_COOKIE: Final = "lg_session"
LOGIN_PATH: Final = "/dashboard/login"
_MAX_REDEEMED = 10_000


@dataclass(frozen=True, slots=True)
class Principal:
    name: str  # "admin", "reader", "session", "anonymous"
    role: Role

    @property
    def admin(self) -> bool:
        return self.role == "admin"


class Denied(Exception):
    """No valid credential: ``status`` 401 (none given) or 403 (a wrong one)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def session_key(admin_token: str, read_token: str | None) -> bytes:
    """The key that signs sessions and sign-in tickets (changes with either token)."""
    return hmac.new(
        admin_token.encode(), b"liftgate-session\x00" + (read_token or "").encode(), "sha256"
    ).digest()


def _sign(key: bytes, kind: str, expires: int, nonce: str) -> str:
    mac = hmac.new(key, f"{kind}.{expires}.{nonce}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _token(key: bytes, kind: str, ttl_s: float, now: float) -> str:
    expires = int(now + ttl_s)
    nonce = secrets.token_urlsafe(12)
    return f"{expires}.{nonce}.{_sign(key, kind, expires, nonce)}"


def _check(key: bytes, kind: str, value: str, now: float) -> str | None:
    """The nonce of a valid, unexpired signed value, else None."""
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isascii() or not parts[0].isdigit() or len(parts[0]) > 12:
        return None
    expires, nonce, mac = int(parts[0]), parts[1], parts[2]
    if expires < now or not hmac.compare_digest(mac, _sign(key, kind, expires, nonce)):
        return None
    return nonce


def login_ticket(admin_token: str, read_token: str | None, ttl_s: float = 12 * 3600.0) -> str:
    """A one-time sign-in ticket for ``/dashboard/login?ticket=…`` (``liftgate up`` prints one)."""
    return _token(session_key(admin_token, read_token), "ticket", ttl_s, time.time())


class Access:
    """The credential check of every route (see the module docstring)."""

    def __init__(
        self, admin_token: str, read_token: str | None, mode: Literal["token", "open"], session_ttl_s: float
    ) -> None:
        self._admin = admin_token.encode()
        self._read = read_token.encode() if read_token else None
        self.mode = mode
        self.session_ttl_s = session_ttl_s
        self._key = session_key(admin_token, read_token)
        self._redeemed: dict[str, float] = {}  # ticket nonce -> expiry (one-time use)
        self._lock = threading.Lock()

    def role_of(self, token: str) -> Role | None:
        """The role a presented token grants (both compared in constant time)."""
        raw = token.encode()
        is_admin = hmac.compare_digest(raw, self._admin)
        is_read = self._read is not None and hmac.compare_digest(raw, self._read)
        return "admin" if is_admin else "read" if is_read else None

    def principal(self, headers: Headers, cookies: dict[str, str]) -> Principal:
        """Who is calling; raises :class:`Denied` when reads are not allowed to them."""
        header = headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise Denied(401, "expected 'Authorization: Bearer <token>'")
            role = self.role_of(token)
            if role is None:
                raise Denied(403, "invalid token")
            return Principal("admin" if role == "admin" else "reader", role)
        session = cookies.get(SESSION_COOKIE)
        if session and _check(self._key, "session", session, time.time()) is not None:
            return Principal("session", "read")
        if self.mode == "open":
            return Principal("anonymous", "read")
        raise Denied(401, "a read token is required (Authorization: Bearer, or sign in at /dashboard/login)")

    def new_session(self) -> str:
        return _token(self._key, "session", self.session_ttl_s, time.time())

    def redeem(self, ticket: str) -> bool:
        """Whether ``ticket`` is valid and unused (it is used up now)."""
        now = time.time()
        nonce = _check(self._key, "ticket", ticket, now)
        if nonce is None:
            return False
        with self._lock:
            if nonce in self._redeemed:
                return False
            if len(self._redeemed) >= _MAX_REDEEMED:
                self._redeemed = {n: t for n, t in self._redeemed.items() if t >= now}
                if len(self._redeemed) >= _MAX_REDEEMED:
                    return False  # fail closed rather than forget a used ticket
            self._redeemed[nonce] = float(ticket.split(".", 1)[0])
        return True


def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


def _principal(request: Request) -> Principal:
    try:
        return get_access(request).principal(request.headers, request.cookies)
    except Denied as exc:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        raise HTTPException(exc.status, exc.reason, headers=headers) from None


def require_read(request: Request) -> Principal:
    """Dependency of every read route: 401 without a credential, 403 with a wrong one."""
    return _principal(request)


def require_admin(request: Request) -> str:
    """Dependency of mutating routes: the admin token as a bearer header (never a cookie).

    Returns the actor for the audit log, named as the control plane names it
    (``admin`` or ``admin:<X-Liftgate-Actor>``)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(401, "admin token required", headers={"WWW-Authenticate": "Bearer"})
    if get_access(request).role_of(token.strip()) != "admin":
        raise HTTPException(403, "invalid admin token")
    return actor(request.headers.get(ACTOR_HEADER))


def require_read_page(request: Request) -> Principal:
    """Dependency of the dashboard's pages: without a credential, off to the sign-in page."""
    try:
        return get_access(request).principal(request.headers, request.cookies)
    except Denied as exc:
        if exc.status == 403:
            raise HTTPException(403, exc.reason) from None
        target = quote(request.url.path, safe="/")
        raise HTTPException(
            303, "sign in first", headers={"Location": f"{LOGIN_PATH}?next={target}"}
        ) from None


Reader = Annotated[Principal, Depends(require_read)]
Admin = Annotated[str, Depends(require_admin)]
