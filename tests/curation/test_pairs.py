"""Preference pairs on real PostgreSQL: judged shadow pairs (the judge's preferred side, unless
the user's signal on the answer they saw contradicts it) and regenerated-vs-kept answers
become chosen/rejected pairs, exported in the preference format."""

from __future__ import annotations

import io
import math
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, text

from curation.builder import create_version
from curation.export import export
from curation.source import JUDGE_MARGIN, judged_preference
from curation.spec import CurationSpec
from tests.curation.data import Call, Shadow, experiment, store_calls, store_shadows
from tests.curation.test_builder import _items, _name, _prompt


@pytest.mark.parametrize(
    ("primary", "shadow", "kinds", "expected"),
    [
        (3.0, 8.0, (), "shadow"),
        (8.0, 3.0, (), "primary"),
        (5.0, 5.0 + JUDGE_MARGIN / 2, (), None),  # inside the margin: a tie
        (5.0, 5.0 + JUDGE_MARGIN, (), "shadow"),  # at the margin: a preference
        (3.0, 8.0, ("thumbs_down",), "shadow"),  # the user agrees
        (3.0, 8.0, ("thumbs_up",), None),  # the user liked the answer the judge rejects
        (3.0, 8.0, ("copy",), None),
        (3.0, 8.0, ("thumbs_up", "regenerate"), "shadow"),  # mixed signals: the dislike stands
        (8.0, 3.0, ("thumbs_up",), "primary"),
        (8.0, 3.0, ("regenerate",), None),  # the user disliked the answer the judge prefers
        (8.0, 3.0, ("edit",), None),
        (math.nan, 3.0, (), None),
        (3.0, math.inf, (), None),
    ],
)
def test_the_judge_decides_a_shadow_pair_unless_the_user_contradicts_it(
    primary: float, shadow: float, kinds: tuple[str, ...], expected: str | None
) -> None:
    assert judged_preference(primary, shadow, kinds) == expected


def _lines(buf: io.BytesIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in buf.getvalue().splitlines()]


def test_judged_shadow_pairs_and_regenerations_become_preference_pairs(engine: Engine) -> None:
    exp = experiment(engine)
    worse = Call(_prompt(101), response="primary answer A", feedback=("thumbs_down",), minutes=0)
    better = Call(_prompt(102), response="primary answer B", minutes=1)
    tied = Call(_prompt(103), response="primary answer C", minutes=2)
    vetoed = Call(_prompt(104), response="primary answer D", feedback=("thumbs_up",), minutes=3)
    failed = Call(_prompt(105), response="primary answer E", minutes=4)
    regen = Call(_prompt(106), response="primary answer F", feedback=("regenerate",), unit="u6", minutes=5)
    kept = Call(_prompt(106), response="the answer the user kept", unit="u6", minutes=6)
    two = Call(_prompt(107), response="primary answer G", minutes=7)
    unjudged = Call(_prompt(108), response="primary answer H", minutes=8)
    store_calls(engine, exp, [worse, better, tied, vetoed, failed, regen, kept, two, unjudged])
    store_shadows(engine, exp, [
        Shadow(worse, "shadow answer A, mail me@x.io", (3.0, 8.0)),
        Shadow(better, "shadow answer B", (8.0, 4.0)),
        Shadow(tied, "shadow answer C", (5.0, 5.5)),
        Shadow(vetoed, "shadow answer D", (3.0, 9.0)),
        Shadow(failed, "shadow answer E", (3.0, 9.0), judge_status="error"),
        Shadow(regen, "shadow answer F", (2.0, 9.0)),
        Shadow(two, "shadow answer G1", (4.0, 6.0)),
        Shadow(two, "shadow answer G2", (4.0, 9.0)),
        Shadow(unjudged, "shadow answer H"),
        Shadow(unjudged, None, (1.0, 9.0), status="error"),  # a failed mirror has no text
    ])  # fmt: skip
    name = _name()
    info = create_version(engine, name, CurationSpec(experiment=exp), "t")  # `kept`: a duplicate prompt
    items = {i["item_id"]: i for i in _items(engine, name)}
    assert kept.request_id not in items and len(items) == 8
    assert info.stats["pairs"] == 4 and info.stats["judged_pairs"] == 3
    assert info.stats["judge_ties"] == 1 and info.stats["judge_vetoed"] == 1

    got = items[worse.request_id]["pair"]
    assert isinstance(got, dict)
    assert got["source"] == "judged_shadow" and got["judge"] == "judge"
    assert (got["chosen"], got["rejected"]) == (
        "shadow answer A, mail <email>",
        "primary answer A",
    )  # redacted
    assert (got["chosen_score"], got["rejected_score"]) == (8.0, 3.0) and got["user_agrees"] is True
    assert got["rejected_request_id"] == worse.request_id and got["chosen_variant"] == "candidate"
    got = items[better.request_id]["pair"]
    assert isinstance(got, dict)
    assert (got["chosen"], got["rejected"], got["user_agrees"]) == (
        "primary answer B",
        "shadow answer B",
        None,
    )
    got = items[two.request_id]["pair"]
    assert isinstance(got, dict) and got["chosen"] == "shadow answer G2"  # the widest gap
    got = items[regen.request_id]["pair"]  # the user's own choice comes before the judge's
    assert isinstance(got, dict) and (got["source"], got["chosen"]) == (
        "regenerated",
        "the answer the user kept",
    )
    for call in (tied, vetoed, failed, unjudged):
        assert items[call.request_id]["pair"] is None

    pref = io.BytesIO()
    result = export(engine, name, "preference", pref, "t")
    pairs = [(p["input"]["messages"][0]["content"], p["preferred_output"][0]["content"],
              p["non_preferred_output"][0]["content"]) for p in _lines(pref)]  # fmt: skip
    assert pairs == [
        (items[worse.request_id]["prompt"], "shadow answer A, mail <email>", "primary answer A"),
        (items[better.request_id]["prompt"], "primary answer B", "shadow answer B"),
        (items[regen.request_id]["prompt"], "the answer the user kept", "primary answer F"),
        (items[two.request_id]["prompt"], "shadow answer G2", "primary answer G"),
    ]
    assert result.items == 4 and result.skipped == 4


def test_a_shadow_judged_by_another_judge_than_its_primary_makes_no_pair(engine: Engine) -> None:
    exp = experiment(engine)
    call = Call(_prompt(120), response="primary", minutes=0)
    store_calls(engine, exp, [call])
    store_shadows(engine, exp, [Shadow(call, "shadow", (2.0, 9.0), judge="judge-a")])
    # The primary was scored by judge-a only: a judge-b score of the shadow is not comparable.
    with engine.begin() as conn:
        conn.execute(text("UPDATE judgements SET judge = 'judge-b' WHERE role = 'shadow' AND pair_id = :p"),
                     {"p": call.request_id})  # fmt: skip
    name = _name()
    info = create_version(engine, name, CurationSpec(experiment=exp), "t")
    assert info.stats["pairs"] == 0 and _items(engine, name)[0]["pair"] is None
