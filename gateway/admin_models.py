"""Admin API bodies (pydantic: they cross a process boundary) and the domain checks behind 422s."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contracts.rollout_plan import plan_problems
from gateway.assignment import validate_rules

MODES = ("ab", "shadow", "rollout")
UNIT_KEYS = ("auto", "header", "user", "api_key")
CONTENT_LOGGING = ("none", "hashed", "full")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UpstreamIn(_Body):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    base_url: str = Field(min_length=1, max_length=1024, pattern=r"^https?://")
    api_key: str | None = None
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    connect_timeout_s: float = Field(default=5.0, gt=0, le=600)
    max_connections: int = Field(default=100, ge=1, le=100_000)


class UpstreamPatch(_Body):
    base_url: str | None = Field(default=None, min_length=1, max_length=1024, pattern=r"^https?://")
    api_key: str | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    connect_timeout_s: float | None = Field(default=None, gt=0, le=600)
    max_connections: int | None = Field(default=None, ge=1, le=100_000)


class VariantIn(_Body):
    name: str = Field(min_length=1, max_length=64)
    upstream: str
    model: str = Field(min_length=1, max_length=256)
    weight: float = 0.0
    is_control: bool = False


class ExperimentIn(_Body):
    name: str = Field(min_length=1, max_length=128)
    route: str = Field(min_length=1, max_length=128)
    mode: str
    description: str | None = None
    salt: str | None = Field(default=None, min_length=1, max_length=64)
    unit_key: str = "auto"
    coverage: float = 1.0
    targeting: list[Any] = Field(default_factory=list)
    forced: dict[str, str] = Field(default_factory=dict)
    shadow_sample_rate: float = 1.0
    fallback_to_control: bool = False
    content_logging: str = "none"
    metrics: list[Any] = Field(default_factory=list)
    rollout_plan: dict[str, Any] | None = None
    variants: list[VariantIn]


class ExperimentPatch(_Body):
    description: str | None = None
    route: str | None = Field(default=None, min_length=1, max_length=128)
    mode: str | None = None
    unit_key: str | None = None
    coverage: float | None = None
    targeting: list[Any] | None = None
    forced: dict[str, str] | None = None
    shadow_sample_rate: float | None = None
    fallback_to_control: bool | None = None
    content_logging: str | None = None
    metrics: list[Any] | None = None
    rollout_plan: dict[str, Any] | None = None
    rollout_stage: int | None = Field(default=None, ge=0)
    variants: list[VariantIn] | None = None


class ApiKeyIn(_Body):
    name: str = Field(min_length=1, max_length=128)


def check_rollout_plan(plan: Any) -> str | None:
    """The plan's structural problems (the shared schema); statistics are checked by analytics."""
    return plan_problems(plan)


def check_experiment(fields: dict[str, Any], variants: list[VariantIn], upstreams: set[str]) -> str | None:
    """The reason an experiment definition is invalid, or None."""
    mode = fields["mode"]
    if mode not in MODES:
        return f"unknown mode {mode!r}; expected one of {', '.join(MODES)}"
    if fields["unit_key"] not in UNIT_KEYS:
        return f"unit_key must be one of {', '.join(UNIT_KEYS)}"
    if fields["content_logging"] not in CONTENT_LOGGING:
        return f"content_logging must be one of {', '.join(CONTENT_LOGGING)}"
    if not 0.0 <= fields["coverage"] <= 1.0:
        return "coverage must be between 0 and 1"
    if not 0.0 <= fields["shadow_sample_rate"] <= 1.0:
        return "shadow_sample_rate must be between 0 and 1"
    reason = validate_rules(fields["targeting"]) or check_rollout_plan(fields.get("rollout_plan"))
    if reason:
        return reason
    if len(variants) < 2:
        return "an experiment needs a control and at least one candidate"
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        return "duplicate variant names"
    controls = [v for v in variants if v.is_control]
    if len(controls) != 1:
        return "exactly one variant must be the control" + (
            " (none given)" if not controls else f" ({len(controls)} given)"
        )
    for v in variants:
        if v.weight < 0:
            return f"variant {v.name!r} has a negative weight"
        if v.weight != v.weight or v.weight == float("inf"):
            return f"variant {v.name!r} has an invalid weight"
        if v.upstream not in upstreams:
            return f"variant {v.name!r} names unknown upstream {v.upstream!r}"
    if mode == "rollout" and len(variants) != 2:
        return "a rollout has exactly one candidate beside the control"
    for unit, variant in fields["forced"].items():
        if variant not in names:
            return f"forced unit {unit!r} names unknown variant {variant!r}"
    return None
