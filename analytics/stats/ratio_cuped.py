"""CUPED for ratio metrics with a pre-period numerator AND denominator (GrowthBook's ratio CUPED).

A ratio metric R = Σx/Σy (thumbs-up per response, errors per request) has a per-unit
delta-method linearisation L_i = (x_i − R·y_i)/ȳ (see :mod:`analytics.stats.estimate`). Its
natural covariate is the same ratio in the pre-period, with its own numerator c and
denominator d per unit: R_pre = Σc/Σd and P_i = (c_i − R_pre·d_i)/d̄. Then

    var(L) = (s_x² − 2R·s_xy + R²·s_y²)/ȳ²
    var(P) = (s_c² − 2R_pre·s_cd + R_pre²·s_d²)/d̄²
    cov(L, P) = (s_xc − R_pre·s_xd − R·s_yc + R·R_pre·s_yd)/(ȳ·d̄)

and CUPED proceeds as for a mean with (L, P) in place of (x, c): θ by the chosen convention
(:class:`analytics.stats.cuped.CupedTheta`), adjusted ratio R_v − θ·(R_pre,v − R_pre) with R_pre
the pooled pre-period ratio, adjusted unit variance var(L) − 2θ·cov(L, P) + θ²·var(P). Using both
pre-period sums (not only the numerator) removes the noise of how many requests a unit sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from analytics.stats.cuped import CupedEstimates, CupedTheta
from analytics.stats.errors import NUMERIC_ERRORS, ErrorCode, finite
from analytics.stats.estimate import MetricKind, VariantEstimate, estimate, failed
from analytics.stats.sufficient import SampleStats


@dataclass(frozen=True, slots=True)
class RatioSampleStats:
    """Sums over units of x, y (post numerator/denominator) and c, d (pre-period ones)."""

    n: int
    sum_x: float
    sum_y: float
    sum_c: float
    sum_d: float
    sum_x2: float
    sum_y2: float
    sum_c2: float
    sum_d2: float
    sum_xy: float
    sum_xc: float
    sum_xd: float
    sum_yc: float
    sum_yd: float
    sum_cd: float

    def __add__(self, other: RatioSampleStats) -> RatioSampleStats:
        return RatioSampleStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @classmethod
    def from_values(
        cls, x: Iterable[float], y: Iterable[float], c: Iterable[float], d: Iterable[float]
    ) -> RatioSampleStats:
        xs, ys, cs, ds = ([float(v) for v in a] for a in (x, y, c, d))
        if not len(xs) == len(ys) == len(cs) == len(ds):
            raise ValueError("x, y, c and d must have one value per unit")

        def dot(a: list[float], b: list[float]) -> float:
            return sum(p * q for p, q in zip(a, b, strict=True))

        return cls(
            len(xs), sum(xs), sum(ys), sum(cs), sum(ds),
            dot(xs, xs), dot(ys, ys), dot(cs, cs), dot(ds, ds),
            dot(xs, ys), dot(xs, cs), dot(xs, ds), dot(ys, cs), dot(ys, ds), dot(cs, ds),
        )  # fmt: skip

    def post(self) -> SampleStats:
        """The post-period sums alone, for the unadjusted ratio estimate."""
        return SampleStats(self.n, self.sum_x, self.sum_x2, self.sum_y, self.sum_y2, self.sum_xy)

    def cov(self, s_a: float, s_b: float, s_ab: float) -> float:
        return (s_ab - s_a * s_b / self.n) / (self.n - 1) if self.n >= 2 else 0.0


@dataclass(frozen=True, slots=True)
class _Linearised:
    n: int
    ratio_pre: float
    var_p: float  # var(P)
    cov_lp: float  # cov(L, P)


def _linearise(s: RatioSampleStats, ratio: float) -> _Linearised | None:
    """Pre-period linearisation of one arm; ``None`` when it has no pre-period denominator."""
    if s.n < 2 or s.sum_d == 0.0:
        return None
    rp, y_bar, d_bar = s.sum_c / s.sum_d, s.sum_y / s.n, s.sum_d / s.n
    var_p = (
        s.cov(s.sum_c, s.sum_c, s.sum_c2) - 2.0 * rp * s.cov(s.sum_c, s.sum_d, s.sum_cd)
        + rp * rp * s.cov(s.sum_d, s.sum_d, s.sum_d2)
    ) / (d_bar * d_bar)  # fmt: skip
    cov_lp = (
        s.cov(s.sum_x, s.sum_c, s.sum_xc) - rp * s.cov(s.sum_x, s.sum_d, s.sum_xd)
        - ratio * s.cov(s.sum_y, s.sum_c, s.sum_yc) + ratio * rp * s.cov(s.sum_y, s.sum_d, s.sum_yd)
    ) / (y_bar * d_bar)  # fmt: skip
    return _Linearised(s.n, rp, max(0.0, var_p), cov_lp)


def _ratio_cuped(stats: Sequence[RatioSampleStats], convention: CupedTheta) -> CupedEstimates:
    raw = tuple(estimate(s.post(), MetricKind.RATIO) for s in stats)
    lins = [
        _linearise(s, e.mean) if e.ok and e.mean is not None else None
        for s, e in zip(stats, raw, strict=True)
    ]
    usable = [(s, lin) for s, lin in zip(stats, lins, strict=True) if lin is not None]
    none = (None,) * len(raw)
    if not usable or sum((lin.n - 1) * lin.var_p for _, lin in usable) <= 0.0:
        return CupedEstimates(raw, raw, None, None, False, none, convention)
    pooled_pre = sum(s.sum_c for s, _ in usable) / sum(s.sum_d for s, _ in usable)
    common: float | None = None
    if convention is CupedTheta.POOLED:
        common = sum((lin.n - 1) * lin.cov_lp for _, lin in usable) / sum(
            (lin.n - 1) * lin.var_p for _, lin in usable
        )
    elif convention is CupedTheta.POOLED_SUMS:
        union = usable[0][0]
        for s, _ in usable[1:]:
            union = union + s
        ue = estimate(union.post(), MetricKind.RATIO)
        ul = _linearise(union, ue.mean) if ue.mean is not None else None
        if ul is None or not ul.var_p > 0.0:
            return CupedEstimates(raw, raw, None, None, False, none, convention)
        common = ul.cov_lp / ul.var_p
    adjusted: list[VariantEstimate] = []
    thetas: list[float | None] = []
    before = after = 0.0
    for e, lin in zip(raw, lins, strict=True):
        if lin is None or e.mean is None or e.unit_variance is None:
            adjusted.append(e)
            thetas.append(None)
            continue
        th = common if common is not None else (lin.cov_lp / lin.var_p if lin.var_p > 0.0 else 0.0)
        unit_var = e.unit_variance - 2.0 * th * lin.cov_lp + th * th * lin.var_p
        if unit_var < -1e-9 * max(e.unit_variance, th * th * lin.var_p):
            adjusted.append(failed(e.n, ErrorCode.INVALID_INPUT, "impossible sums: adjusted variance < 0"))
            thetas.append(None)
            continue
        unit_var = max(0.0, unit_var)
        before += (lin.n - 1) * e.unit_variance
        after += (lin.n - 1) * unit_var
        thetas.append(finite(th))
        adjusted.append(VariantEstimate(e.n, e.mean - th * (lin.ratio_pre - pooled_pre), unit_var))
    reduction = 1.0 - after / before if before > 0.0 else None
    return CupedEstimates(
        tuple(adjusted), raw, finite(common), finite(reduction), True, tuple(thetas), convention
    )


def ratio_cuped_estimates(
    stats: Sequence[RatioSampleStats], theta: CupedTheta | str = CupedTheta.POOLED
) -> CupedEstimates:
    """Ratio estimates adjusted with the pre-period ratio's numerator and denominator.

    Arms without a pre-period denominator (Σd = 0) keep their raw estimate; with no
    covariate variance anywhere the raw estimates are returned with ``applied=False``.
    """
    convention = CupedTheta(theta)
    try:
        return _ratio_cuped(stats, convention)
    except NUMERIC_ERRORS:
        raw = tuple(estimate(s.post(), MetricKind.RATIO) for s in stats)
        return CupedEstimates(raw, raw, None, None, False, (None,) * len(raw), convention)
