"""Who may call what, decided from the request headers alone (before any body is read).

* ``/v1/*``: a client API key (``Authorization: Bearer <key>``) whose SHA-256 is among the
  snapshot's active keys, when ``LIFTGATE_CLIENT_KEYS=required``. With no key configured,
  or every key revoked, nobody passes: the setting, not the number of keys, decides.
* ``/admin/*``: the admin token (``control.auth.admin_denial``, the control plane's one
  check), before the body is read.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from contracts.config_rules import key_hash
from gateway.routing import api_key_of


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def client_key_digest(authorization: bytes | None) -> str | None:
    """SHA-256 of the bearer key, or None when there is none."""
    key = api_key_of(authorization)
    return key_hash(key) if key is not None else None


def peer(scope: MutableMapping[str, Any]) -> str:
    """The client's IP address: its identity for per-client limits when keys are off."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
