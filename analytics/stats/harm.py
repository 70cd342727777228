"""Harm of a candidate on a guardrail, as a linear contrast (Fieller's approach).

harm h = lift in the bad direction: s·(m_t − m_c) with s = +1 for a ``decrease`` metric
(latency, errors) and s = −1 for an ``increase`` metric; relative harm divides by |m_c|.
"h > m" is tested without dividing by the noisy control mean:

    relative:  h > m  ⇔  D(m) = s·m_t − (s + m·σ)·m_c > 0      (σ = sign m_c)
    absolute:  h > m  ⇔  D(m) = s·(m_t − m_c) − m > 0

with Var D(m) = V_t + a(m)²·V_c, a(m) = s + m·σ (relative) or 1 (absolute). D is a
difference of two independent means, so it is close to normal even for rare events,
where the delta-method ratio (m_t − m_c)/|m_c| is skewed (Fieller 1954; Kohavi et al.
2020 ch. 21). Confidence bounds for h are the margins at which the test flips, found
by root finding; one is ``None`` when the control mean is too uncertain to bound it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from scipy import optimize

from analytics.stats.errors import Direction
from analytics.stats.estimate import VariantEstimate

_MAX_DOUBLINGS = 60


@dataclass(frozen=True, slots=True)
class HarmContrast:
    mc: float
    mt: float
    vc: float
    vt: float
    nc: int
    nt: int
    s: float  # +1: a decrease metric (higher is harm), −1: an increase metric
    relative: bool

    @classmethod
    def of(
        cls, control: VariantEstimate, treatment: VariantEstimate, direction: Direction, relative: bool
    ) -> HarmContrast:
        return cls(
            float(control.mean or 0.0),
            float(treatment.mean or 0.0),
            float(control.variance or 0.0),
            float(treatment.variance or 0.0),
            control.n,
            treatment.n,
            1.0 if direction is Direction.DECREASE else -1.0,
            relative,
        )

    @property
    def harm(self) -> float:
        diff = self.s * (self.mt - self.mc)
        return diff / abs(self.mc) if self.relative else diff

    @property
    def scale(self) -> float:
        """A rough standard error of the harm: the first step when searching for bounds."""
        var = self.vt + self.vc
        return math.sqrt(var) / abs(self.mc) if self.relative else math.sqrt(var)

    def _a(self, m: float) -> float:
        return self.s + m * math.copysign(1.0, self.mc) if self.relative else 1.0

    def at(self, m: float) -> tuple[float, float]:
        """(D, Var D) at margin m: D > 0 ⇔ harm > m."""
        a = self._a(m)
        d = self.s * self.mt - a * self.mc if self.relative else self.s * (self.mt - self.mc) - m
        return d, self.vt + a * a * self.vc

    def dof(self, m: float) -> float:
        """Welch–Satterthwaite degrees of freedom of D(m)."""
        a2vc = self._a(m) ** 2 * self.vc
        denom = self.vt * self.vt / max(1, self.nt - 1) + a2vc * a2vc / max(1, self.nc - 1)
        return (self.vt + a2vc) ** 2 / denom if denom > 0.0 else float(self.nc + self.nt - 2)


def flip_point(f: Callable[[float], float], start: float, step: float, sign: float) -> float | None:
    """The margin m where ``f`` changes sign, searching from ``start`` (f(start) < 0)
    towards ``sign`` (−1: below, +1: above) with doubling steps; ``None`` if it never does."""
    lo = start
    step = step if step > 0.0 and math.isfinite(step) else 1.0
    for _ in range(_MAX_DOUBLINGS):
        hi = start + sign * step
        if f(hi) >= 0.0:
            a, b = (hi, lo) if sign < 0 else (lo, hi)
            return float(optimize.brentq(f, a, b, xtol=1e-12 * max(1.0, abs(start))))
        lo = hi
        step *= 2.0
    return None
