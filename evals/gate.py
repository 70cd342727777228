"""The offline gate: a declaration (``offline_gate``) and the pure decision over paired results.

Declaration (JSON/YAML; stored per experiment in ``offline_gates``)::

    {"suites": ["demo"],                       # built-in suite names or registered datasets
     "margins": {"code": 0.05},                # non-inferiority margin per category (pass-rate points)
     "default_margin": 0.05,                   # for categories not listed; null = they fail
     "required_improvements": {"math": 0.05},  # optional: must be significantly better, by this much
     "min_pass_rates": {"json": 0.8},          # optional: candidate pass rate floor
     "alpha": 0.05, "min_items": 20, "require_noninferiority": false,
     "params": {"temperature": 0, "seed": 0, "max_tokens": 1024}, "samples": 1}

Per category (Holm across categories on the one-sided "worse" p-values):

* ``insufficient`` — fewer than ``min_items`` paired items, or no test could be computed;
* ``forgetting`` — the candidate is worse by more than the margin (Δ < −margin) and
  significantly worse (Holm-adjusted one-sided p < alpha): "forgetting: code −25.0 pts";
* ``below_minimum`` — the candidate's pass rate is under ``min_pass_rates``;
* ``no_improvement`` — a required improvement is not shown (the interval's lower bound must
  be above 0 and Δ at least the required amount);
* ``not_noninferior`` — with ``require_noninferiority``, the lower bound is ≤ −margin;
* ``no_margin`` — the category has no margin and there is no default;
* ``pass`` otherwise.

The gate passes only when every category passes and there is at least one. With two
identical models the chance of any ``forgetting`` verdict is at most alpha (Holm), smaller
with a positive margin — checked by simulation in tests/evals/test_gate_calibration.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evals.items import CATEGORY_PATTERN
from evals.stats import Comparison, PairedCounts, compare_binary, holm, paired_t

Rate = float


class GateParams(BaseModel):
    """Sampling parameters of the gate's runs (part of the candidate's fingerprint)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float = Field(default=0.0, ge=0, le=2)
    seed: int = 0
    max_tokens: int = Field(default=1024, ge=1, le=131_072)
    top_p: float | None = Field(default=None, gt=0, le=1)

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class OfflineGate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    suites: tuple[str, ...] = Field(min_length=1)
    margins: dict[str, Rate] = Field(default_factory=dict)
    default_margin: Rate | None = Field(default=0.05, ge=0, le=1)
    required_improvements: dict[str, Rate] = Field(default_factory=dict)
    min_pass_rates: dict[str, Rate] = Field(default_factory=dict)
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    min_items: int = Field(default=20, ge=2)
    require_noninferiority: bool = False
    params: GateParams = Field(default_factory=GateParams)
    samples: int = Field(default=1, ge=1, le=100)

    @field_validator("margins", "required_improvements", "min_pass_rates")
    @classmethod
    def _rates(cls, value: dict[str, Rate]) -> dict[str, Rate]:
        for category, rate in value.items():
            if not re.match(CATEGORY_PATTERN, category):
                raise ValueError(f"invalid category name {category!r}")
            if not 0 <= rate <= 1:
                raise ValueError(f"{category}: {rate} is not within [0, 1] (pass-rate points: 0.05 = 5 pts)")
        return value


@dataclass(frozen=True, slots=True)
class CategoryResults:
    """Paired per-item outcomes of one category: for each item, the baseline's and the
    candidate's pass share over their samples (0 or 1 with one sample)."""

    category: str
    baseline: tuple[float, ...]
    candidate: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class CategoryVerdict:
    category: str
    verdict: str
    reason: str
    comparison: Comparison
    margin: float | None
    p_worse_holm: float | None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_json(self) -> dict[str, Any]:
        """JSON-safe (NaN and infinities become null)."""
        c = self.comparison
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in {"category": self.category, "verdict": self.verdict, "reason": self.reason, "n": c.n,
                "baseline": c.baseline, "candidate": c.candidate, "difference": c.difference,
                "ci_lower": c.lower, "ci_upper": c.upper, "p_value": c.p_value, "p_worse": c.p_worse,
                "p_worse_holm": self.p_worse_holm, "p_better": c.p_better, "test": c.test,
                "margin": self.margin, "error": c.error}.items()}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decision:
    passed: bool
    verdict: str  # "pass" | "fail"
    reasons: tuple[str, ...]
    categories: tuple[CategoryVerdict, ...] = field(default_factory=tuple)


def pts(x: float) -> str:
    return f"{x * 100:+.1f} pts".replace("-", "−")


def compare(results: CategoryResults, alpha: float) -> Comparison:
    binary = all(v in (0.0, 1.0) for v in (*results.baseline, *results.candidate))
    if binary:
        counts = PairedCounts.of([v == 1.0 for v in results.baseline], [v == 1.0 for v in results.candidate])
        return compare_binary(counts, alpha)
    return paired_t(results.baseline, results.candidate, alpha)


def _verdict(gate: OfflineGate, r: CategoryResults, c: Comparison, p_holm: float | None) -> tuple[str, str]:
    cat = r.category
    margin = gate.margins.get(cat, gate.default_margin)
    if c.n < gate.min_items or c.error is not None or p_holm is None:
        return "insufficient", f"insufficient: {cat} has {c.n} paired items (needs {gate.min_items})"
    if margin is None:
        return "no_margin", f"no margin declared for {cat}"
    if c.difference < -margin and p_holm < gate.alpha:
        return (
            "forgetting",
            f"forgetting: {cat} {pts(c.difference)} (p={p_holm:.2g}, margin {margin * 100:.1f} pts)",
        )
    floor = gate.min_pass_rates.get(cat)
    if floor is not None and c.candidate < floor:
        return "below_minimum", f"below minimum: {cat} {c.candidate:.1%} < {floor:.1%}"
    need = gate.required_improvements.get(cat)
    if need is not None and not (c.lower > 0 and c.difference >= need):
        return (
            "no_improvement",
            f"no improvement shown: {cat} {pts(c.difference)} (needs +{need * 100:.1f} pts, CI above 0)",
        )
    if gate.require_noninferiority and c.lower <= -margin:
        return (
            "not_noninferior",
            f"non-inferiority not shown: {cat} CI lower bound {pts(c.lower)} ≤ −{margin * 100:.1f} pts",
        )
    return "pass", f"{cat} {pts(c.difference)} [{pts(c.lower)}, {pts(c.upper)}]"


def decide(gate: OfflineGate, results: Sequence[CategoryResults], problems: Sequence[str] = ()) -> Decision:
    """The gate decision. ``problems`` (missing runs, failed calls…) fail it before any statistics."""
    comparisons = [compare(r, gate.alpha) for r in results]
    adjusted = holm([None if c.error else c.p_worse for c in comparisons])
    verdicts = tuple(
        CategoryVerdict(
            r.category, *_verdict(gate, r, c, p), c, gate.margins.get(r.category, gate.default_margin), p
        )
        for r, c, p in zip(results, comparisons, adjusted, strict=True)
    )
    reasons = [*problems, *(v.reason for v in verdicts if not v.passed)]
    if not verdicts and not problems:
        reasons.append("no category to compare")
    passed = not reasons
    return Decision(passed, "pass" if passed else "fail", tuple(reasons), verdicts)


def category_results(
    baseline: Mapping[str, tuple[str, float]], candidate: Mapping[str, tuple[str, float]]
) -> tuple[list[CategoryResults], list[str]]:
    """Pair per-item (category, pass share) of two runs by item id; items present in only
    one run are reported as problems (the comparison must be on the same items)."""
    problems = []
    only = sorted(set(baseline) ^ set(candidate))
    if only:
        problems.append(f"{len(only)} items are in only one run (e.g. {only[0]!r})")
    by_cat: dict[str, tuple[list[float], list[float]]] = {}
    for item in sorted(set(baseline) & set(candidate)):
        cat = baseline[item][0]
        pair = by_cat.setdefault(cat, ([], []))
        pair[0].append(baseline[item][1])
        pair[1].append(candidate[item][1])
    return [CategoryResults(c, tuple(b), tuple(x)) for c, (b, x) in sorted(by_cat.items())], problems
