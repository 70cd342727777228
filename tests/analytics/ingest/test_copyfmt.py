"""analytics.ingest._copyfmt (the batch's COPY binary rows, in C) against the Python loop's
COPY text: the same values stored, on the database."""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any

import pytest

from analytics.ingest import copy_text, rollups
from analytics.ingest import write as ingest_module
from contracts.events import ROLLOUT_STAGE_TAG, InteractionEvent
from tests.analytics.ingest_helpers import connect, interaction

# Characters a JSON escape must handle, and some that must pass verbatim.
_ODD = "\\\t\n\r\b\v\f\"'\x01\x1e\x7f é€😀\u2028{}[]=,:"
_INT4 = 2**31 - 1


# Experiment 1 (the tests' interactions) declares "task".
_DECLARED: rollups.Declared = {1: frozenset({"task", ROLLOUT_STAGE_TAG})}


def _text(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(_ODD + "abcXYZ019-_ ") for _ in range(rng.randrange(n)))


def _event_id(rng: random.Random) -> str:
    u = uuid.UUID(int=rng.getrandbits(128))
    return rng.choice([str(u), u.hex, str(u).upper()])


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
            -62135596800.0,  # the first instant of year 1
            253402300799.0,  # the last second of year 9999
        ]
    )
    return interaction(
        rng.choice([None, rng.randrange(1, 100), rng.randrange(-(2**31), 2**31)]),
        maybe(rng.choice(["control", "candidate", _text(rng)])),
        _text(rng) or "u",
        role=rng.choice(["primary", "shadow", "attempt"]),
        ts=ts,
        request_id=_text(rng, 30),
        route=_text(rng),
        pair_id=maybe(_text(rng)),
        error_type=maybe(_text(rng)),
        status=rng.choice(["ok", "error"]),
        http_status=rng.choice([200, 500, 0, -1, -(2**31), _INT4]),
        latency_ms=rng.choice(
            [0.0, -0.0, 5e-324, 1e-300, 1e300, 123.456, 5.0, 1e16, rng.random() * 1e4, 7, 2**63 + 1]
        ),
        ttft_ms=maybe(rng.random() * 100),
        prompt_tokens=maybe(rng.randrange(0, _INT4)),
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
        category=maybe(rng.choice(["code", "math", _text(rng)])),
        event_id=_event_id(rng),
    )


def _stored(
    database_url: str,
    events: list[InteractionEvent],
    counted: set[int],
    firsts: set[int],
    declared: rollups.Declared,
    c: bool,
) -> tuple[list[Any], list[Any]]:
    """The interactions and lg_fold rows stored by the C renderer's binary COPY (``c``) or by
    the Python loop's COPY text, in one transaction rolled back after reading them."""
    with connect(database_url) as conn:
        ingest_module._prepare(conn, nested=False)
        with conn.cursor() as cur:
            if c:
                rows, fold = copy_text.render_c(events, counted, firsts, declared)
                parts = [(copy_text._COPY_INTERACTIONS_BINARY, rows), (copy_text._COPY_FOLD_BINARY, fold)]
                for statement, data in parts:
                    with cur.copy(statement) as cp:
                        cp.write(copy_text.BINARY_HEADER + data + copy_text.BINARY_TRAILER)
            else:
                fold_rows = []
                with cur.copy(copy_text._COPY_INTERACTIONS) as cp:
                    for row, fold_row in copy_text.python_rows(events, counted, firsts, declared):
                        cp.write_row(row)
                        if fold_row is not None:
                            fold_rows.append(fold_row)
                with cur.copy(copy_text._COPY_FOLD) as cp:
                    for fold_row in fold_rows:
                        cp.write_row(fold_row)
        # tags::text and the floats' text: what is stored, compared exactly (-0.0 included)
        columns = copy_text.INTERACTION_COLUMNS.replace("latency_ms", "latency_ms::text")
        got = conn.execute(
            f"SELECT {columns}, tags::text FROM interactions WHERE event_id = ANY(%s::uuid[]) ORDER BY event_id".encode(),
            ([e.event_id for e in events],),
        ).fetchall()
        fold_got = conn.execute(
            f"SELECT {rollups.FOLD_COLUMNS}, latency_ms::text FROM lg_fold".encode()
        ).fetchall()
        conn.rollback()
    return got, sorted(fold_got, key=repr)


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


@pytest.mark.parametrize("seed", range(6))
def test_the_c_renderers_rows_store_what_the_python_loops_text_stores(database_url: str, seed: int) -> None:
    rng = random.Random(seed)
    events = [_event(rng) for _ in range(300)]
    events = list({e.event_id.replace("-", "").lower(): e for e in events}.values())  # one per uuid
    counted, firsts = _flags(rng, events)
    declared = _declared(rng, events)
    by_c = _stored(database_url, events, counted, firsts, declared, c=True)
    by_python = _stored(database_url, events, counted, firsts, declared, c=False)
    assert len(by_c[0]) == len(events) and len(by_c[1]) == len(counted)
    assert by_c == by_python


def test_an_empty_batch_and_a_batch_without_counted_rows() -> None:
    e = interaction(1, "control", "u")
    assert copy_text.render_c([], set(), set()) == (b"", b"")
    rows, fold = copy_text.render_c([e], set(), set())
    assert rows[:2] == len(copy_text.INTERACTION_COLUMNS.split(",")).to_bytes(2, "big") and fold == b""


@pytest.mark.parametrize(
    "change",
    [
        {"route": "a\x00b"},  # NUL: no PostgreSQL text holds it
        {"unit_id": "\ud800"},  # unpaired surrogate: not encodable
        {"experiment_id": 2**31},  # beyond int4
        {"prompt_tokens": -(2**31) - 1},
        {"latency_ms": float("inf")},
        {"latency_ms": float("nan")},
        {"latency_ms": 10**400},  # beyond float8
        {"ts": 253402300800.0},  # year 10000
        {"ts": -62135596801.0},  # before year 1
        {"ts": float("nan")},
        {"tags": {"task": "a\x1fb"}},  # the segment separator
        {"tags": {"task": 3}},
        {"stream": 1},
        {"http_status": 200.0},
        {"event_id": "e-1"},
        {"event_id": "{01a24435-552d-7760-b665-15709e6e0650}"},  # uuid_in's, not the renderer's
        {"event_id": "01a24435-552d-7760-b665-15709e6e065g"},
        {"event_id": "01a24435x552d-7760-b665-15709e6e0650"},
    ],
    ids=lambda c: f"{next(iter(c))}={next(iter(c.values()))!r}"[:40],
)
def test_values_outside_the_common_case_are_left_to_the_sql_path(change: dict[str, Any]) -> None:
    e = dataclasses.replace(interaction(1, "control", "u"), **change)
    with pytest.raises(copy_text.Unsupported):
        copy_text.render_c([e], {id(e)}, set(), _DECLARED)


def test_a_separator_in_an_undeclared_tag_is_no_obstacle_to_the_c_renderer() -> None:
    e = interaction(1, "control", "u", tags={"task": "code", "free": "a\x1fb"})
    _, fold = copy_text.render_c([e], {id(e)}, set(), _DECLARED)
    segments = b"task=code"
    assert len(segments).to_bytes(4, "big") + segments in fold


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
