"""Sufficient statistics: what SQL aggregates hand to the statistics engine.

Per variant, over randomisation units i = 1..n, with a per-unit value x_i (the metric's
numerator), optionally a per-unit denominator y_i (ratio metrics, e.g. requests) and a
per-unit pre-period covariate c_i (CUPED). Everything the tests need is a function of
these sums, so a report's cost grows with variants, not with events.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    # CUPED covariate c: the unit's pre-period value (0 for a unit without history).
    sum_c: float = 0.0
    sum_c2: float = 0.0
    sum_xc: float = 0.0
    sum_yc: float = 0.0

    def __post_init__(self) -> None:
        # SQL drivers hand back Decimal (sums of integers) and tests numpy scalars: store
        # plain floats so the arithmetic downstream is IEEE floats with no warnings.
        object.__setattr__(self, "n", int(self.n))
        for name in _SUM_FIELDS:
            value = getattr(self, name)
            if type(value) is not float:
                object.__setattr__(self, name, float(value))

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

    @property
    def mean_y(self) -> float:
        return self.sum_y / self.n if self.n else 0.0

    @property
    def mean_c(self) -> float:
        return self.sum_c / self.n if self.n else 0.0

    def _cov(self, s_a: float, s_b: float, s_ab: float) -> float:
        if self.n < 2:
            return 0.0
        return (s_ab - s_a * s_b / self.n) / (self.n - 1)

    @property
    def var_y(self) -> float:
        return max(0.0, self._cov(self.sum_y, self.sum_y, self.sum_y2))

    @property
    def var_c(self) -> float:
        return max(0.0, self._cov(self.sum_c, self.sum_c, self.sum_c2))

    @property
    def cov_xy(self) -> float:
        return self._cov(self.sum_x, self.sum_y, self.sum_xy)

    @property
    def cov_xc(self) -> float:
        return self._cov(self.sum_x, self.sum_c, self.sum_xc)

    @property
    def cov_yc(self) -> float:
        return self._cov(self.sum_y, self.sum_c, self.sum_yc)

    @property
    def has_covariate(self) -> bool:
        return self.sum_c2 > 0.0

    @classmethod
    def from_values(
        cls,
        x: Iterable[float],
        y: Iterable[float] | None = None,
        c: Iterable[float] | None = None,
    ) -> SampleStats:
        """Sums of per-unit values (tests, small in-memory data); SQL does this in production."""
        xs = [float(v) for v in x]
        n = len(xs)
        ys = [float(v) for v in y] if y is not None else [0.0] * n
        cs = [float(v) for v in c] if c is not None else [0.0] * n
        if len(ys) != n or len(cs) != n:
            raise ValueError("x, y and c must have one value per unit")
        return cls(
            n=n,
            sum_x=sum(xs),
            sum_x2=sum(v * v for v in xs),
            sum_y=sum(ys),
            sum_y2=sum(v * v for v in ys),
            sum_xy=sum(a * b for a, b in zip(xs, ys, strict=True)),
            sum_c=sum(cs),
            sum_c2=sum(v * v for v in cs),
            sum_xc=sum(a * b for a, b in zip(xs, cs, strict=True)),
            sum_yc=sum(a * b for a, b in zip(ys, cs, strict=True)),
        )


_SUM_FIELDS = ("sum_x", "sum_x2", "sum_y", "sum_y2", "sum_xy", "sum_c", "sum_c2", "sum_xc", "sum_yc")
