"""Word 1–3-grams of a response, and their keyed hashes (content logging ``hashed``).

One tokenisation for every side, so that a phrase an operator types, a response the
gateway hashes and a response stored as text (content logging ``full``) give the same
grams:

1. the content redaction rules (:func:`contracts.content.redact_content`: addresses become
   ``<email>``, runs of three or more digits ``<num>``), as for stored text;
2. the first ``TEXT_MAX`` characters, lower-cased, typographic apostrophes (’ ʼ) as ``'``;
3. words: runs of letters and digits of any script, with at most one inner apostrophe
   (``don't``); everything else (punctuation, spaces, underscores, emoji) separates words;
4. grams: each word, each two and three consecutive words joined by one space, as a set
   (a response either contains a gram or not; order and counts are not kept).

A gram's hash is keyed BLAKE2b (RFC 7693 keyed mode, a pseudo-random function like
HMAC-SHA-256 and about 2.6× cheaper in CPython) with a per-deployment secret, cut to 64 bits
and read as a signed big-endian integer (a PostgreSQL ``bigint``). Without the key, nobody
holding only the database can hash a dictionary and match it; with the key, a list of
candidate phrases resolves the hashes they produce (:func:`phrase_lookup`). 64 bits: two of
ten million distinct grams collide with probability ~3·10⁻⁶.

The key's fingerprint (``key_id``, a hash of a fixed label under the key) travels with
each response's grams, so hashes made under different keys (a rotation) are never mixed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from hashlib import blake2b
from itertools import pairwise
from typing import Final

from contracts.content import redact_content

#: Characters of a response tokenised (the report's stored-text path reads the same prefix).
TEXT_MAX: Final = 4000
#: A key shorter than this (bytes of its UTF-8) is refused: it could be guessed.
MIN_KEY_BYTES: Final = 16
#: The gram hashes of one response at most (a 4,000-character text has far fewer).
MAX_GRAMS: Final = 8192

_WORD: Final = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
_APOSTROPHES: Final = str.maketrans({"’": "'", "ʼ": "'"})
_KEY_ID_LABEL: Final = b"liftgate ngram key id v1"
#: Derives the content-digest key from the deployment's key (domain separation: a digest of a
#: text is never equal to the n-gram hash of the same text, whose key is the secret itself).
_DIGEST_LABEL: Final = b"liftgate content digest v1"


def words(text: str) -> list[str]:
    """The words of ``text`` after the redaction rules (module docstring, steps 1–3)."""
    return _WORD.findall(redact_content(text[:TEXT_MAX]).lower().translate(_APOSTROPHES))


def grams_of_words(w: list[str]) -> set[str]:
    out = set(w)
    out.update([a + " " + b for a, b in pairwise(w)])
    out.update([a + " " + b + " " + c for a, b, c in zip(w, w[1:], w[2:], strict=False)])
    return out


def grams(text: str) -> set[str]:
    """Word 1–3-grams of ``text`` (module docstring)."""
    return grams_of_words(words(text))


def text_pieces(text: str, size: int) -> Iterator[str]:
    """The first ``TEXT_MAX`` characters of ``text`` in pieces of about ``size`` characters,
    each cut just before a space: no word, redacted address or number spans a cut (none
    contains a space), so the :func:`words` of the pieces, in order, are the words of the
    text — a long answer is tokenised in pieces of bounded cost."""
    text = text[:TEXT_MAX]
    start = 0
    while start < len(text):
        end = text.find(" ", start + size)
        end = len(text) if end < 0 else end
        yield text[start:end]
        start = end


def word_windows(w: list[str], size: int) -> Iterator[list[str]]:
    """Slices of ``size`` words (and the next two, which the last 3-grams reach into), so that
    the union of their :func:`grams_of_words` is the grams of ``w``."""
    for i in range(0, len(w), size):
        yield w[i : i + size + 2]


class NgramKey:
    """A per-deployment secret and what it hashes. Never logged: ``repr`` shows the id only."""

    __slots__ = ("_base", "_digest_base", "_key", "key_id")

    def __init__(self, secret: str) -> None:
        key = secret.encode()
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the n-gram key must be at least {MIN_KEY_BYTES} bytes")
        if len(set(secret)) < 6:
            raise ValueError("the n-gram key is trivially weak; generate a random one")
        # BLAKE2b takes a key of at most 64 bytes: a longer secret is hashed down first.
        self._key = key if len(key) <= 64 else blake2b(key).digest()
        self.key_id = blake2b(_KEY_ID_LABEL, key=self._key, digest_size=8).hexdigest()
        # A keyed state copied per gram: the same digests as keying each call, ~30 % cheaper.
        self._base = blake2b(key=self._key, digest_size=8)
        digest_key = blake2b(_DIGEST_LABEL, key=self._key, digest_size=32).digest()
        self._digest_base = blake2b(key=digest_key, digest_size=32)

    def __repr__(self) -> str:
        return f"NgramKey(key_id={self.key_id!r})"

    def digest(self, text: str) -> str:
        """The keyed digest of a whole text (content logging ``hashed``): 64 hex characters,
        BLAKE2b-256 under a key derived from the secret. Equal texts give equal digests within
        a deployment; without the secret a guessed text cannot be checked against one (an
        unkeyed SHA-256 of a short prompt can be, by hashing candidates)."""
        h = self._digest_base.copy()
        h.update(text.encode())
        return h.hexdigest()

    def hash(self, gram: str) -> int:
        h = self._base.copy()
        h.update(gram.encode())
        return int.from_bytes(h.digest(), "big", signed=True)

    def hashes(self, text: str) -> list[int]:
        """The sorted hashes of ``text``'s grams (at most ``MAX_GRAMS``)."""
        return kept(self.digests(grams(text)))

    def digests(self, grams: Iterable[str]) -> set[int]:
        """The hashes of ``grams``, unsorted and uncut (:func:`kept` finishes them)."""
        base, out = self._base, set()
        for g in grams:
            h = base.copy()
            h.update(g.encode())
            out.add(int.from_bytes(h.digest(), "big", signed=True))
        return out


def kept(hashes: Iterable[int]) -> list[int]:
    """What a response's event carries of its (distinct) gram hashes: sorted, at most
    ``MAX_GRAMS``."""
    return sorted(hashes)[:MAX_GRAMS]


def hash_label(h: int) -> str:
    """How a hash is shown: 16 hex digits (its unsigned 64-bit value)."""
    return f"{h & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def phrase_lookup(key: NgramKey, phrases: Iterable[str]) -> dict[int, str]:
    """hash → gram text for every 1–3-gram of the candidate ``phrases`` (a phrase list
    resolves its sub-phrases too: "great question" also resolves "great" and "question")."""
    out: dict[int, str] = {}
    for phrase in phrases:
        for g in grams(phrase):
            out[key.hash(g)] = g
    return out
