"""Curation on real PostgreSQL: filters, content-logging check, redaction, de-duplication,
stratified samples, provenance, references, pairs, immutable versions and the audit."""

from __future__ import annotations

import hashlib
import random
import secrets
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, text

from curation import store
from curation.builder import create_version, quotas
from curation.spec import CurationError, CurationSpec, NotFound, parse_where
from tests.curation.data import Call, experiment, store_calls

TOPICS = ["tax forms", "python decorators", "sourdough bread", "tcp handshakes", "french verbs", "gdpr fines",
          "kubernetes probes", "rust lifetimes", "chess openings", "bayesian priors", "solar panels", "sql joins"]  # fmt: skip


_WORDS = [
    f"{a}{b}"
    for a in ("bri", "cal", "dor", "fen", "gax", "hul", "jor", "kel")
    for b in ("an", "ex", "it", "om", "up")
]


def _prompt(i: int) -> str:
    """Distinct prompts: a topic and ten words drawn for ``i`` (no two are near-duplicates)."""
    words = random.Random(i).sample(_WORDS, 10)
    return f"Explain {TOPICS[i % len(TOPICS)]} using {' '.join(words)} (case {i})"


def _name() -> str:
    return f"ds-{secrets.token_hex(4)}"


def _items(engine: Engine, name: str) -> list[dict[str, object]]:
    with engine.connect() as conn:
        ver = store.version(conn, name)
        rows = conn.execute(text("SELECT item_id, category, prompt, response, reference, pair, provenance, split"
                                 " FROM dataset_items WHERE version_id = :v ORDER BY position"),
                            {"v": ver.version_id}).mappings().all()  # fmt: skip
    return [dict(r) for r in rows]


def test_thumbs_down_calls_become_items_with_their_provenance(engine: Engine) -> None:
    exp = experiment(engine)
    calls = [Call(f"tell me about {t}", category="chat", feedback=("thumbs_down",) if k % 2 else ("thumbs_up",),
                  variant="candidate" if k % 3 else "baseline", minutes=k) for k, t in enumerate(TOPICS)]  # fmt: skip
    store_calls(engine, exp, calls)
    name = _name()
    info = create_version(engine, name, CurationSpec(experiment=exp, feedback=("thumbs_down",)), "tester")
    items = _items(engine, name)
    wanted = [c for c in calls if "thumbs_down" in c.feedback]
    assert info.item_count == len(wanted) == len(items)
    assert [i["item_id"] for i in items] == [c.request_id for c in wanted]  # by time
    prov = items[0]["provenance"]
    assert isinstance(prov, dict)
    assert prov["request_id"] == wanted[0].request_id and prov["experiment"] == exp
    assert (
        prov["variant"] == wanted[0].variant
        and prov["category"] == "chat"
        and prov["feedback"] == ["thumbs_down"]
    )
    assert "u1" not in str(prov)  # the unit id is kept only as a hash


def test_an_experiment_without_full_content_logging_is_refused_with_the_reason(engine: Engine) -> None:
    exp = experiment(engine, content_logging="hashed")
    store_calls(engine, exp, [Call("a" * 64)])
    with pytest.raises(CurationError, match="content_logging 'full'"):
        create_version(engine, _name(), CurationSpec(experiment=exp), "tester")
    with pytest.raises(NotFound):
        create_version(engine, _name(), CurationSpec(experiment="no-such-experiment"), "tester")


def test_calls_without_text_or_logged_as_hashes_are_skipped_and_counted(engine: Engine) -> None:
    exp = experiment(engine)
    hashed = "0" * 63 + "1"
    store_calls(engine, exp, [Call(None, None), Call(hashed, hashed), Call(_prompt(1))])
    info = create_version(engine, _name(), CurationSpec(experiment=exp), "tester")
    assert info.item_count == 1 and info.stats["without_text"] == 2
    only_missing = experiment(engine)
    store_calls(engine, only_missing, [Call(None, None)])
    with pytest.raises(CurationError, match="has stored text"):
        create_version(engine, _name(), CurationSpec(experiment=only_missing), "tester")


def test_exact_and_near_duplicates_are_dropped_and_redaction_is_applied_again(engine: Engine) -> None:
    exp = experiment(engine)
    base = "Please draft a polite reply to my landlord about the broken heating in the flat, mention it is urgent"
    texts = [base, "  " + base.upper() + "  ", base.replace("polite", "polite and short"),
             "write to jane.doe@example.org about invoice 12345", _prompt(7)]  # fmt: skip
    calls = [Call(t, minutes=k) for k, t in enumerate(texts)]
    store_calls(engine, exp, calls)
    name = _name()
    info = create_version(engine, name, CurationSpec(experiment=exp), "tester")
    assert info.stats["exact_duplicates"] == 1 and info.stats["near_duplicates"] == 1
    prompts = [i["prompt"] for i in _items(engine, name)]
    assert prompts == [base, "write to <email> about invoice <num>", _prompt(7)]


def test_a_sample_is_stratified_by_category_and_seeded(engine: Engine) -> None:
    exp = experiment(engine)
    calls = [Call(_prompt(i), category="code" if i < 60 else "math") for i in range(80)] + [Call(_prompt(80 + i)) for i in range(20)]  # fmt: skip
    store_calls(engine, exp, calls)
    spec = CurationSpec(experiment=exp, sample=20, seed=7)
    a = create_version(engine, (name := _name()), spec, "tester")
    assert a.stats["categories"] == {"code": 12, "math": 4, "other": 4}  # 60/20/20 of 100
    b = create_version(engine, name, spec, "tester")
    assert b.version == 2 and b.content_hash == a.content_hash  # same seed, same items
    other_seed = create_version(engine, _name(), spec.model_copy(update={"seed": 8}), "tester")
    assert other_seed.content_hash != a.content_hash


def test_a_sample_reads_past_the_first_page_when_duplicates_fill_it(engine: Engine) -> None:
    """A stratum is read in pages of its seeded order (2 × quota + 256 calls): when the first
    page holds only duplicates, the quota fills from the next pages."""
    exp = experiment(engine)
    # The seeded order is MD5(seed || request id): the six distinct prompts get the ids that
    # come last in it, so the first page surely holds nothing but the repeated question
    # (random ids left it to chance: ~1 run in 10 found the quota on the first page).
    ids = sorted((f"req-page-{secrets.token_hex(4)}-{i}" for i in range(706)),
                 key=lambda r: hashlib.md5(f"3{r}".encode()).hexdigest())  # fmt: skip
    calls = [Call("the same question", category="code", minutes=i, request_id=ids[i]) for i in range(700)]
    calls += [
        Call(_prompt(900 + i), category="code", minutes=700 + i, request_id=ids[700 + i]) for i in range(6)
    ]
    store_calls(engine, exp, calls)
    info = create_version(engine, _name(), CurationSpec(experiment=exp, sample=5, seed=3), "tester")
    assert info.item_count == 5 and info.stats["quota_short"] == {}
    assert info.stats["matched"] > 2 * 5 + 256  # more than one page was read
    short = create_version(engine, _name(), CurationSpec(experiment=exp, sample=700, seed=3), "tester")
    assert short.item_count == 7 and short.stats["quota_short"] == {"code": 693}  # ran out, said so


def test_quotas_are_proportional_and_never_exceed_a_stratum() -> None:
    assert quotas({"a": 60, "b": 20, "c": 20}, 20) == {"a": 12, "b": 4, "c": 4}
    assert quotas({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}
    assert quotas({"a": 5}, 100) == {"a": 5}
    assert sum(quotas({"a": 7, "b": 3, "c": 11}, 10).values()) == 10
    assert quotas({}, 5) == {}


def test_filters_by_variant_category_time_error_and_judge_disagreement(engine: Engine) -> None:
    exp = experiment(engine)
    calls = [
        Call(_prompt(0), variant="baseline", category="code", minutes=0),
        Call(_prompt(1), variant="candidate", category="code", minutes=10, status="error", response=None),
        Call(
            _prompt(2), variant="candidate", category="math", minutes=20, judge=9, feedback=("thumbs_down",)
        ),
        Call(_prompt(3), variant="candidate", minutes=30, judge=2, feedback=("thumbs_up",)),
        Call(_prompt(4), variant="candidate", minutes=40, judge=9, feedback=("thumbs_up",)),
    ]
    store_calls(engine, exp, calls)

    def ids(**kw: object) -> list[str]:
        name = _name()
        create_version(engine, name, CurationSpec(experiment=exp, **kw), "tester")
        return [str(i["item_id"]) for i in _items(engine, name)]

    rid = [c.request_id for c in calls]
    assert ids(variant="baseline") == [rid[0]]
    assert ids(category="code") == rid[:2]
    assert ids(category="other") == rid[3:]  # no category tag: 'other'
    assert (
        ids(since=datetime(2026, 1, 1, 0, 15, tzinfo=UTC), until=datetime(2026, 1, 1, 0, 35, tzinfo=UTC))
        == rid[2:4]
    )
    assert ids(feedback=("error",)) == [rid[1]]
    assert ids(feedback=("judge_disagrees",)) == rid[2:4]
    assert ids(feedback=("error", "judge_disagrees")) == rid[1:4]
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM dataset_versions")).scalar_one()
    with pytest.raises(CurationError, match="matches these filters"):
        ids(variant="nobody")
    with pytest.raises(CurationError, match="matches these filters"):
        ids(variant="nobody", sample=5)
    with engine.connect() as conn:  # nothing half-made is left
        assert conn.execute(text("SELECT count(*) FROM dataset_versions")).scalar_one() == before


def test_references_and_regenerated_pairs_travel_with_the_item(engine: Engine) -> None:
    exp = experiment(engine)
    regen = Call(_prompt(1), response="a bad first answer", feedback=("regenerate",), unit="u9", minutes=0)
    kept = Call(_prompt(1), response="the better answer the user kept", unit="u9", minutes=1)
    edited = Call(_prompt(2), response="wrong", feedback=("edit",), minutes=2)
    checked = Call(_prompt(3), feedback=("thumbs_down",), rating=2, minutes=3)
    store_calls(engine, exp, [regen, kept, edited, checked])
    with engine.begin() as conn:
        store.add_reference(
            conn, edited.request_id, "edit", "tester", text_="the corrected answer, mail me@x.io"
        )
        store.add_reference(
            conn, checked.request_id, "task_success", "tester", check={"type": "answer", "answer": "42"}
        )
        with pytest.raises(CurationError, match="scorer spec"):
            store.add_reference(conn, checked.request_id, "task_success", "tester", check={"type": "nope"})
        with pytest.raises(CurationError, match="between 0 and 10"):
            store.add_reference(conn, checked.request_id, "rating", "tester", value=11)
    name = _name()
    info = create_version(
        engine, name, CurationSpec(experiment=exp, feedback=("regenerated", "edited", "thumbs_down")), "t"
    )
    items = {i["item_id"]: i for i in _items(engine, name)}
    assert info.stats["pairs"] == 1 and set(items) == {
        regen.request_id,
        edited.request_id,
        checked.request_id,
    }
    assert items[regen.request_id]["pair"] == {"source": "regenerated", "chosen": "the better answer the user kept",
                                               "rejected": "a bad first answer", "chosen_request_id": kept.request_id,
                                               "rejected_request_id": regen.request_id}  # fmt: skip
    assert items[edited.request_id]["reference"] == {"text": "the corrected answer, mail <email>"}
    assert items[checked.request_id]["reference"] == {
        "check": {"type": "answer", "answer": "42"},
        "rating": 2.0,
    }


def test_versions_are_immutable_audited_and_deletable(engine: Engine) -> None:
    exp = experiment(engine)
    store_calls(engine, exp, [Call(_prompt(i), minutes=i) for i in range(5)])
    name = _name()
    v1 = create_version(engine, name, CurationSpec(experiment=exp), "alice")
    store_calls(engine, exp, [Call(_prompt(10 + i), minutes=10 + i) for i in range(3)])
    v2 = create_version(engine, name, CurationSpec(experiment=exp), "alice")
    assert (v1.version, v1.item_count, v2.version, v2.item_count) == (1, 5, 2, 8)
    with engine.connect() as conn:
        assert store.version(conn, f"{name}@1").content_hash == v1.content_hash  # unchanged by v2
        shown = store.show(conn, name)
        audits = conn.execute(text("SELECT actor, action FROM audit_log WHERE entity = 'dataset' AND entity_id = :n"
                                   " ORDER BY id"), {"n": name}).all()  # fmt: skip
    assert [v["version"] for v in shown["versions"]] == [1, 2]
    assert audits == [("alice", "create_dataset_version"), ("alice", "create_dataset_version")]
    with engine.begin() as conn:
        assert store.delete(conn, name, "bob") == {"versions": 2, "items": 13, "exports": 0, "replays": 0}
    with engine.connect() as conn:
        with pytest.raises(NotFound):
            store.version(conn, name)
        assert conn.execute(text("SELECT count(*) FROM dataset_items WHERE version_id IN (:a, :b)"),
                            {"a": v1.version_id, "b": v2.version_id}).scalar_one() == 0  # fmt: skip
        assert conn.execute(text("SELECT actor FROM audit_log WHERE action = 'delete_dataset' AND entity_id = :n"),
                            {"n": name}).scalar_one() == "bob"  # fmt: skip


def test_bad_names_and_where_clauses_are_refused() -> None:
    from curation.spec import check_name

    with pytest.raises(CurationError):
        check_name("Bad Name")
    with pytest.raises(CurationError, match="unknown feedback filter"):
        parse_where(["feedback=thumbs_sideways"])
    with pytest.raises(CurationError, match="feedback=KIND"):
        parse_where(["kind=thumbs_down"])
    assert parse_where(["feedback=thumbs_down|error", "feedback=error"]) == ("thumbs_down", "error")
    with pytest.raises(ValueError):
        CurationSpec(
            experiment="e", since=datetime(2026, 1, 2, tzinfo=UTC), until=datetime(2026, 1, 1, tzinfo=UTC)
        )
    with pytest.raises(ValueError):
        CurationSpec(experiment="e", since=datetime(2026, 1, 2))
