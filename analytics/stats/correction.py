"""Multiple-comparison corrections across metrics × variants (× segments).

Holm (1979) step-down controls the family-wise error rate: sort p ascending,
p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)). Benjamini–Hochberg (1995) step-up
controls the false discovery rate: p̃_(i) = min_{j ≥ i} min(1, m·p_(j)/j). ``None``
entries (tests that could not be computed) are passed through and do not count in m.
"""

from __future__ import annotations

from collections.abc import Sequence


def _present(p_values: Sequence[float | None]) -> list[tuple[int, float]]:
    return sorted(((i, float(p)) for i, p in enumerate(p_values) if p is not None), key=lambda t: t[1])


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm–Bonferroni adjusted p-values, in the input order."""
    ranked = _present(p_values)
    m = len(ranked)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for j, (i, p) in enumerate(ranked):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the input order."""
    ranked = _present(p_values)
    m = len(ranked)
    out: list[float | None] = [None] * len(p_values)
    running = 1.0
    for j in range(m - 1, -1, -1):
        i, p = ranked[j]
        running = min(running, min(1.0, m * p / (j + 1)))
        out[i] = running
    return out
