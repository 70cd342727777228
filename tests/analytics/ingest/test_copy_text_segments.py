"""The COPY path's segment text, cached by the tags' JSON text (pure logic)."""

from __future__ import annotations

import orjson
import pytest

from analytics.ingest import copy_text

_BOTH = frozenset({"task", "lang", "rollout_stage"})
_USER = frozenset({"user", "rollout_stage"})


def _json(tags: dict[str, str]) -> str:
    return orjson.dumps(tags).decode()


def test_segments_are_built_once_per_distinct_tags_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_text, "_SEGMENTS_OF", {})
    tags = {"task": "code", "lang": "en"}
    assert copy_text._segments_cached(_json(tags), tags, _BOTH) == "task=code\x1flang=en"
    assert copy_text._segments_cached(_json({}), {}, _BOTH) is None

    def built_again(tags: dict[str, str], keys: frozenset[str]) -> str | None:
        raise AssertionError(f"segments of {tags} built again")

    monkeypatch.setattr(copy_text, "_segments", built_again)
    assert copy_text._segments_cached(_json(tags), tags, _BOTH) == "task=code\x1flang=en"
    assert copy_text._segments_cached(_json({}), {}, _BOTH) is None  # None is a cached value too


def test_only_the_declared_keys_and_rollout_stage_become_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_text, "_SEGMENTS_OF", {})
    tags = {"task": "code", "lang": "en", "rollout_stage": "2", "free": "a\x1fb"}
    assert copy_text._segments_cached(_json(tags), tags) == "rollout_stage=2"  # nothing declared
    assert copy_text._segments_cached(_json(tags), tags, _BOTH) == "task=code\x1flang=en\x1frollout_stage=2"
    only_free = {"free": "x", "other": "y"}
    assert copy_text._segments_cached(_json(only_free), only_free, _BOTH) is None


def test_a_tag_holding_the_separator_is_refused_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_text, "_SEGMENTS_OF", {})
    tags = {"task": "a\x1fb"}
    for _ in range(2):
        with pytest.raises(copy_text.Unsupported):
            copy_text._segments_cached(_json(tags), tags, _BOTH)
    assert copy_text._SEGMENTS_OF == {}


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_text, "_SEGMENTS_OF", {})
    for i in range(10_050):
        tags = {"user": str(i)}
        assert copy_text._segments_cached(_json(tags), tags, _USER) == f"user={i}"
    assert 0 < len(copy_text._SEGMENTS_OF) <= 10_000


def test_tags_column_position_matches_the_row() -> None:
    from tests.analytics.ingest_helpers import interaction

    e = interaction(1, "control", "u1", tags={"task": "code"})
    assert copy_text.interaction_row(e, "ts")[copy_text._TAGS] == _json({"task": "code"})
