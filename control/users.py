"""Users, their API tokens, browser sessions and the sign-in lockout: the one writer of
``users``, ``user_tokens``, ``user_sessions``, ``sign_in_failures`` and ``used_sign_in_links``.

Secrets are stored only as hashes: passwords with scrypt (:mod:`control.passwords`), API
tokens and session ids (random, 256 bits) with SHA-256 — a fast hash is enough for values
no one can guess, and it lets a token be found by its hash. A token or password is shown
once, when it is made, and never again. Changes to users and tokens are audited like every
other change (the password and token fields are masked by :mod:`control.audit`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, delete, insert, select, text, update

from contracts.tables import SignInFailure, User, UserSession, UserToken
from control import audit
from control.errors import ControlError
from control.passwords import DUMMY_HASH, hash_password, password_problem, verify_password

ROLES: Final = ("viewer", "operator", "admin")
TOKEN_PREFIX: Final = "lgu_"
_NAME: Final = re.compile(r"^[A-Za-z0-9_.@\-]{1,64}$")
#: A token's last use is written at most this often (not on every request).
_TOUCH_EVERY: Final = timedelta(minutes=1)


def sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a token or session belongs to (``user_id`` None: a bootstrap credential)."""

    user_id: int | None
    name: str
    role: str
    csrf: str | None = None


@dataclass(frozen=True, slots=True)
class LockoutPolicy:
    max_failures: int = 5
    lockout_s: float = 300.0


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ControlError(422, "name: 1-64 letters, digits or _.@- characters")
    return name


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ControlError(422, f"role: expected one of {', '.join(ROLES)}")
    return role


def user_out(row: Any) -> dict[str, Any]:
    return {"name": row.name, "role": row.role, "disabled": row.disabled, "created_at": row.created_at}


def _user(conn: Connection, name: str) -> Any:
    row = conn.execute(select(User).where(User.name == name)).one_or_none()
    if row is None:
        raise ControlError(404, f"no user {name!r}")
    return row


def list_users(conn: Connection) -> list[dict[str, Any]]:
    return [user_out(r) for r in conn.execute(select(User).order_by(User.name))]


def create_user(conn: Connection, name: str, role: str, password: str, actor: str) -> dict[str, Any]:
    _check_name(name)
    _check_role(role)
    problem = password_problem(password)
    if problem:
        raise ControlError(422, problem)
    if conn.scalar(select(User.id).where(User.name == name)) is not None:
        raise ControlError(409, f"user {name!r} already exists")
    row = conn.execute(
        insert(User)
        .values(name=name, role=role, password_hash=hash_password(password))
        .returning(*User.__table__.c)
    ).one()
    out = user_out(row)
    audit.write(conn, actor=actor, action="create", entity="user", entity_id=name, before=None, after=out)
    return out


def update_user(
    conn: Connection,
    name: str,
    actor: str,
    *,
    role: str | None = None,
    disabled: bool | None = None,
    password: str | None = None,
) -> dict[str, Any]:
    """Change a user's role, disable/enable them, or set a new password. Disabling (or a new
    role, or a new password) ends their browser sessions; disabling also stops their tokens."""
    before = _user(conn, name)
    values: dict[str, Any] = {}
    if role is not None:
        values["role"] = _check_role(role)
    if disabled is not None:
        values["disabled"] = disabled
    if password is not None:
        problem = password_problem(password)
        if problem:
            raise ControlError(422, problem)
        values["password_hash"] = hash_password(password)
    if not values:
        raise ControlError(422, "nothing to change: give role, disabled or password")
    row = conn.execute(
        update(User).where(User.id == before.id).values(**values).returning(*User.__table__.c)
    ).one()
    conn.execute(delete(UserSession).where(UserSession.user_id == before.id))
    after = user_out(row) | ({"password": "changed"} if password is not None else {})
    audit.write(
        conn,
        actor=actor,
        action="update",
        entity="user",
        entity_id=name,
        before=user_out(before),
        after=after,
    )
    return user_out(row)


# --- API tokens ------------------------------------------------------------------------------


def create_token(conn: Connection, name: str, label: str, actor: str) -> dict[str, Any]:
    """A new API token for ``name``: returned once, stored as its SHA-256 hash."""
    user = _user(conn, name)
    _check_name(label)
    if user.disabled:
        raise ControlError(409, f"user {name!r} is disabled")
    taken = conn.scalar(select(UserToken.id).where(UserToken.user_id == user.id, UserToken.label == label))
    if taken is not None:
        raise ControlError(409, f"user {name!r} already has a token labelled {label!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        insert(UserToken).values(user_id=user.id, label=label, token_hash=sha256(token), prefix=token[:10])
    )
    out = {"user": name, "label": label, "prefix": token[:10]}
    audit.write(
        conn,
        actor=actor,
        action="create",
        entity="user_token",
        entity_id=f"{name}/{label}",
        before=None,
        after=out,
    )
    return out | {"token": token}


def list_tokens(conn: Connection, name: str) -> list[dict[str, Any]]:
    user = _user(conn, name)
    rows = conn.execute(select(UserToken).where(UserToken.user_id == user.id).order_by(UserToken.label))
    return [
        {
            "label": r.label,
            "prefix": r.prefix,
            "revoked": r.revoked,
            "created_at": r.created_at,
            "last_used_at": r.last_used_at,
        }
        for r in rows
    ]


def revoke_token(conn: Connection, name: str, label: str, actor: str) -> dict[str, Any]:
    user = _user(conn, name)
    row = conn.execute(
        update(UserToken)
        .where(UserToken.user_id == user.id, UserToken.label == label)
        .values(revoked=True)
        .returning(UserToken.prefix)
    ).one_or_none()
    if row is None:
        raise ControlError(404, f"user {name!r} has no token labelled {label!r}")
    out = {"user": name, "label": label, "prefix": row.prefix, "revoked": True}
    audit.write(
        conn,
        actor=actor,
        action="revoke",
        entity="user_token",
        entity_id=f"{name}/{label}",
        before=None,
        after=out,
    )
    return out


def token_identity(conn: Connection, token: str, now: datetime) -> Identity | None:
    """The enabled user holding this unrevoked token, else None."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 128:
        return None
    row = conn.execute(
        select(UserToken.id, UserToken.last_used_at, User.id.label("uid"), User.name, User.role)
        .join(User, User.id == UserToken.user_id)
        .where(UserToken.token_hash == sha256(token), ~UserToken.revoked, ~User.disabled)
    ).one_or_none()
    if row is None:
        return None
    if row.last_used_at is None or now - row.last_used_at > _TOUCH_EVERY:
        conn.execute(update(UserToken).where(UserToken.id == row.id).values(last_used_at=now))
    return Identity(row.uid, row.name, row.role)


# --- sessions --------------------------------------------------------------------------------


def open_session(conn: Connection, who: Identity, basis: str, ttl_s: float, now: datetime) -> tuple[str, str]:
    """A new session for ``who``: (cookie value, CSRF token). Expired sessions are swept."""
    conn.execute(delete(UserSession).where(UserSession.expires_at < now))
    cookie, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    conn.execute(
        insert(UserSession).values(
            id_hash=sha256(cookie),
            user_id=who.user_id,
            name=who.name,
            role=who.role,
            basis=basis,
            csrf=csrf,
            expires_at=now + timedelta(seconds=ttl_s),
        )
    )
    return cookie, csrf


def session_identity(conn: Connection, cookie: str, now: datetime) -> tuple[Identity, str] | None:
    """(who, basis) of a live session; a disabled user's session is none."""
    if len(cookie) > 128:
        return None
    row = conn.execute(
        select(UserSession, User.disabled)
        .outerjoin(User, User.id == UserSession.user_id)
        .where(UserSession.id_hash == sha256(cookie), UserSession.expires_at > now)
    ).one_or_none()
    if row is None or row.disabled:
        return None
    return Identity(row.user_id, row.name, row.role, row.csrf), row.basis


def close_session(conn: Connection, cookie: str) -> None:
    conn.execute(delete(UserSession).where(UserSession.id_hash == sha256(cookie)))


# --- signing in ------------------------------------------------------------------------------


class LockedOut(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many failed sign-ins; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


def locked_for(conn: Connection, subject: str, now: datetime) -> int:
    """Seconds ``subject`` stays locked out (0: not locked)."""
    until = conn.scalar(select(SignInFailure.locked_until).where(SignInFailure.subject == subject))
    return max(0, int((until - now).total_seconds()) + 1) if until is not None and until > now else 0


def record_failure(conn: Connection, subject: str, policy: LockoutPolicy, now: datetime) -> None:
    """One more failure; the ``max_failures``-th in a row locks ``subject`` for ``lockout_s``."""
    conn.execute(
        text(
            "INSERT INTO sign_in_failures AS f (subject, failures, updated_at) VALUES (:s, 1, :now)"
            " ON CONFLICT (subject) DO UPDATE SET failures = f.failures + 1, updated_at = :now,"
            " locked_until = CASE WHEN f.failures + 1 >= :max THEN :until ELSE f.locked_until END"
        ),
        {
            "s": subject[:160],
            "now": now,
            "max": policy.max_failures,
            "until": now + timedelta(seconds=policy.lockout_s),
        },
    )


def clear_failures(conn: Connection, subject: str) -> None:
    conn.execute(delete(SignInFailure).where(SignInFailure.subject == subject))


def check_password(
    conn: Connection, name: str, password: str, policy: LockoutPolicy, now: datetime
) -> Identity | None:
    """The user ``name`` if ``password`` is theirs; raises :class:`LockedOut` while locked.

    Failures are counted per name, existing or not, so the answer never tells whether an
    account exists; an unknown name costs the same scrypt work as a wrong password."""
    subject = f"user:{name}"
    wait = locked_for(conn, subject, now)
    if wait:
        raise LockedOut(wait)
    row = conn.execute(select(User).where(User.name == name)).one_or_none() if len(name) <= 64 else None
    ok = verify_password(password, row.password_hash if row is not None else DUMMY_HASH)
    if not ok or row is None or row.disabled:
        record_failure(conn, subject, policy, now)
        return None
    clear_failures(conn, subject)
    return Identity(row.id, row.name, row.role)


def redeem_link(conn: Connection, nonce: str, expires: datetime, now: datetime) -> bool:
    """Whether a one-time sign-in link's nonce was unused (it is used from now on)."""
    conn.execute(text("DELETE FROM used_sign_in_links WHERE expires_at < :now"), {"now": now})
    inserted = conn.execute(
        text("INSERT INTO used_sign_in_links (nonce, expires_at) VALUES (:n, :e) ON CONFLICT DO NOTHING"),
        {"n": nonce[:64], "e": expires},
    )
    return inserted.rowcount == 1


def utcnow() -> datetime:
    return datetime.now(UTC)
