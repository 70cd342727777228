"""Near-duplicate detection: MinHash signatures over character 5-grams, banded LSH.

A text's shingles are the 5-byte windows of its normalised UTF-8 (texts shorter than 5
bytes are one shingle). Each shingle is mixed (splitmix64, top 32 bits kept); the signature holds, for
each of ``PERMUTATIONS`` = 64 hash functions h_j(x) = (a_j·x + b_j) mod 2^32 (odd a_j: each
is a permutation of the 32-bit values), the minimum over the shingles. The share of equal
positions in two signatures estimates the Jaccard similarity of their shingle sets (standard
error ≤ 0.0625).

Two texts are **near-duplicates** when their estimated Jaccard similarity is ≥
``THRESHOLD`` = 0.8. Candidates come from LSH with 16 bands of 4 rows (a pair at Jaccard
0.8 shares a band with probability 1 − (1 − 0.8⁴)¹⁶ ≈ 0.9996, at 0.5 with 0.64, at 0.3
with 0.12) and are then checked on the whole signature, so the threshold is what decides.
Seeds are fixed: signatures stored in the database stay comparable across processes.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

PERMUTATIONS = 64
BANDS = 16
ROWS = PERMUTATIONS // BANDS
THRESHOLD = 0.8
SHINGLE = 5
_SEED = 20_241_117

_rng = np.random.default_rng(_SEED)
_A = (_rng.integers(0, 2**32, PERMUTATIONS, dtype=np.uint64).astype(np.uint32) | np.uint32(1))[:, None]
_B = _rng.integers(0, 2**32, PERMUTATIONS, dtype=np.uint64).astype(np.uint32)[:, None]
_SHIFT = np.array([8 * k for k in range(SHINGLE)], dtype=np.uint64)
_EMPTY = np.zeros(PERMUTATIONS, dtype=np.uint32)

Signature = npt.NDArray[np.uint32]


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: spreads every input bit over all 64 output bits."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _shingled(texts: Iterable[str]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    """All texts' shingle hashes, concatenated, and how many each text has; computed on the
    texts' bytes laid end to end (windows that cross from one text into the next dropped)."""
    encoded = []
    for t in texts:
        e = t.encode()
        encoded.append(e + bytes(SHINGLE - len(e)) if 0 < len(e) < SHINGLE else e)
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    counts = np.maximum(lengths - (SHINGLE - 1), 0)
    total = int(lengths.sum())
    if total < SHINGLE:
        return np.zeros(0, dtype=np.uint32), counts
    buf = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.uint64)
    n = total - (SHINGLE - 1)
    grams = buf[:n].copy()
    for k in range(1, SHINGLE):
        grams |= buf[k : k + n] << np.uint64(8 * k)
    owner = np.repeat(np.arange(len(encoded)), lengths)[:n]
    local = np.arange(n) - (np.cumsum(lengths) - lengths)[owner]
    return (_mix(grams[local <= lengths[owner] - SHINGLE]) >> np.uint64(32)).astype(np.uint32), counts


def signatures(texts: Iterable[str], chunk: int = 4096) -> list[Signature]:
    """One signature per normalised text (an empty text gets all zeros), computed for the
    whole batch at once: its cost is PERMUTATIONS multiply-adds per shingle, done on
    cache-sized blocks of (permutations × shingles)."""
    flat, counts = _shingled(texts)
    out = np.zeros((counts.size, PERMUTATIONS), dtype=np.uint32)
    if flat.size == 0:
        return list(out)
    ends = np.cumsum(counts)
    starts = ends - counts
    nonempty = np.flatnonzero(counts)
    # Items are processed in groups whose shingles fit a block, so each block's minimum
    # per item is final (reduceat over the block's own item starts).
    i = 0
    with np.errstate(over="ignore"):
        while i < nonempty.size:
            j = i + 1
            while j < nonempty.size and ends[nonempty[j]] - starts[nonempty[i]] <= chunk:
                j += 1
            group = nonempty[i:j]
            lo, hi = starts[group[0]], ends[group[-1]]
            hashed = flat[lo:hi][None, :] * _A + _B
            out[group] = np.minimum.reduceat(hashed, starts[group] - lo, axis=1).T
            i = j
    return list(out)


def similarity(a: Signature, b: Signature) -> float:
    """Estimated Jaccard similarity of the two texts' shingle sets."""
    return float(np.count_nonzero(a == b)) / PERMUTATIONS


def to_bytes(sig: Signature) -> bytes:
    return sig.astype("<u4").tobytes()


def from_bytes(raw: bytes) -> Signature:
    return np.frombuffer(raw, dtype="<u4").astype(np.uint32)


_BAND_MIX = np.uint64(0x9E3779B97F4A7C15)


def band_keys(sig: Signature) -> list[int]:
    """One 64-bit key per band (its 4 rows, combined): equal rows give equal keys; two
    different bands share a key with probability ~2^-64 (and a candidate is verified on
    the whole signature anyway)."""
    pairs = np.ascontiguousarray(sig, dtype=np.uint32).view(np.uint64).reshape(BANDS, ROWS // 2)
    with np.errstate(over="ignore"):
        keys = pairs[:, 0] * _BAND_MIX ^ pairs[:, 1]
    return [int(k) for k in keys.tolist()]


def band_keys_many(sigs: Iterable[Signature] | npt.NDArray[np.uint32]) -> list[list[int]]:
    """``band_keys`` of many signatures in one vectorised step (the same keys)."""
    arr = np.ascontiguousarray(np.asarray(sigs, dtype=np.uint32).reshape(-1, PERMUTATIONS))
    pairs = arr.view(np.uint64).reshape(-1, BANDS, ROWS // 2)
    with np.errstate(over="ignore"):
        keys = pairs[:, :, 0] * _BAND_MIX ^ pairs[:, :, 1]
    out: list[list[int]] = keys.tolist()
    return out


class LshIndex:
    """Signatures by band; ``near(sig)`` returns the keys of stored near-duplicates.

    Buckets map a band key to the first signature's position (an int), or to a list once a
    second one shares it: ints keep the dicts out of the garbage collector's way, which
    otherwise rescans millions of small lists as the index grows."""

    def __init__(self, threshold: float = THRESHOLD) -> None:
        self.threshold = threshold
        self._bands: list[dict[int, int | list[int]]] = [{} for _ in range(BANDS)]
        self._sigs: list[Signature] = []
        self._keys: list[str] = []
        self._where: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def near(self, sig: Signature, first_only: bool = False, bands: list[int] | None = None) -> list[str]:
        seen: set[int] = set()
        found: list[str] = []
        for band, key in zip(self._bands, bands or band_keys(sig), strict=True):
            hit = band.get(key)
            if hit is None:
                continue
            for idx in (hit,) if isinstance(hit, int) else hit:
                if idx in seen:
                    continue
                seen.add(idx)
                if similarity(sig, self._sigs[idx]) >= self.threshold:
                    found.append(self._keys[idx])
                    if first_only:
                        return found
        return found

    def add_unless_near(self, key: str, sig: Signature, bands: list[int]) -> str | None:
        """The key of a stored near-duplicate of ``sig`` if there is one; else ``sig`` is
        added under ``key`` and None returned (``near(first_only=True)`` then ``add``, with
        each band looked up once)."""
        seen: set[int] = set()
        hits: list[int | list[int] | None] = []
        for band, bkey in zip(self._bands, bands, strict=True):
            hit = band.get(bkey)
            hits.append(hit)
            if hit is None:
                continue
            for idx in (hit,) if isinstance(hit, int) else hit:
                if idx in seen:
                    continue
                seen.add(idx)
                if similarity(sig, self._sigs[idx]) >= self.threshold:
                    return self._keys[idx]
        idx = len(self._keys)
        self._where[key] = idx
        self._keys.append(key)
        self._sigs.append(sig)
        for band, bkey, hit in zip(self._bands, bands, hits, strict=True):
            if hit is None:
                band[bkey] = idx
            elif isinstance(hit, int):
                band[bkey] = [hit, idx]
            else:
                hit.append(idx)
        return None

    def signature(self, key: str) -> Signature:
        return self._sigs[self._where[key]]

    def add(self, key: str, sig: Signature, bands: list[int] | None = None) -> None:
        idx = len(self._keys)
        self._where[key] = idx
        self._keys.append(key)
        self._sigs.append(sig)
        for band, bkey in zip(self._bands, bands or band_keys(sig), strict=True):
            hit = band.get(bkey)
            if hit is None:
                band[bkey] = idx
            elif isinstance(hit, int):
                band[bkey] = [hit, idx]
            else:
                hit.append(idx)
