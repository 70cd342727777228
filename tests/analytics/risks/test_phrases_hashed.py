"""The stuffing detector on hashed n-grams (content logging ``hashed``), through the report's own
phrase path (``analytics.report.risks.phrase_part``): simulated responses are tokenised and
hashed with a key exactly as the gateway does, then counted per arm.

Simulation: 400 words with Zipf(1.1) frequencies; each unit writes about one of 8 topics
(each topic reweights the vocabulary by Gamma(0.5, 2) factors), so a unit's responses share
words (clustered use); 1 + Poisson(2) responses of 15 words per unit. The stuffed candidate
starts a share of its responses with "Great question!". Responses are drawn from a pool of
pre-hashed ones per topic (hashing is the slow part), the same pools for both arms.
"""

from __future__ import annotations

import numpy as np
import pytest

from analytics.report.risks import RiskOptions, _Texts, phrase_part
from contracts.ngrams import NgramKey, hash_label
from tests.known_secrets import secret

KEY = NgramKey(secret("ngram"))
WORDS = [f"w{i}" for i in range(400)]
TOPICS = 8
POOL = 150  # responses per topic
STUFFED = "great question"


def _pools(seed: int) -> tuple[list[list[set[int]]], list[list[set[int]]]]:
    """Per topic: hashed responses, and the same responses starting with the stuffed phrase."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, len(WORDS) + 1) ** 1.1
    plain: list[list[set[int]]] = []
    stuffed: list[list[set[int]]] = []
    for _ in range(TOPICS):
        p = zipf * rng.gamma(0.5, 2.0, len(WORDS))
        p /= p.sum()
        texts = [" ".join(rng.choice(WORDS, 15, p=p)) for _ in range(POOL)]
        plain.append([set(KEY.hashes(t)) for t in texts])
        stuffed.append([set(KEY.hashes("Great question! " + t)) for t in texts])
    return plain, stuffed


PLAIN, STUFFED_POOL = _pools(61)
#: Grams that exist only because of the stuffing ("great", "question w12", "great question w12").
STUFF_ONLY = {hash_label(h) for pool in STUFFED_POOL for r in pool for h in r} - {
    hash_label(h) for pool in PLAIN for r in pool for h in r
}


def _arm(rng: np.random.Generator, units: int, stuff: float, tag: str) -> _Texts:
    unit, grams = [], []
    for i in range(units):
        topic = int(rng.integers(TOPICS))
        for _ in range(1 + rng.poisson(2.0)):
            k = int(rng.integers(POOL))
            pool = STUFFED_POOL if rng.random() < stuff else PLAIN
            unit.append(f"{tag}{i}")
            grams.append(pool[topic][k])
    n = len(unit)
    return _Texts(unit, ["other"] * n, grams, np.zeros(n), np.full(n, np.nan))


OPTS = RiskOptions(min_units=30)


@pytest.mark.slow
def test_aa_on_hashed_grams_flags_any_phrase_in_at_most_alpha_of_runs() -> None:
    """200 A/A runs × 300 units per arm (≈ 900 responses per arm, ~900 grams tested)."""
    rng = np.random.default_rng(62)
    runs, fired = 200, 0
    for _ in range(runs):
        part = phrase_part(_arm(rng, 300, 0.0, "c"), _arm(rng, 300, 0.0, "t"), True, OPTS)
        assert part.state == "ok" and part.source == "hashed" and part.tested > 500
        fired += bool(part.flagged)
    assert fired / runs <= 0.05


@pytest.mark.slow
@pytest.mark.parametrize(("units", "share", "power"), [(1000, 0.05, 0.8), (300, 0.5, 0.95)])
def test_a_stuffed_phrase_hash_is_found_with_stated_power(units: int, share: float, power: float) -> None:
    """The phrase in ``share`` of candidate responses (never in the control's): found in at
    least ``power`` of 40 runs at ``units`` units per arm; a phrase the stuffing did not make
    flagged in at most 10 % of runs."""
    rng = np.random.default_rng(63 + units)
    target = hash_label(KEY.hash(STUFFED))
    runs, found, others = 40, 0, 0
    for _ in range(runs):
        part = phrase_part(_arm(rng, units, 0.0, "c"), _arm(rng, units, share, "t"), True, OPTS)
        found += target in part.flagged
        others += any(f not in STUFF_ONLY for f in part.flagged)
    assert found / runs >= power
    assert others / runs <= 0.1


def test_hashed_and_text_grams_give_the_same_table_up_to_the_labels() -> None:
    """Hashing relabels the grams one to one: same tested count, same statistics."""
    rng = np.random.default_rng(64)
    texts_c = [" ".join(rng.choice(WORDS[:60], 12)) for _ in range(400)]
    texts_t = ["Great question! " * (i % 3 == 0) + " ".join(rng.choice(WORDS[:60], 12)) for i in range(400)]
    units = [f"u{i // 3}" for i in range(400)]
    from contracts.ngrams import grams

    def arm(texts: list[str], hashed: bool) -> _Texts:
        g = [set(KEY.hashes(t)) if hashed else grams(t) for t in texts]
        return _Texts(units, ["other"] * 400, g, np.zeros(400), np.full(400, np.nan))  # type: ignore[arg-type]

    plain = phrase_part(arm(texts_c, False), arm(texts_t, False), False, OPTS)
    hashed = phrase_part(arm(texts_c, True), arm(texts_t, True), True, OPTS)
    assert plain.tested == hashed.tested > 0
    by_hash = {r.hash: r for r in hashed.phrases}
    for r in plain.phrases:
        h = by_hash.get(hash_label(KEY.hash(r.phrase)))
        if h is not None:
            assert (h.z, h.flagged, h.rate_candidate) == pytest.approx((r.z, r.flagged, r.rate_candidate))
    assert STUFFED in plain.flagged and hash_label(KEY.hash(STUFFED)) in hashed.flagged
