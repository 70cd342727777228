"""A guardrail's margin: how much worse the candidate may be, and which test checks it.

- **Absolute** (``absolute_margin``, in the metric's unit): the default for event rates
  (errors, fallbacks, thumbs-down per request; proportions of units): +0.01 = one
  percentage point. It stays defined at a control rate of 0, where a relative margin is
  not, and rates are tested with the score test of :mod:`analytics.stats.rate`.
- **Relative** (``margin``): the default for means (latency, tokens): 0.10 = 10% worse than
  the control's mean, tested on the Fieller contrast (:mod:`analytics.stats.harm`).
  Undefined at a control mean of 0: the guardrail then reports an error and the controller
  holds.
- **Rank** (``method: mann_whitney``): a relative margin on the per-batch quantiles of
  request-level samples (quantile metrics such as latency_p95), tested with Mann–Whitney
  and Hodges–Lehmann on the log scale (:mod:`analytics.stats.rank`).
- **Both**: the tolerated harm is max(margin × |control mean|, absolute_margin). Harm is
  shown only when it exceeds both (an intersection-union test: each at the full level);
  non-inferiority when either is shown (each at half the level, a union bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from analytics.report.catalogue import Metric
from contracts.rollout_plan import GuardrailSpec

#: Catalogue ratios of 0/1 events per request (at most one event per request).
RATE_METRICS = frozenset(
    {
        "error_rate",
        "fallback_rate",
        "thumbs_down_rate",
        "thumbs_up_rate",
        "regenerate_rate",
        "copy_rate",
        "continuation_rate",
    }
)
#: Default absolute margin of an event rate: one percentage point.
DEFAULT_RATE_MARGIN = 0.01
#: Default relative margin of a mean without a catalogue guardrail margin.
DEFAULT_MARGIN = 0.10


@dataclass(frozen=True, slots=True)
class Margin:
    relative: float | None
    absolute: float | None
    rate: bool  # tested as a rate of 0/1 events (score test on the difference)
    method: str = "auto"  # "mann_whitney": rank test on request-level samples

    @property
    def kind(self) -> str:
        if self.relative is not None and self.absolute is not None:
            return "max"
        return "relative" if self.relative is not None else "absolute"

    def effective(self, control_mean: float | None) -> float | None:
        """The tolerated harm in the metric's unit at this control mean (None: undefined)."""
        rel = None
        if self.relative is not None and control_mean is not None and control_mean != 0.0:
            rel = self.relative * abs(control_mean)
        if self.absolute is None:
            return rel
        return self.absolute if rel is None else max(rel, self.absolute)

    def spec_text(self) -> str:
        """The margin as the plan states it, before any control mean is known."""
        if self.kind == "absolute":
            return f"+{self.absolute:.4g} absolute"
        if self.kind == "relative":
            return f"{self.relative:.0%} of the control"
        return f"max({self.relative:.0%} of the control, +{self.absolute:.4g})"

    def describe(self, control_mean: float | None) -> str:
        """E.g. ``+0.01 absolute``, ``10% of the control (+41.2)``, ``max(25% × 0.05, 0.01) = +0.0125``."""
        eff = self.effective(control_mean)
        if self.kind == "absolute":
            return f"+{self.absolute:.4g} absolute"
        assert self.relative is not None
        if self.kind == "relative":
            at = "undefined at a control mean of 0" if eff is None else f"+{eff:.4g}"
            return f"{self.relative:.0%} of the control ({at})"
        mean = "?" if control_mean is None else f"{abs(control_mean):.4g}"
        return f"max({self.relative:.0%} × {mean}, {self.absolute:.4g}) = +{eff:.4g}"


def is_rate(spec: GuardrailSpec, metric: Metric) -> bool:
    if spec.rate is not None:
        return spec.rate
    return metric.kind == "proportion" or (metric.builtin and metric.name in RATE_METRICS)


def resolve_margin(spec: GuardrailSpec, metric: Metric) -> Margin:
    """The plan's margin, else the defaults: absolute one point for rates; for means the
    catalogue's guardrail margin, else 10% relative."""
    if spec.method == "mann_whitney":
        relative = spec.margin
        if relative is None:
            relative = metric.margin if metric.guardrail and metric.margin > 0 else DEFAULT_MARGIN
        return Margin(relative, None, False, "mann_whitney")
    rate = is_rate(spec, metric)
    if spec.margin is None and spec.absolute_margin is None:
        if rate:
            return Margin(None, DEFAULT_RATE_MARGIN, True)
        relative = metric.margin if metric.guardrail and metric.margin > 0 else DEFAULT_MARGIN
        return Margin(relative, None, False)
    return Margin(spec.margin, spec.absolute_margin, rate)
