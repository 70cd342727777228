"""Word 1–3-grams and their keyed hashes: one tokenisation for the gateway, the operator's
phrase list and stored text; hashes that depend on the key; the NgramsEvent contract."""

from __future__ import annotations

import hashlib
import json

import orjson
import pytest

from contracts.events import (
    GRAMS_MAX,
    JUDGEMENTS_TOPIC,
    DecodeError,
    NgramsEvent,
    decode,
    encode,
    ngrams_event_id,
    topic_for,
)
from contracts.ngrams import NgramKey, grams, hash_label, phrase_lookup, words
from tests.known_secrets import secret

KEY = NgramKey(secret("ngram"))


def test_words_ignore_case_and_punctuation_and_keep_inner_apostrophes() -> None:
    assert words("Great question! Don’t PANIC, it's (fine)...") == [
        "great", "question", "don't", "panic", "it's", "fine",
    ]  # fmt: skip
    assert words("Größe — naïve café_au_lait") == ["größe", "naïve", "café", "au", "lait"]


def test_grams_are_the_one_to_three_word_sequences_as_a_set() -> None:
    assert grams("a b c b") == {"a", "b", "c", "a b", "b c", "c b", "a b c", "b c b"}
    assert grams("") == set() and grams("!!!") == set()


def test_the_redaction_rules_apply_before_tokenising() -> None:
    assert "alice" not in grams("mail alice@example.com or call 5551234")
    assert {"mail email", "call num"} <= grams("mail alice@example.com or call 5551234")


def test_an_operator_phrase_resolves_the_hashes_of_a_response_however_it_is_written() -> None:
    response = "GREAT   Question!!! Here is the answer, step by step."
    hashed = set(KEY.hashes(response))
    lookup = phrase_lookup(KEY, ["great question", "Step-by-step"])
    assert {lookup[h] for h in hashed if h in lookup} == {
        "great", "question", "great question", "step", "by", "step by", "by step", "step by step",
    }  # fmt: skip


def test_hashes_depend_on_the_key_and_the_key_id_not_on_the_text() -> None:
    other = NgramKey(secret("ngram"))
    assert KEY.hash("great question") != other.hash("great question")
    assert KEY.key_id != other.key_id and len(KEY.key_id) == 16
    assert KEY.hash("great question") == NgramKey(KEY._key.decode()).hash("great question")
    assert KEY._key.decode() not in repr(KEY)
    assert all(-(2**63) <= h < 2**63 for h in KEY.hashes("a b c d e f"))
    assert hash_label(-1) == "ffffffffffffffff" and hash_label(1) == "0000000000000001"


def test_a_content_digest_is_keyed_and_separate_from_the_gram_hashes() -> None:
    text = "what is 2 + 2?"
    d = KEY.digest(text)
    assert len(d) == 64 and int(d, 16) >= 0 and d == KEY.digest(text)  # stable: equal texts match
    assert d != KEY.digest(text + " ")
    assert d != hashlib.sha256(text.encode()).hexdigest()  # not what a guess could be checked against
    assert d != NgramKey(secret("ngram") + "x").digest(text)  # another deployment, another digest
    # Domain separation: no digest is the gram hash of the same text under the same secret.
    assert int.from_bytes(bytes.fromhex(d)[:8], "big", signed=True) != KEY.hash(text)


def test_a_short_or_trivial_key_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        NgramKey("short-key")
    with pytest.raises(ValueError, match="weak"):
        NgramKey("a" * 40)


def test_a_long_text_is_cut_and_the_hashes_are_bounded() -> None:
    text = " ".join(f"w{i}" for i in range(10_000))
    hashes = KEY.hashes(text)
    assert 0 < len(hashes) <= GRAMS_MAX and hashes == sorted(hashes)
    assert KEY.hash("w9999") not in hashes  # past the first 4,000 characters


def _event(**kw: object) -> NgramsEvent:
    base: dict[str, object] = {
        "request_id": "req-1", "unit_id": "u1", "role": "primary", "key_id": KEY.key_id,
        "grams": KEY.hashes("great question indeed"), "experiment_id": 7, "variant": "candidate",
        "category": "code", "event_id": ngrams_event_id("req-1"),
    }  # fmt: skip
    return NgramsEvent(**(base | kw))  # type: ignore[arg-type]


def test_an_ngrams_event_round_trips_and_travels_with_the_judgements() -> None:
    ev = _event()
    assert decode(encode(ev)) == ev
    assert decode(encode(ev).decode()) == ev
    assert topic_for(ev) == JUDGEMENTS_TOPIC
    assert ngrams_event_id("req-1") == ev.event_id != ngrams_event_id("req-2")


@pytest.mark.parametrize(
    ("grams_value", "reason"),
    [
        ([2**63], "signed 64-bit"),
        ([-(2**63) - 1], "signed 64-bit"),
        ([True], "signed 64-bit"),
        ([1.5], "signed 64-bit"),
        (["ab"], "signed 64-bit"),
        (list(range(GRAMS_MAX + 1)), "more than"),
        ("abc", "must be list"),
    ],
)
def test_an_ngrams_event_with_bad_grams_is_refused_with_the_reason(grams_value: object, reason: str) -> None:
    raw = orjson.loads(encode(_event()))
    raw["grams"] = grams_value
    with pytest.raises(DecodeError, match=reason):
        decode(_dumps(raw))


def _dumps(raw: dict[str, object]) -> bytes:
    return json.dumps(raw).encode()  # orjson refuses integers beyond 64 bits; json does not


def test_an_ngrams_event_without_a_key_id_or_with_a_nul_is_refused() -> None:
    with pytest.raises(DecodeError, match="key_id"):
        decode(encode(_event(key_id="")))
    with pytest.raises(DecodeError, match="NUL"):
        decode(encode(_event(variant="a\x00b")))
    with pytest.raises(DecodeError, match="longer than"):
        decode(encode(_event(key_id="k" * 40)))
