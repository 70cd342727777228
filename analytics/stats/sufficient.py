"""Sufficient statistics: what SQL aggregates hand to the statistics engine.

Per variant, over randomisation units i = 1..n, with a per-unit value x_i (the metric's
numerator), optionally a per-unit denominator y_i (ratio metrics, e.g. requests) and a
per-unit pre-period covariate c_i (CUPED). Everything the tests need is a function of
these sums, so a report's cost grows with variants, not with events.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SampleStats:
    """Sums over units of x (and y, c when present). ``y`` sums are for ratio metrics."""

    n: int
    sum_x: float
    sum_x2: float
    sum_y: float = 0.0
    sum_y2: float = 0.0
    sum_xy: float = 0.0
    # CUPED covariate c (pre-period value of the same metric); n_c units had one.
    sum_c: float = 0.0
    sum_c2: float = 0.0
    sum_xc: float = 0.0
    sum_yc: float = 0.0

    def __add__(self, other: SampleStats) -> SampleStats:
        return SampleStats(
            n=self.n + other.n,
            sum_x=self.sum_x + other.sum_x,
            sum_x2=self.sum_x2 + other.sum_x2,
            sum_y=self.sum_y + other.sum_y,
            sum_y2=self.sum_y2 + other.sum_y2,
            sum_xy=self.sum_xy + other.sum_xy,
            sum_c=self.sum_c + other.sum_c,
            sum_c2=self.sum_c2 + other.sum_c2,
            sum_xc=self.sum_xc + other.sum_xc,
            sum_yc=self.sum_yc + other.sum_yc,
        )

    @property
    def mean_x(self) -> float:
        return self.sum_x / self.n if self.n else 0.0

    @property
    def var_x(self) -> float:
        """Unbiased sample variance of x (0 when n < 2)."""
        if self.n < 2:
            return 0.0
        return max(0.0, (self.sum_x2 - self.sum_x * self.sum_x / self.n) / (self.n - 1))
