"""Admin API bodies (pydantic: they cross a process boundary) and the domain checks behind 422s.

Every field is typed strictly (``true`` is not an integer, ``"1"`` not a number, no NaN or
infinity) and range-checked; names, keys and other text carry no control characters; the
free-form JSON fields (targeting, metrics, rollout plan) hold finite numbers, NUL-free
strings and at most 64 levels. A PATCH may set to ``null`` only what may be empty
(``description``, ``rollout_plan``, ``rollout_stage``, an upstream's ``api_key``). So every
invalid input is a 422 with a reason and never reaches the database.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from contracts.config_rules import key_problem, url_problem, validate_rules
from contracts.events import TAG_KEY_MAX
from contracts.rollout_plan import plan_problems

MODES = ("ab", "shadow", "rollout")
UNIT_KEYS = ("auto", "header", "user", "api_key")
CONTENT_LOGGING = ("none", "hashed", "full")
MAX_JSON_INT = 2**63 - 1
MAX_DEPTH = 64  # nesting of free-form JSON fields, as the gateway allows in requests
# Tag keys an experiment rolls up per segment: each costs a segment rollup row per unit and
# value at ingest, so the list is short (rollout_stage is always rolled up, listed or not).
SEGMENT_TAGS_MAX = 8
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # tabs and newlines allowed


def has_control(value: str) -> bool:
    """True when ``value`` holds a control character (no name, key or path segment may)."""
    return _CONTROL.search(value) is not None


def _no_control(value: str) -> str:
    if has_control(value):
        raise ValueError("must not contain control characters")
    return value


def _text(value: str) -> str:
    if _TEXT_CONTROL.search(value):
        raise ValueError("must not contain control characters other than tabs and newlines")
    return value


def _json_problem(value: Any) -> str | None:
    """Why a free-form JSON value cannot be stored (as JSONB) and read back safely, or None."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"is nested deeper than {MAX_DEPTH} levels"
        if isinstance(item, str):
            if "\x00" in item:
                return "must not contain NUL characters"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_JSON_INT:
                return "holds an integer outside the 64-bit range"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "holds a number that is not finite"
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str) or "\x00" in key:
                    return "has a key that is not a NUL-free string"
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        else:
            return f"holds a {type(item).__name__}, which is not JSON"
    return None


def _json(value: Any) -> Any:
    problem = _json_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _base_url(value: str) -> str:
    problem = url_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _api_key(value: str) -> str:
    problem = key_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


UpstreamName = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]
BaseUrl = Annotated[str, Field(min_length=1, max_length=1024), AfterValidator(_base_url)]
ApiKey = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_api_key)]
Name128 = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_no_control)]
Name64 = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_no_control)]
Name256 = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_no_control)]
Word = Annotated[str, Field(min_length=1, max_length=16), AfterValidator(_no_control)]
Description = Annotated[str, Field(max_length=10_000), AfterValidator(_text)]
Json = Annotated[Any, AfterValidator(_json)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]
Weight = Annotated[float, Field(ge=0.0, le=1e6)]
Timeout = Annotated[float, Field(gt=0, le=3600)]
ConnectTimeout = Annotated[float, Field(gt=0, le=600)]
Connections = Annotated[int, Field(ge=1, le=100_000)]
Forced = Annotated[dict[Name256, Name64], Field(max_length=10_000)]


def _tag_key(value: str) -> str:
    if "=" in value:
        raise ValueError("a segment tag key must not contain '=' (segments read 'key=value')")
    return _no_control(value)


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("segment tag keys must be distinct")
    return values


TagKey = Annotated[str, Field(min_length=1, max_length=TAG_KEY_MAX), AfterValidator(_tag_key)]
SegmentTags = Annotated[list[TagKey], Field(max_length=SEGMENT_TAGS_MAX), AfterValidator(_distinct)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    # Fields a PATCH may not set to null (their columns are NOT NULL; "unset" is "omit it").
    not_null: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _refuse_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.not_null:
            nulls = sorted(k for k in cls.not_null if k in data and data[k] is None)
            if nulls:
                raise ValueError(f"{', '.join(nulls)} cannot be null (omit a field to leave it unchanged)")
        return data


class UpstreamIn(_Body):
    name: UpstreamName
    base_url: BaseUrl
    api_key: ApiKey | None = None
    timeout_s: Timeout = 60.0
    connect_timeout_s: ConnectTimeout = 5.0
    max_connections: Connections = 100


class UpstreamPatch(_Body):
    not_null: ClassVar[frozenset[str]] = frozenset(
        {"base_url", "timeout_s", "connect_timeout_s", "max_connections"}
    )

    base_url: BaseUrl | None = None
    api_key: ApiKey | None = None  # null removes the key
    timeout_s: Timeout | None = None
    connect_timeout_s: ConnectTimeout | None = None
    max_connections: Connections | None = None


class VariantIn(_Body):
    name: Name64
    upstream: Name128
    model: Name256
    weight: Weight = 0.0
    is_control: bool = False


class Blinding(BaseModel):
    """What a client learns of its arm. ``echo_model``: the response's ``model`` is the route the
    client asked for (not the variant's model); ``variant_header``: ``X-Liftgate-Variant`` is
    sent ``on_request`` (when the request carries ``X-Liftgate-Show-Variant: true``),
    ``always`` or ``never``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    echo_model: bool = True
    variant_header: Literal["on_request", "always", "never"] = "on_request"


class ExperimentIn(_Body):
    name: Name128
    route: Name128
    mode: Word
    description: Description | None = None
    salt: Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_no_control)] | None = None
    unit_key: Word = "auto"
    coverage: Share = 1.0
    targeting: Annotated[list[Json], Field(max_length=64)] = Field(default_factory=list)
    forced: Forced = Field(default_factory=dict)
    shadow_sample_rate: Share = 1.0
    fallback_to_control: bool = False
    content_logging: Word = "none"
    blinding: Blinding = Field(default_factory=Blinding)
    metrics: Annotated[list[Json], Field(max_length=256)] = Field(default_factory=list)
    # Tag keys rolled up per segment at ingest (the report's breakdowns); others are stored
    # with each request only. A key declared later: POST …/segments/backfill.
    segment_tags: SegmentTags = Field(default_factory=list)
    rollout_plan: dict[str, Json] | None = None
    variants: Annotated[list[VariantIn], Field(min_length=1, max_length=64)]


class ExperimentPatch(_Body):
    not_null: ClassVar[frozenset[str]] = frozenset(
        {
            "route",
            "mode",
            "unit_key",
            "coverage",
            "targeting",
            "forced",
            "shadow_sample_rate",
            "fallback_to_control",
            "content_logging",
            "blinding",
            "metrics",
            "segment_tags",
            "variants",
        }
    )

    description: Description | None = None
    route: Name128 | None = None
    mode: Word | None = None
    unit_key: Word | None = None
    coverage: Share | None = None
    targeting: Annotated[list[Json], Field(max_length=64)] | None = None
    forced: Forced | None = None
    shadow_sample_rate: Share | None = None
    fallback_to_control: bool | None = None
    content_logging: Word | None = None
    blinding: Blinding | None = None
    metrics: Annotated[list[Json], Field(max_length=256)] | None = None
    segment_tags: SegmentTags | None = None
    rollout_plan: dict[str, Json] | None = None
    rollout_stage: Annotated[int, Field(ge=0, le=10_000)] | None = None
    variants: Annotated[list[VariantIn], Field(min_length=1, max_length=64)] | None = None


class ApiKeyIn(_Body):
    name: Name128


class SegmentBackfillIn(_Body):
    """Which declared keys to recompute from the stored requests (default: all declared)."""

    keys: SegmentTags | None = None


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
