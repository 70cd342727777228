"""Who is calling and what they may do: liftgate's one credential and role check.

Credentials, in the order they are tried:

- ``Authorization: Bearer <token>``: the bootstrap **admin token** (``LIFTGATE_ADMIN_TOKEN``,
  compared in constant time), the **read token** (``LIFTGATE_READ_TOKEN``, a viewer), or a
  user's **API token** (``lgu_…``, looked up by its SHA-256 hash; the user's role);
- the dashboard's **session cookie** (``lg_session``): the user (or bootstrap credential)
  who signed in. A request that could change something and carries only the cookie must
  also carry the session's CSRF token in ``X-CSRF-Token`` (a synchronizer token, stored
  with the session): another site can make the browser send the cookie, never the header.

Roles are ordered: ``viewer`` reads; ``operator`` also acts on experiments, rollouts and
metric definitions; ``admin`` also manages users, upstreams and client API keys.
:func:`denial` is the only place a role is compared.

The audit actor is ``user:<name>`` for a user, ``admin`` for the admin token, or
``admin:<name>`` when an admin-token caller names itself in ``X-Liftgate-Actor`` (letters,
digits and ``_.@:-`` kept, at most 64 characters): the token is who is *allowed*; the header
only says who, among those holding it, pressed the button. A user cannot rename themself.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from sqlalchemy import Engine

from control import users

Role = Literal["viewer", "operator", "admin"]
ROLES: Final[tuple[Role, ...]] = ("viewer", "operator", "admin")
_RANK: Final = {role: i for i, role in enumerate(ROLES)}
ADMIN: Final = "admin"
ACTOR_HEADER: Final = "x-liftgate-actor"
CSRF_HEADER: Final = "x-csrf-token"
SESSION_COOKIE: Final = "lg_session"
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_NOT_ACTOR: Final = re.compile(r"[^A-Za-z0-9_.@:\-]")
MAX_ACTOR_NAME: Final = 64
#: Where the principal resolved by an earlier layer (the request guard) is kept in the ASGI scope.
SCOPE_KEY: Final = "liftgate.principal"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``user_id`` is None for the bootstrap tokens; ``csrf`` is set
    when the caller came with a session cookie (the token its forms must echo)."""

    name: str
    role: Role
    actor: str
    user_id: int | None = None
    csrf: str | None = None

    def may(self, need: Role) -> bool:
        return _RANK[self.role] >= _RANK[need]


class Denied(Exception):
    """No (valid) credential, or not enough role: ``status`` 401/403/429 and a reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def denial(principal: Principal | None, need: Role) -> Denied | None:
    """The one role check: None when ``principal`` may do what needs ``need``."""
    if principal is None:
        return Denied(401, "sign in or send 'Authorization: Bearer <token>'")
    if principal.may(need):
        return None
    return Denied(403, f"{principal.name} has the {principal.role} role; this needs {need}")


def admin_denial(authorization: bytes | str | None, token: str) -> tuple[int, str] | None:
    """(status, reason) when the admin token is missing or wrong, else None: the gateway's
    header-only pre-check of its compatibility ``/admin`` (the bootstrap admin token only)."""
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    if not raw or raw[:7].lower() != b"bearer " or not raw[7:].strip():
        return 401, "missing bearer admin token"
    if not token or not hmac.compare_digest(raw[7:].strip(), token.encode()):
        return 403, "invalid admin token"
    return None


def actor(header: str | None) -> str:
    """The audit actor for an admin-token request carrying ``X-Liftgate-Actor: header``."""
    name = _NOT_ACTOR.sub("", header or "")[:MAX_ACTOR_NAME]
    return f"{ADMIN}:{name}" if name else ADMIN


def as_role(value: str) -> Role:
    for role in ROLES:
        if role == value:
            return role
    raise ValueError(f"unknown role {value!r}")


def fingerprint(token: str) -> str:
    """What a bootstrap session remembers of the token it was opened with."""
    return hashlib.sha256(b"liftgate-session-basis\x00" + token.encode()).hexdigest()


class Authenticator:
    """Resolves credentials to a :class:`Principal` (see the module docstring)."""

    def __init__(self, admin_token: str, read_token: str | None, engine: Callable[[], Engine]) -> None:
        self.admin_token = admin_token
        self.read_token = read_token
        self._engine = engine
        self._bases = {fingerprint(admin_token): ("admin", "admin")}
        if read_token:
            self._bases[fingerprint(read_token)] = ("reader", "viewer")

    @property
    def engine(self) -> Engine:
        return self._engine()

    def bootstrap(self, token: str, actor_header: str | None = None) -> Principal | None:
        """The admin or read token's principal (constant-time compares; no database)."""
        raw = token.encode()
        if self.admin_token and hmac.compare_digest(raw, self.admin_token.encode()):
            return Principal("admin", "admin", actor(actor_header))
        if self.read_token and hmac.compare_digest(raw, self.read_token.encode()):
            return Principal("reader", "viewer", "reader")
        return None

    def bearer(self, token: str, actor_header: str | None = None) -> Principal:
        """The principal of a bearer token; :class:`Denied` (403) for an unknown one."""
        found = self.bootstrap(token, actor_header)
        if found is not None:
            return found
        if token.startswith(users.TOKEN_PREFIX):
            with self.engine.begin() as conn:
                who = users.token_identity(conn, token, users.utcnow())
            if who is not None:
                return Principal(who.name, as_role(who.role), f"user:{who.name}", who.user_id)
        raise Denied(403, "invalid token")

    def session(self, cookie: str) -> Principal | None:
        """The principal of a live session cookie, else None."""
        with self.engine.begin() as conn:
            found = users.session_identity(conn, cookie, users.utcnow())
        if found is None:
            return None
        who, basis = found
        if who.user_id is None:
            # A bootstrap session lives only as long as the token it was opened with.
            if basis not in self._bases:
                return None
            return Principal(who.name, as_role(who.role), who.name, None, who.csrf)
        return Principal(who.name, as_role(who.role), f"user:{who.name}", who.user_id, who.csrf)

    def resolve(
        self, method: str, headers: Mapping[str, str], cookies: Mapping[str, str]
    ) -> Principal | None:
        """Who sent this request (None: no credential at all). Raises :class:`Denied` for a
        malformed or unknown bearer token, and for a cookie-only change without its CSRF token."""
        header = headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise Denied(401, "expected 'Authorization: Bearer <token>'")
            return self.bearer(token, headers.get(ACTOR_HEADER))
        cookie = cookies.get(SESSION_COOKIE)
        if not cookie:
            return None
        principal = self.session(cookie)
        if principal is None or method in SAFE_METHODS:
            return principal
        sent = headers.get(CSRF_HEADER, "")
        if (
            not sent
            or principal.csrf is None
            or not hmac.compare_digest(sent.encode(), principal.csrf.encode())
        ):
            raise Denied(403, "CSRF token missing or wrong: reload the page and try again")
        return principal

    def require(
        self, method: str, headers: Mapping[str, str], cookies: Mapping[str, str], need: Role
    ) -> Principal:
        """The caller, if they may do what needs ``need``; else :class:`Denied`."""
        principal = self.resolve(method, headers, cookies)
        refused = denial(principal, need)
        if refused is not None:
            raise refused
        assert principal is not None
        return principal
