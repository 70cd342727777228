"""What a configuration row must look like for the gateway to serve it.

The control plane checks these before it writes a row; the gateway applies the same rules
when it loads a snapshot (an upstream it cannot call, a targeting rule it cannot match).
One definition here, so the two can never disagree. Pure functions, no I/O.
"""

from __future__ import annotations

from hashlib import sha256
from typing import Any
from urllib.parse import urlsplit

TARGETING_OPS = frozenset({"in", "not_in", "eq", "neq", "exists", "prefix"})


def key_hash(key: str) -> str:
    """SHA-256 hex of a client API key: what ``api_keys.key_hash`` stores."""
    return sha256(key.encode()).hexdigest()


def validate_rules(rules: Any) -> str | None:
    """None when ``rules`` is a valid targeting list, else the reason."""
    if not isinstance(rules, list):
        return "targeting must be a list of rules"
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            return f"targeting[{i}] must be an object"
        attr, op = rule.get("attribute"), rule.get("op")
        if not isinstance(attr, str) or not (
            attr in ("model", "unit") or attr.startswith(("header:", "tag:", "metadata:"))
        ):
            return (
                f"targeting[{i}].attribute must be header:<name>, tag:<name>, metadata:<key>, model or unit"
            )
        if op not in TARGETING_OPS:
            return f"targeting[{i}].op must be one of {sorted(TARGETING_OPS)}"
        values = rule.get("values", [])
        if op != "exists" and (not isinstance(values, list) or not all(isinstance(v, str) for v in values)):
            return f"targeting[{i}].values must be a list of strings"
    return None


def url_problem(base_url: str) -> str | None:
    """Why ``base_url`` cannot be an upstream's address, or None."""
    if not base_url.isascii() or not base_url.isprintable() or " " in base_url:
        return "base_url must be printable ASCII without spaces (use punycode for international names)"
    try:
        parts = urlsplit(base_url)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError:
        return "base_url has an invalid port"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "base_url must be an http:// or https:// URL with a host"
    if port == 0:
        return "base_url has an invalid port"
    if parts.username is not None or parts.password is not None:
        return "base_url must not carry credentials (set api_key instead)"
    if parts.query or parts.fragment:
        return "base_url must not have a query or fragment"
    return None


def key_problem(api_key: str) -> str | None:
    """Why ``api_key`` cannot be sent as ``Authorization: Bearer <key>``, or None. Never quotes it."""
    try:
        api_key.encode("latin-1")
    except UnicodeEncodeError:
        return "api_key has characters that cannot be sent in an HTTP header (not Latin-1)"
    if any(c < " " or c == "\x7f" for c in api_key) or api_key != api_key.strip() or not api_key:
        return "api_key must be non-empty, without control characters or surrounding whitespace"
    return None
