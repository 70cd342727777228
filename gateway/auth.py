"""Who may call what, decided from the request headers alone (before any body is read).

* ``/v1/*``: a client API key (``Authorization: Bearer <key>``) whose SHA-256 is among the
  snapshot's active keys, when ``LIFTGATE_CLIENT_KEYS=required``. With no key configured,
  or every key revoked, nobody passes: the setting, not the number of keys, decides.
* ``/admin/*``: the admin token, compared in constant time; 401 without a bearer token,
  403 with a wrong one.
"""

from __future__ import annotations

import hmac
from collections.abc import MutableMapping
from typing import Any

from gateway.routing import api_key_of, key_hash


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def client_key_digest(authorization: bytes | None) -> str | None:
    """SHA-256 of the bearer key, or None when there is none."""
    key = api_key_of(authorization)
    return key_hash(key) if key is not None else None


def admin_denial(authorization: bytes | None, token: str) -> tuple[int, str] | None:
    """(status, reason) when the admin token is missing or wrong, else None."""
    if not authorization or authorization[:7].lower() != b"bearer " or not authorization[7:].strip():
        return 401, "missing bearer admin token"
    if not hmac.compare_digest(authorization[7:].strip(), token.encode()):
        return 403, "invalid admin token"
    return None


def peer(scope: MutableMapping[str, Any]) -> str:
    """The client's IP address: its identity for per-client limits when keys are off."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
