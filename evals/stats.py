"""Paired statistics for offline evals: the same items answered by a baseline and a candidate.

Pure functions over frozen dataclasses (formulas and references in docs/evals.md):

* pass/fail per item — the 2×2 table of pairs (both pass, only baseline, only candidate,
  neither); difference in pass rate Δ = (c − b)/n with Newcombe's (1998, method 10) hybrid
  score interval, which uses the Wilson intervals of both margins and the pairs' φ
  correlation, stays inside [−1, 1] and behaves with empty discordant cells; McNemar's exact
  test (a binomial test of c against b + c at ½, two-sided = 2·min tail, capped at 1, as
  statsmodels' ``mcnemar(exact=True)``) and its one-sided forms;
* scores per item (e.g. the pass share over n samples, judge grades) — paired t on the
  per-item differences, and a seeded percentile bootstrap of the mean difference;
* pass@k — the unbiased estimator 1 − C(n−c, k)/C(n, k) (Chen et al. 2021), as a product;
* Holm's step-down adjustment across categories.

Degenerate inputs (no pairs, n < 2 for t, NaN scores) return a result with ``error`` set
instead of raising; a caller must treat it as "no evidence", never as a pass.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Alternative = Literal["two-sided", "less", "greater"]


def _sps() -> Any:
    """scipy.stats, imported on first use: its import costs ~1 s, and ``eval score`` needs
    only pass@k."""
    from scipy import stats

    return stats


@dataclass(frozen=True, slots=True)
class PairedCounts:
    """Pairs of (baseline passed, candidate passed) outcomes on the same items."""

    both: int = 0
    only_baseline: int = 0  # b: baseline passed, candidate failed
    only_candidate: int = 0  # c: candidate passed, baseline failed
    neither: int = 0

    @classmethod
    def of(cls, baseline: Sequence[bool], candidate: Sequence[bool]) -> PairedCounts:
        if len(baseline) != len(candidate):
            raise ValueError("paired outcomes need the same number of items")
        pairs = list(zip(baseline, candidate, strict=True))
        return cls(
            both=sum(1 for x, y in pairs if x and y),
            only_baseline=sum(1 for x, y in pairs if x and not y),
            only_candidate=sum(1 for x, y in pairs if y and not x),
            neither=sum(1 for x, y in pairs if not x and not y),
        )

    def __add__(self, other: PairedCounts) -> PairedCounts:
        return PairedCounts(self.both + other.both, self.only_baseline + other.only_baseline,
                            self.only_candidate + other.only_candidate, self.neither + other.neither)  # fmt: skip

    @property
    def n(self) -> int:
        return self.both + self.only_baseline + self.only_candidate + self.neither

    @property
    def baseline_rate(self) -> float:
        return (self.both + self.only_baseline) / self.n if self.n else math.nan

    @property
    def candidate_rate(self) -> float:
        return (self.both + self.only_candidate) / self.n if self.n else math.nan

    @property
    def difference(self) -> float:
        return (self.only_candidate - self.only_baseline) / self.n if self.n else math.nan


@dataclass(frozen=True, slots=True)
class Comparison:
    """Candidate − baseline on one set of paired items."""

    n: int
    baseline: float  # pass rate or mean score
    candidate: float
    difference: float
    lower: float  # two-sided (1 − alpha) interval of the difference
    upper: float
    p_value: float  # two-sided
    p_worse: float  # one-sided: the candidate is worse
    p_better: float  # one-sided: the candidate is better
    test: str
    error: str | None = None


def _nan_comparison(n: int, test: str, error: str) -> Comparison:
    nan = math.nan
    return Comparison(n, nan, nan, nan, nan, nan, nan, nan, nan, test, error)


def wilson(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    z = float(_sps().norm.ppf(1 - alpha / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def newcombe_paired(counts: PairedCounts, alpha: float = 0.05) -> tuple[float, float]:
    """Newcombe's method 10 interval for candidate − baseline on paired proportions."""
    n = counts.n
    if n == 0:
        return (-1.0, 1.0)
    a, b, c, d = counts.both, counts.only_candidate, counts.only_baseline, counts.neither
    p1, p2 = (a + b) / n, (a + c) / n  # candidate, baseline
    l1, u1 = wilson(a + b, n, alpha)
    l2, u2 = wilson(a + c, n, alpha)
    denominator = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(denominator) if denominator > 0 else 0.0
    diff = p1 - p2
    dl = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    du = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return (max(-1.0, diff - dl), min(1.0, diff + du))


def mcnemar_exact(counts: PairedCounts, alternative: Alternative = "two-sided") -> float:
    """Exact McNemar p-value. "less": the candidate is worse (fewer discordant wins)."""
    b, c = counts.only_baseline, counts.only_candidate
    m = b + c
    if m == 0:
        return 1.0
    if alternative == "less":
        return float(_sps().binom.cdf(c, m, 0.5))
    if alternative == "greater":
        return float(_sps().binom.sf(c - 1, m, 0.5))
    return float(min(1.0, 2 * _sps().binom.cdf(min(b, c), m, 0.5)))


def compare_binary(counts: PairedCounts, alpha: float = 0.05) -> Comparison:
    if counts.n == 0:
        return _nan_comparison(0, "mcnemar_exact", "no paired items")
    lower, upper = newcombe_paired(counts, alpha)
    return Comparison(
        counts.n, counts.baseline_rate, counts.candidate_rate, counts.difference, lower, upper,
        mcnemar_exact(counts), mcnemar_exact(counts, "less"), mcnemar_exact(counts, "greater"), "mcnemar_exact",
    )  # fmt: skip


def paired_t(baseline: Sequence[float], candidate: Sequence[float], alpha: float = 0.05) -> Comparison:
    """Paired t-test and interval on per-item score differences (candidate − baseline)."""
    n = len(baseline)
    if n != len(candidate):
        raise ValueError("paired scores need the same number of items")
    if n < 2:
        return _nan_comparison(n, "paired_t", "fewer than 2 paired items")
    if not all(math.isfinite(v) for v in (*baseline, *candidate)):
        return _nan_comparison(n, "paired_t", "non-finite score")
    diffs = [y - x for x, y in zip(baseline, candidate, strict=True)]
    mean = math.fsum(diffs) / n
    var = math.fsum((d - mean) ** 2 for d in diffs) / (n - 1)
    base_mean, cand_mean = math.fsum(baseline) / n, math.fsum(candidate) / n
    if var == 0:
        # Every item moved by the same amount: no sampling spread to test against.
        p = 1.0 if mean == 0 else 0.0
        return Comparison(n, base_mean, cand_mean, mean, mean, mean, p, 1.0 if mean >= 0 else 0.0,
                          1.0 if mean <= 0 else 0.0, "paired_t")  # fmt: skip
    se = math.sqrt(var / n)
    t = mean / se
    q = float(_sps().t.ppf(1 - alpha / 2, n - 1))
    return Comparison(
        n, base_mean, cand_mean, mean, mean - q * se, mean + q * se,
        float(2 * _sps().t.sf(abs(t), n - 1)), float(_sps().t.cdf(t, n - 1)), float(_sps().t.sf(t, n - 1)), "paired_t",
    )  # fmt: skip


def paired_bootstrap(
    baseline: Sequence[float], candidate: Sequence[float], alpha: float = 0.05, resamples: int = 5000,
    seed: int = 0,
) -> tuple[float, float]:  # fmt: skip
    """Percentile bootstrap interval of the mean difference, resampling items (pairs)."""
    n = len(baseline)
    if n == 0 or n != len(candidate):
        return (math.nan, math.nan)
    diffs = [y - x for x, y in zip(baseline, candidate, strict=True)]
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    lo = means[max(0, math.floor(alpha / 2 * resamples))]
    hi = means[min(resamples - 1, math.ceil((1 - alpha / 2) * resamples) - 1)]
    return (lo, hi)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed (needs k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm–Bonferroni adjusted p-values in input order; None entries pass through."""
    ranked = sorted(((i, float(p)) for i, p in enumerate(p_values) if p is not None and not math.isnan(p)),
                    key=lambda t: t[1])  # fmt: skip
    m = len(ranked)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for j, (i, p) in enumerate(ranked):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out
