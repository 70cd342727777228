"""The control plane's one credential check and one way to name who acted.

``Authorization: Bearer <LIFTGATE_ADMIN_TOKEN>``, compared in constant time: 401 without a
bearer token (or a malformed header), 403 with a wrong one. The actor recorded in the audit
log and in rollout decisions is ``admin``, or ``admin:<name>`` when the caller names
itself in ``X-Liftgate-Actor`` (letters, digits and ``_.@:-`` kept, at most 64
characters): the token is who is *allowed*; the header only says who, among those holding
it, pressed the button.
"""

from __future__ import annotations

import hmac
import re
from typing import Final

ADMIN: Final = "admin"
ACTOR_HEADER: Final = "x-liftgate-actor"
_NOT_ACTOR: Final = re.compile(r"[^A-Za-z0-9_.@:\-]")
MAX_ACTOR_NAME: Final = 64


def admin_denial(authorization: bytes | str | None, token: str) -> tuple[int, str] | None:
    """(status, reason) when the admin token is missing or wrong, else None."""
    raw = authorization.encode("latin-1") if isinstance(authorization, str) else authorization
    if not raw or raw[:7].lower() != b"bearer " or not raw[7:].strip():
        return 401, "missing bearer admin token"
    if not token or not hmac.compare_digest(raw[7:].strip(), token.encode()):
        return 403, "invalid admin token"
    return None


def actor(header: str | None) -> str:
    """The audit actor for an admin request carrying ``X-Liftgate-Actor: header``."""
    name = _NOT_ACTOR.sub("", header or "")[:MAX_ACTOR_NAME]
    return f"{ADMIN}:{name}" if name else ADMIN
