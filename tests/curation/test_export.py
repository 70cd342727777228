"""Sealed holdouts and exports on real PostgreSQL: the split, the three JSONL formats, and the
refusal of any training export that would leak a holdout item (by hash or near-duplicate)."""

from __future__ import annotations

import io
import secrets
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, text

from curation import store
from curation.builder import create_version
from curation.export import HoldoutLeak, export
from curation.spec import CurationError, CurationSpec
from curation.split import assign, split
from evals.items import EvalItem
from tests.curation.data import Call, experiment, store_calls
from tests.curation.test_builder import _prompt

_BASE = 0


def _name() -> str:
    return f"ds-{secrets.token_hex(4)}"


def _lines(buf: io.BytesIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in buf.getvalue().splitlines()]


def _fresh(i: int) -> str:
    """A prompt no other test of this module uses (holdouts are sealed across datasets)."""
    return _prompt(_BASE + i)


def _dataset(engine: Engine, n: int = 40, **call: object) -> tuple[str, str, list[Call]]:
    global _BASE
    _BASE += 1000
    exp = experiment(engine)
    calls = [Call(_fresh(i), category="code" if i % 2 else "math", minutes=i, **call) for i in range(n)]  # type: ignore[arg-type]
    store_calls(engine, exp, calls)
    name = _name()
    create_version(engine, name, CurationSpec(experiment=exp), "tester")
    return exp, name, calls


def test_the_split_is_seeded_stratified_and_keeps_every_category_in_eval() -> None:
    ids = {"code": [f"c{i}" for i in range(50)], "math": [f"m{i}" for i in range(10)], "one": ["x"]}
    a = assign(ids, 0.2, seed=1)
    assert a == assign({k: list(reversed(v)) for k, v in ids.items()}, 0.2, seed=1)  # order-free
    assert a != assign(ids, 0.2, seed=2)
    held = {c: sum(a[i] == "holdout" for i in v) for c, v in ids.items()}
    assert held == {"code": 10, "math": 2, "one": 0}
    with pytest.raises(CurationError):
        assign(ids, 1.0, seed=1)


def test_a_split_makes_a_new_version_and_a_split_version_cannot_be_split_again(engine: Engine) -> None:
    _, name, _ = _dataset(engine, 20)
    info = split(engine, name, 0.25, 3, "tester")
    assert info.version == 2 and info.stats == {"eval": 14, "holdout": 6}  # 2.5 of 10 per category: 3
    with engine.connect() as conn:
        v1 = store.version(conn, f"{name}@1")
        assert not v1.split and conn.execute(text("SELECT count(*) FROM dataset_items WHERE version_id = :v AND"
                                                  " split = 'none'"), {"v": v1.version_id}).scalar_one() == 20  # fmt: skip
    with pytest.raises(CurationError, match="sealed"):
        split(engine, name, 0.25, 4, "tester")


def test_training_exports_never_contain_holdout_items(engine: Engine) -> None:
    _, name, _ = _dataset(engine, 30)
    split(engine, name, 0.3, 1, "tester")
    with engine.connect() as conn:
        ver = store.version(conn, name)
        holdout = {r[0] for r in conn.execute(text("SELECT item_id FROM dataset_items WHERE version_id = :v AND"
                                                   " split = 'holdout'"), {"v": ver.version_id})}  # fmt: skip
    buf = io.BytesIO()
    result = export(engine, name, "eval", buf, "tester")
    exported = {str(line["id"]) for line in _lines(buf)}
    assert result.items == 20 and not exported & holdout
    chat = io.BytesIO()
    export(engine, name, "chat", chat, "tester")
    prompts = {str(line["messages"][0]["content"]) for line in _lines(chat)}
    assert len(prompts) == 20
    with pytest.raises(CurationError, match="never exported for training"):
        export(engine, name, "chat", io.BytesIO(), "tester", split="holdout")
    hold = io.BytesIO()
    assert export(engine, name, "eval", hold, "tester", split="holdout").items == 10
    assert {str(line["id"]) for line in _lines(hold)} == holdout


def test_an_export_that_would_leak_a_holdout_item_is_refused_with_the_ids(engine: Engine) -> None:
    exp, sealed, calls = _dataset(engine, 20)
    split(engine, sealed, 0.5, 1, "tester")
    with engine.connect() as conn:
        ver = store.version(conn, sealed)
        held = [str(r[0]) for r in conn.execute(text("SELECT item_id FROM dataset_items WHERE version_id = :v AND"
                                                     " split = 'holdout' ORDER BY position"), {"v": ver.version_id})]  # fmt: skip
    by_id = {c.request_id: c for c in calls}
    # A later dataset from new traffic: one prompt asked again verbatim, one reworded slightly.
    again = Call(by_id[held[0]].prompt, minutes=100)
    reworded = Call((by_id[held[1]].prompt or "") + ".", minutes=101)
    fresh = Call("an entirely different question about tidal energy storage", minutes=102)
    store_calls(engine, exp, [again, reworded, fresh])
    leaky = _name()
    create_version(engine, leaky, CurationSpec(experiment=exp, since=calls[-1].ts_after()), "tester")
    out = io.BytesIO()
    with pytest.raises(HoldoutLeak) as refused:
        export(engine, leaky, "chat", out, "mallory")
    found = {o["item_id"]: o["match"] for o in refused.value.overlaps}
    assert found == {again.request_id: "hash", reworded.request_id: "near-duplicate"}
    assert again.request_id in str(refused.value) and out.getvalue() == b""
    with engine.connect() as conn:
        rec = conn.execute(text("SELECT status, detail FROM dataset_exports e JOIN dataset_versions v ON"
                                " v.id = e.version_id JOIN datasets d ON d.id = v.dataset_id WHERE d.name = :n"),
                           {"n": leaky}).one()  # fmt: skip
        assert rec[0] == "refused" and len(rec[1]["overlaps"]) == 2
        assert conn.execute(text("SELECT actor FROM audit_log WHERE action = 'export_refused' AND entity_id = :n"),
                            {"n": leaky}).scalar_one() == "mallory"  # fmt: skip
    # The eval format is not training: the same items may be evaluated.
    assert export(engine, leaky, "eval", io.BytesIO(), "tester").items == 3


def test_the_formats_use_references_pairs_and_skip_what_cannot_be_learned(engine: Engine) -> None:
    global _BASE
    _BASE += 1000
    exp = experiment(engine)
    liked = Call(_fresh(1), response="a fine answer", feedback=("thumbs_up",), minutes=0)
    disliked = Call(_fresh(2), response="a disliked answer", feedback=("thumbs_down",), minutes=1)
    edited = Call(_fresh(3), response="wrong text", feedback=("edit",), minutes=2)
    regen = Call(_fresh(4), response="first try", feedback=("regenerate",), unit="u7", minutes=4)
    kept = Call(_fresh(4), response="second try", unit="u7", minutes=5)
    checked = Call(_fresh(5), response="41", feedback=("thumbs_down",), minutes=3)
    store_calls(engine, exp, [liked, disliked, edited, regen, kept, checked])
    with engine.begin() as conn:
        store.add_reference(conn, edited.request_id, "edit", "t", text_="right text")
        store.add_reference(
            conn, checked.request_id, "task_success", "t", check={"type": "answer", "answer": "42"}
        )
    name = _name()
    create_version(engine, name, CurationSpec(experiment=exp, until=kept.ts_before()), "t")
    chat, pref, ev = io.BytesIO(), io.BytesIO(), io.BytesIO()
    r_chat = export(engine, name, "chat", chat, "t")
    answers = [line["messages"][1]["content"] for line in _lines(chat)]
    assert answers == ["a fine answer", "right text"] and r_chat.skipped == 3
    r_pref = export(engine, name, "preference", pref, "t")
    pairs = [
        (p["preferred_output"][0]["content"], p["non_preferred_output"][0]["content"]) for p in _lines(pref)
    ]
    assert pairs == [("right text", "wrong text"), ("second try", "first try")] and r_pref.skipped == 3
    export(engine, name, "eval", ev, "t")
    items = [EvalItem.model_validate(line) for line in _lines(ev)]
    scorers = {i.id: i.scorer.type for i in items}
    assert scorers[checked.request_id] == "answer" and scorers[liked.request_id] == "judge"
    by_id = {i.id: i for i in items}
    assert by_id[edited.request_id].reference == "right text"
    assert by_id[liked.request_id].metadata["request_id"] == liked.request_id


def test_exports_are_recorded_with_their_content_hash(engine: Engine) -> None:
    _, name, _ = _dataset(engine, 6)
    first, second = io.BytesIO(), io.BytesIO()
    a = export(engine, name, "eval", first, "t")
    b = export(engine, name, "eval", second, "t")
    assert a.content_hash == b.content_hash and first.getvalue() == second.getvalue()
    with engine.connect() as conn:
        shown = store.show(conn, name)
    assert [(e["format"], e["status"], e["items"]) for e in shown["exports"]] == [("eval", "written", 6)] * 2
    with pytest.raises(CurationError, match="format"):
        export(engine, name, "csv", io.BytesIO(), "t")
    with pytest.raises(CurationError, match="not split"):
        export(engine, name, "eval", io.BytesIO(), "t", split="holdout")
