"""MinHash signatures estimate Jaccard similarity; LSH finds near-duplicates at the threshold."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from curation import minhash
from curation.text import clean, normalise, text_hash


def _shingle_set(text: str) -> set[bytes]:
    data = text.encode()
    return {data[i : i + minhash.SHINGLE] for i in range(len(data) - minhash.SHINGLE + 1)}


def test_the_signature_estimate_tracks_the_true_jaccard_similarity() -> None:
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(400)]
    errors = []
    for _ in range(200):
        base = list(rng.choice(words, 60))
        other = list(base)
        for k in rng.choice(60, int(rng.integers(0, 40)), replace=False):
            other[k] = str(rng.choice(words))
        a, b = " ".join(base), " ".join(other)
        sa, sb = _shingle_set(a), _shingle_set(b)
        truth = len(sa & sb) / len(sa | sb)
        sig_a, sig_b = minhash.signatures([a, b])
        errors.append(minhash.similarity(sig_a, sig_b) - truth)
    err = np.asarray(errors)
    assert abs(err.mean()) < 0.02  # unbiased
    assert np.sqrt((err**2).mean()) < 0.07  # ≈ sqrt(J(1-J)/64) at most 0.0625


def test_near_duplicates_are_found_and_different_texts_are_not() -> None:
    a = normalise("Please summarise the quarterly sales report for the EMEA team in three bullet points.")
    b = normalise("please summarise the quarterly sales report for the EMEA team in 3 bullet points")
    c = normalise("Write a Python function that reverses a singly linked list in place.")
    index = minhash.LshIndex()
    sig_a, sig_b, sig_c = minhash.signatures([a, b, c])
    index.add("a", sig_a)
    assert index.near(sig_b) == ["a"]
    assert index.near(sig_c) == []


def test_batched_band_keys_and_add_unless_near_match_the_one_at_a_time_path() -> None:
    rng = np.random.default_rng(8)
    words = [f"w{i}" for i in range(60)]
    texts = [" ".join(rng.choice(words, 30)) for _ in range(300)]
    texts += [t + " w1" for t in texts[:100]]  # near-duplicates of earlier texts
    sigs = minhash.signatures(texts)
    assert minhash.band_keys_many(sigs) == [minhash.band_keys(s) for s in sigs]
    one, both = minhash.LshIndex(), minhash.LshIndex()
    expected, got = [], []
    for i, (sig, keys) in enumerate(zip(sigs, minhash.band_keys_many(sigs), strict=True)):
        near = one.near(sig, first_only=True)
        if not near:
            one.add(str(i), sig)
        expected.append(near[0] if near else None)
        got.append(both.add_unless_near(str(i), sig, keys))
    assert got == expected and len(one) == len(both) and sum(g is not None for g in got) >= 95


def test_signatures_are_the_same_in_another_process() -> None:
    text = "the same text gives the same signature in every process"
    here = minhash.to_bytes(minhash.signatures([text])[0]).hex()
    code = f"from curation import minhash; print(minhash.to_bytes(minhash.signatures([{text!r}])[0]).hex())"
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert here == there


def test_empty_short_and_long_texts_get_signatures_of_the_right_shape() -> None:
    sigs = minhash.signatures(["", "ab", "x" * 50_000, "hello world"])
    assert [s.shape for s in sigs] == [(minhash.PERMUTATIONS,)] * 4
    assert not sigs[0].any()
    assert sigs[1].any() and sigs[2].any()
    assert minhash.signatures([]) == []
    assert np.array_equal(minhash.from_bytes(minhash.to_bytes(sigs[3])), sigs[3])


def test_normalisation_ignores_case_width_spacing_and_zero_width_characters() -> None:
    assert text_hash(normalise("Ｈello\u200b  World\n")) == text_hash(normalise("hello world"))
    assert text_hash(normalise("hello world")) != text_hash(normalise("hello, world"))


def test_cleaning_reapplies_redaction_and_removes_nul() -> None:
    text, cut = clean("mail bob@example.com, card 4111111111111111\x00")
    assert text == "mail <email>, card <num>\ufffd" and not cut
    long, cut = clean("a" * 200_000)
    assert cut and len(long) == 100_000
