"""Per-request routing: find the unit, apply forced/targeting/coverage, pick the variant.

Unit of assignment (experiment ``unit_key``): ``header`` = ``X-Liftgate-Unit``; ``user`` =
the OpenAI ``user`` field; ``api_key`` = SHA-256 of the client's bearer key (first 16 hex
digits, never the key itself); ``auto`` = the first of those three that is present. Without
a unit the request gets a random one and ``unit_source="random"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.config_rules import key_hash
from gateway.assignment import choose, covered, matches
from gateway.snapshot import RouteConfig, VariantConfig

MAX_UNIT_LENGTH = 256
MAX_TAGS = 16
#: Units whose variant a route remembers (RouteConfig.assigned); emptied when full.
ASSIGNED_MAX = 4096


@dataclass(slots=True)
class RequestFacts:
    """What the routing needs from one request (filled by the ASGI handler in one header pass)."""

    unit_header: str | None
    user: str | None
    authorization: bytes | None
    headers: list[tuple[bytes, bytes]]
    tags: dict[str, str]
    model: str
    metadata: Any = None  # the request's OpenAI ``metadata`` object, if any
    key_digest: str | None = None  # SHA-256 of the bearer key when the caller already has it


@dataclass(slots=True)
class Decision:
    variant: VariantConfig
    attributed: bool
    unit_id: str
    unit_source: str
    mode: str


def api_key_of(authorization: bytes | None) -> str | None:
    if not authorization or authorization[:7].lower() != b"bearer ":
        return None
    key = authorization[7:].strip()
    return key.decode("latin-1") if key else None


def unit_for(unit_key: str, facts: RequestFacts) -> tuple[str, str]:
    if unit_key in ("auto", "header") and facts.unit_header:
        return facts.unit_header[:MAX_UNIT_LENGTH], "header"
    if unit_key in ("auto", "user") and facts.user:
        return facts.user[:MAX_UNIT_LENGTH], "user"
    if unit_key in ("auto", "api_key"):
        digest = facts.key_digest
        if digest is None:
            key = api_key_of(facts.authorization)
            digest = key_hash(key) if key else None
        if digest:
            return "key:" + digest[:16], "api_key"
    return "anon-" + os.urandom(8).hex(), "random"


def parse_tags(raw: str) -> dict[str, str]:
    """``task=code,lang=en`` -> dict (bounded: 16 tags, 64 characters per key and value)."""
    out: dict[str, str] = {}
    for part in raw.split(",")[:MAX_TAGS]:
        key, sep, value = part.partition("=")
        key = key.strip()[:64]
        if key and sep:
            out[key] = value.strip()[:64]
    return out


def _attributes(facts: RequestFacts, unit: str) -> Mapping[str, str]:
    attrs = {"header:" + k.decode("latin-1"): v.decode("latin-1") for k, v in facts.headers}
    attrs.update({"tag:" + k.lower(): v for k, v in facts.tags.items()})
    if isinstance(facts.metadata, dict):
        attrs.update({"metadata:" + str(k).lower(): str(v) for k, v in facts.metadata.items()})
    attrs["model"] = facts.model
    attrs["unit"] = unit
    return attrs


def decide(route: RouteConfig, facts: RequestFacts) -> Decision:
    exp = route.experiment
    unit, source = unit_for(exp.unit_key, facts)
    control = route.control
    if not route.active:
        return Decision(control, False, unit, source, "none")
    forced = exp.forced.get(unit) if exp.forced and source != "random" else None
    if forced is not None and forced in route.by_name:
        return Decision(route.by_name[forced], False, unit, source, "none")
    if exp.targeting and not matches(exp.targeting, _attributes(facts, unit)):
        return Decision(control, False, unit, source, "none")
    if exp.coverage < 1.0 and not covered(exp.salt, unit, exp.coverage):
        return Decision(control, False, unit, source, "none")
    if exp.mode == "shadow":
        return Decision(control, True, unit, source, "shadow")
    assigned = route.assigned
    name = assigned.get(unit)
    if name is None:
        name = choose(exp.salt, unit, route.layout)
        if source != "random":  # a random unit never comes back
            if len(assigned) >= ASSIGNED_MAX:
                assigned.clear()
            assigned[unit] = name
    return Decision(route.by_name[name], True, unit, source, exp.mode)
