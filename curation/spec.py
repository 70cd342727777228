"""What a dataset is made from: the curation filters (validated), as stored with a version."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.\-]{0,127}$"
#: ``--where feedback=...`` values and what each selects (any of them: OR).
FEEDBACK_FILTERS = ("thumbs_down", "regenerated", "edited", "judge_disagrees", "error")
#: Feedback kinds behind each filter (``error`` is the call's own status, ``judge_disagrees``
#: compares a ``judge_score`` feedback with the user's signal, see ``curation.source``).
FILTER_KINDS = {"thumbs_down": "thumbs_down", "regenerated": "regenerate", "edited": "edit"}
MAX_SAMPLE = 1_000_000


class CurationError(ValueError):
    """Bad input or a state that forbids the action (the message says which and why)."""


class NotFound(CurationError):
    """The named dataset, version or experiment does not exist."""


class CurationSpec(BaseModel):
    """The filters of ``liftgate datasets create`` (and ``POST /api/datasets``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: str = Field(min_length=1, max_length=128)
    variant: str | None = Field(default=None, max_length=64)
    category: str | None = Field(default=None, max_length=64)
    feedback: tuple[Literal["thumbs_down", "regenerated", "edited", "judge_disagrees", "error"], ...] = ()
    sample: int | None = Field(default=None, ge=1, le=MAX_SAMPLE)
    stratify: Literal["category", "none"] = "category"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    since: datetime | None = None
    until: datetime | None = None

    @field_validator("since", "until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give a time zone (e.g. 2026-01-31T00:00:00Z)")
        return value

    @model_validator(mode="after")
    def _window(self) -> CurationSpec:
        if self.since and self.until and self.since >= self.until:
            raise ValueError("'since' must be before 'until'")
        return self

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def check_name(name: str) -> str:
    if not re.fullmatch(NAME_PATTERN, name):
        raise CurationError(
            "a dataset name is 1-128 characters: lowercase letters, digits, '_', '.', '-' (first a letter or digit)"
        )
    return name


def parse_where(values: list[str]) -> tuple[str, ...]:
    """``feedback=thumbs_down|regenerated`` (repeatable) -> the filter names."""
    out: list[str] = []
    for value in values:
        key, sep, rest = value.partition("=")
        if key.strip() != "feedback" or not sep:
            raise CurationError(f"--where takes feedback=KIND[|KIND...], got {value!r}")
        for kind in rest.split("|"):
            kind = kind.strip()
            if kind not in FEEDBACK_FILTERS:
                raise CurationError(f"unknown feedback filter {kind!r}: one of {', '.join(FEEDBACK_FILTERS)}")
            if kind not in out:
                out.append(kind)
    return tuple(out)
