"""analytics.ingest._copyfmt (the batch's COPY text in C) against the Python renderer it replaces."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from psycopg._copy_base import TextFormatter
from psycopg.adapt import Transformer

from analytics.ingest import copy_text, rollups
from contracts.events import ROLLOUT_STAGE_TAG, InteractionEvent
from tests.analytics.ingest_helpers import interaction

# Characters a COPY or JSON escape must handle, and some that must pass verbatim.
_ODD = "\\\t\n\r\b\v\f\"'\x01\x1e\x7f é€😀\u2028{}[]=,:"


# Experiment 1 (the tests' interactions) declares "task".
_DECLARED: rollups.Declared = {1: frozenset({"task", ROLLOUT_STAGE_TAG})}


def _text(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(_ODD + "abcXYZ019-_ ") for _ in range(rng.randrange(n)))


def _event(rng: random.Random) -> InteractionEvent:
    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.3 else v

    ts = rng.choice(
        [
            rng.uniform(0, 2e9),
            rng.uniform(-62135596800 + 86400, 253402300799 - 86400),  # years 1 .. 9999
            round(rng.uniform(1e9, 2e9), 6) + 5e-7,  # near a half-microsecond tie
            float(rng.randrange(-(10**9), 2 * 10**9)),
            1_700_000_000,  # an int
        ]
    )
    return interaction(
        rng.choice([None, rng.randrange(1, 2**31), rng.randrange(-(2**63), 2**63)]),
        maybe(rng.choice(["control", "candidate", _text(rng)])),
        _text(rng) or "u",
        role=rng.choice(["primary", "shadow", "attempt"]),
        ts=ts,
        request_id=_text(rng, 30),
        route=_text(rng),
        pair_id=maybe(_text(rng)),
        error_type=maybe(_text(rng)),
        status=rng.choice(["ok", "error"]),
        http_status=rng.choice([200, 500, 0, -1]),
        latency_ms=rng.choice([0.0, -0.0, 1e-300, 1e300, 123.456, 5.0, 1e16, rng.random() * 1e4, 7]),
        ttft_ms=maybe(rng.random() * 100),
        prompt_tokens=maybe(rng.randrange(0, 10**12)),
        completion_tokens=maybe(rng.randrange(0, 10**6)),
        response_chars=rng.randrange(0, 10**6),
        finish_reason=maybe("stop"),
        stream=rng.random() < 0.5,
        fallback=rng.random() < 0.2,
        fallback_from=maybe(_text(rng)),
        conversation_id=maybe(_text(rng)),
        tags=rng.choice(
            [{}, {"task": "code"}, {_text(rng) or "k": _text(rng) for _ in range(rng.randrange(4))}]
        ),
        prompt=maybe(_text(rng, 200)),
        response=maybe(_text(rng, 200)),
        event_id=_text(rng, 40) or "e",
    )


def _python(
    events: list[InteractionEvent],
    counted: set[int],
    firsts: set[int],
    declared: rollups.Declared = _DECLARED,
) -> tuple[bytes, bytes]:
    """What the Python loop of insert_interactions writes through psycopg's formatter."""
    rows, fold = TextFormatter(Transformer()), TextFormatter(Transformer())
    a, b = bytearray(), bytearray()
    for row, fold_row in copy_text.python_rows(events, counted, firsts, declared):
        a += rows.write_row(row)
        if fold_row is not None:
            b += fold.write_row(fold_row)
    return bytes(a + rows.end()), bytes(b + fold.end())


def _declared(rng: random.Random, events: list[InteractionEvent]) -> rollups.Declared:
    """Per experiment of the batch, a random subset of its tag keys (some experiments none)."""
    out: dict[int, frozenset[str]] = {}
    for e in events:
        if e.experiment_id is not None and e.experiment_id not in out and rng.random() < 0.7:
            keys = [k for k in e.tags if rng.random() < 0.6]
            out[e.experiment_id] = frozenset([*keys, "task", ROLLOUT_STAGE_TAG])
    return out


def _flags(rng: random.Random, events: list[InteractionEvent]) -> tuple[set[int], set[int]]:
    counted = {id(e) for e in events if rng.random() < 0.7}
    firsts = {id(e) for e in events if id(e) in counted and rng.random() < 0.5}
    return counted, firsts


def test_the_extension_is_built() -> None:
    # `pip install -e .` compiles it (scripts/bootstrap); without it ingest runs the Python loop
    assert copy_text._copyfmt is not None


@pytest.mark.parametrize("seed", range(20))
def test_c_renders_the_bytes_the_python_loop_writes(seed: int) -> None:
    rng = random.Random(seed)
    events = [_event(rng) for _ in range(300)]
    counted, firsts = _flags(rng, events)
    declared = _declared(rng, events)
    rendered = copy_text.render_c(events, counted, firsts, declared)
    assert rendered is not None
    want = _python(events, counted, firsts, declared)
    assert rendered[0].count(b"\n") == len(events)
    assert rendered[1].count(b"\n") == len(counted)
    assert rendered == want


def test_an_empty_batch_and_a_batch_without_counted_rows() -> None:
    e = interaction(1, "control", "u")
    assert copy_text.render_c([], set(), set()) == (b"", b"")
    rows, fold = copy_text.render_c([e], set(), set()) or (b"", b"x")
    assert rows.count(b"\n") == 1 and fold == b""


@pytest.mark.parametrize(
    "change",
    [
        {"route": "a\x00b"},  # NUL: psycopg refuses it
        {"unit_id": "\ud800"},  # unpaired surrogate: not encodable
        {"experiment_id": 2**63},  # beyond bigint
        {"latency_ms": float("inf")},
        {"latency_ms": float("nan")},
        {"ts": 253402300800.0},  # year 10000
        {"ts": -62135596801.0},  # before year 1
        {"ts": float("nan")},
        {"tags": {"task": "a\x1fb"}},  # the segment separator
        {"tags": {"task": 3}},
        {"stream": 1},
        {"http_status": 200.0},
    ],
    ids=lambda c: next(iter(c)),
)
def test_values_outside_the_common_case_are_left_to_the_python_loop(change: dict[str, Any]) -> None:
    e = dataclasses.replace(interaction(1, "control", "u"), **change)
    assert copy_text.render_c([e], {id(e)}, set(), _DECLARED) is None
    with pytest.raises(ValueError):
        assert copy_text._copyfmt is not None
        copy_text._copyfmt.render([e], b"\x01", dict(_DECLARED), rollups.ALWAYS)


def test_a_separator_in_an_undeclared_tag_is_no_obstacle_to_the_c_renderer() -> None:
    e = interaction(1, "control", "u", tags={"task": "code", "free": "a\x1fb"})
    rendered = copy_text.render_c([e], {id(e)}, set(), _DECLARED)
    assert rendered is not None and rendered == _python([e], {id(e)}, set())
    assert b"\ttask=code\t" in rendered[1]


def test_flags_must_match_the_events() -> None:
    assert copy_text._copyfmt is not None
    e = interaction(1, "control", "u")
    with pytest.raises(ValueError, match="one flag per event"):
        copy_text._copyfmt.render([e], b"", {}, rollups.ALWAYS)
    with pytest.raises(ValueError, match="0, 1 or 2"):
        copy_text._copyfmt.render([e], b"\x03", {}, rollups.ALWAYS)
    with pytest.raises(TypeError):
        copy_text._copyfmt.render((e,), b"\x00", {}, rollups.ALWAYS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sets"):
        copy_text._copyfmt.render([e], b"\x01", {1: ["task"]}, rollups.ALWAYS)  # type: ignore[dict-item]
