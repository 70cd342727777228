"""Webhook signatures: HMAC-SHA256 over a timestamp and the exact body bytes.

Header ``X-Liftgate-Signature: t=<unix seconds>,v1=<hex digest>`` where the digest is
``HMAC-SHA256(secret, f"{t}.".encode() + body)``. Signing the timestamp with the body lets a
receiver refuse replays: a captured request cannot be re-sent later with a fresh ``t``, and
one older than the tolerance (5 minutes by default) is refused; the delivery id header
(``X-Liftgate-Delivery``, the same on every retry of one event) lets it drop duplicates.
Pure functions: the sender signs, receivers (and the docs' sample) verify.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

HEADER: Final = "X-Liftgate-Signature"
DEFAULT_TOLERANCE_S: Final = 300.0


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return mac.hexdigest()


def header_value(secret: str, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={signature(secret, timestamp, body)}"


def verify(
    secret: str, header: str | None, body: bytes, now: float, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> str | None:
    """None when ``header`` signs ``body`` with ``secret`` within the tolerance, else the reason."""
    if not header:
        return "missing signature header"
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            parts.setdefault(key, []).append(value)
    stamps = parts.get("t", [])
    if len(stamps) != 1 or not stamps[0].isdigit():
        return "malformed signature header"
    timestamp = int(stamps[0])
    if abs(now - timestamp) > tolerance_s:
        return "timestamp outside the tolerance (replayed or clock skew)"
    expected = signature(secret, timestamp, body)
    # Several v1 values are allowed (a receiver rotating secrets may be sent both).
    if any(hmac.compare_digest(expected, v) for v in parts.get("v1", [])):
        return None
    return "signature does not match"
