"""One metric compared across variants: the rows of the report's table.

Turns the SQL sufficient statistics of one metric (or its latency histograms) into
:class:`~analytics.report.schema.VariantResult` rows by calling the statistics engine
(``analytics.stats``): Welch lift and CIs, confidence sequences, sequential
non-inferiority for guardrails, CUPED with θ pooled over all variants. Multiple-testing
corrections and verdicts need every row and are applied afterwards (``analytics.report.assembly``).

A comparison the tests cannot support is ``insufficient_data`` (the row's ``error``), with
its point estimates but no interval, p-value or chance to beat control, so it can never be
significant nor fail or pass a guardrail:

- an arm with fewer than ``min_units`` units (default :data:`MIN_TEST_UNITS`, the rollout
  controller's ``min_test_units``): every test here is asymptotic (CLT);
- a zero-width interval: no variation within either arm (e.g. every response of every
  unit equally long) while the means differ; the "interval" is floating-point noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as sps

from analytics.report.catalogue import Metric
from analytics.report.schema import Cuped, ErrorInfo, Guardrail, Interval, Method, Progress, VariantResult
from analytics.stats.bayes import chance_to_beat
from analytics.stats.cuped import CupedTheta, cuped_estimates
from analytics.stats.errors import ErrorCode, finite
from analytics.stats.estimate import VariantEstimate, estimate
from analytics.stats.lift import Interval as StatsInterval
from analytics.stats.lift import welch_lift
from analytics.stats.power import required_sample_size
from analytics.stats.proportion import ProportionTest, proportion_lift
from analytics.stats.quantile import quantile_ci, quantile_diff
from analytics.stats.sequential import DEFAULT_PLANNED_UNITS, sequential_lift, sequential_noninferiority
from analytics.stats.sufficient import SampleStats

_MESSAGES = {
    "empty_variant": "the variant has no units",
    "too_few_units": "fewer than 2 units: no variance estimate",
    "zero_variance": "no variation in the metric: no test is possible",
    "zero_control_mean": "the control's mean is 0: relative lift undefined",
    "zero_denominator": "the ratio's denominator is 0 (nothing to divide by)",
    "no_data": "no observations",
}


# Fewest units per arm for which two constant, equal arms count as a passed guardrail.
MIN_UNITS_CONSTANT_PASS = 100
#: Fewest units per arm for any test (the rollout plan's default ``min_test_units``): the
#: Welch, delta-method and confidence-sequence tests are asymptotic.
MIN_TEST_UNITS = 30
#: An interval narrower than this share of the means is floating-point noise around a
#: constant metric, not information (real data would need ~10¹³ units to get there).
ZERO_WIDTH = 1e-6


def error(code: str, message: str | None = None) -> ErrorInfo:
    return ErrorInfo(code=code, message=message or _MESSAGES.get(code, code))


def direction_of(metric: Metric) -> str:
    return "increase" if metric.direction == "higher_is_better" else "decrease"


@dataclass(frozen=True, slots=True)
class CompareOptions:
    alpha: float = 0.05
    power: float = 0.8
    mde: float = 0.05  # relative minimum detectable effect for the progress figures
    # Units (both arms together) the experiment plans to collect: tunes the confidence
    # sequences, and is when a fixed-horizon test (quantile guardrails) becomes valid.
    planned_units: int = DEFAULT_PLANNED_UNITS
    min_units: int = MIN_TEST_UNITS  # per arm, for any test
    # The experiment has stopped: this look is its last, so fixed-horizon tests are valid.
    final_look: bool = False
    # Conventions (docs/statistics.md): CUPED θ pooled across arms (default), by pooled sums,
    # or per arm; two-proportion test Welch (default) or pooled z with a Wald interval.
    cuped_theta: str = CupedTheta.POOLED.value
    proportion_test: str = ProportionTest.WELCH.value


def too_few_units(n_control: int, n_candidate: int, opts: CompareOptions) -> ErrorInfo | None:
    if min(n_control, n_candidate) >= opts.min_units:
        return None
    return error(
        "insufficient_data",
        f"{n_control} control and {n_candidate} candidate units: the tests need at least "
        f"{opts.min_units} per arm",
    )


def zero_width(control: VariantEstimate, treatment: VariantEstimate) -> bool:
    """No variation left to test: both arms' standard errors are noise next to their means."""
    scale = max(abs(control.mean or 0.0), abs(treatment.mean or 0.0))
    se = ((control.variance or 0.0) + (treatment.variance or 0.0)) ** 0.5
    return scale > 0.0 and 2.0 * se <= ZERO_WIDTH * scale


_ZERO_WIDTH_MESSAGE = (
    "zero-width interval: no variation within either arm, so no test is possible; "
    "the difference is shown but cannot be significant"
)


def _iv(i: StatsInterval | None) -> Interval | None:
    return None if i is None else Interval(lower=i.lower, upper=i.upper)


def _good(value: float, direction: str) -> float:
    return value if direction == "increase" else -value


def _bayes(
    c: VariantEstimate, t: VariantEstimate, direction: str, relative: bool
) -> tuple[float | None, float | None]:
    res = chance_to_beat(c, t, direction, relative=relative)
    return res.chance_to_beat_control, res.risk_treatment


def required_units(control: VariantEstimate, kind: str, opts: CompareOptions) -> int | None:
    """Units per variant to detect a relative ``mde`` with ``power`` (50/50 split)."""
    if control.mean is None or control.mean == 0.0:
        return None
    res = required_sample_size(control.mean, opts.mde, kind, control.unit_variance, opts.alpha, opts.power)
    return res.n_control


def _progress(units: int, control: VariantEstimate, kind: str, opts: CompareOptions) -> Progress:
    req = required_units(control, kind, opts)
    if req is None:
        return Progress(units=units, required=None, fraction=None, mde=opts.mde, power=opts.power,
                        error=error("no_data", "the control has no usable mean/variance yet"))  # fmt: skip
    return Progress(units=units, required=req, fraction=min(1.0, units / req), mde=opts.mde, power=opts.power)


def _guardrail(metric: Metric, c: VariantEstimate, t: VariantEstimate, opts: CompareOptions) -> Guardrail:
    direction = direction_of(metric)
    if (few := too_few_units(c.n, t.n, opts)) is not None:
        return Guardrail(outcome="inconclusive", margin=metric.margin, bound=None, error=few)
    res = sequential_noninferiority(c, t, metric.margin, direction, opts.alpha, opts.planned_units)
    if res.error == "zero_variance" and c.mean == t.mean and min(c.n, t.n) >= MIN_UNITS_CONSTANT_PASS:
        # Both arms constant and equal (e.g. not one error anywhere): no test is possible,
        # but the candidate is plainly not worse; without this it could never ship.
        return Guardrail(outcome="pass", margin=metric.margin, bound=0.0,
                         error=error("zero_variance", "both variants are constant and equal"))  # fmt: skip
    if res.error is not None:
        return Guardrail(outcome="inconclusive", margin=metric.margin, bound=None,
                         error=error(str(res.error), res.message))  # fmt: skip
    outcome = "fail" if res.reject_harm else "pass" if res.noninferior else "inconclusive"
    # harm is the lift in the bad direction; report the bound as a relative lift. The bound
    # can be missing (control mean too uncertain to bound a relative harm) while the harm
    # test itself still rejects: the verdict must not hide that.
    bound = None if res.harm_upper is None else -res.harm_upper if direction == "increase" else res.harm_upper
    return Guardrail(outcome=outcome, margin=metric.margin, bound=bound, p_value=res.p_value_harm)


def compare_metric(
    metric: Metric,
    stats: Mapping[str, SampleStats],
    variants: Sequence[str],
    control: str,
    opts: CompareOptions,
    previous_p: Mapping[tuple[str, str], float] | None = None,
) -> list[VariantResult]:
    """Rows for every variant (control first) of a mean/proportion/ratio metric."""
    empty = SampleStats(n=0, sum_x=0.0, sum_x2=0.0)
    ordered = [control, *[v for v in variants if v != control]]
    sample = [stats.get(v, empty) for v in ordered]
    kind = metric.kind
    pooled_z = kind == "proportion" and opts.proportion_test == ProportionTest.POOLED_Z
    cup = cuped_estimates(sample, kind, theta=opts.cuped_theta)
    # The pooled z (χ²) is a test of raw counts: no CUPED with it.
    applied = cup.applied and not pooled_z
    adjusted = cup.estimates if applied else tuple(estimate(s, kind) for s in sample)
    raw = cup.unadjusted
    cuped = None
    if applied and cup.variance_reduction is not None and (cup.theta is not None or cup.thetas):
        covered = sum(s.n for s in sample)
        cuped = Cuped(
            theta=cup.theta, variance_reduction=cup.variance_reduction, covered_units=covered,
            convention=CupedTheta(opts.cuped_theta).value, thetas=list(cup.thetas),
        )  # fmt: skip
    c_adj = adjusted[0]
    rows: list[VariantResult] = []
    for name, s, r, a in zip(ordered, sample, raw, adjusted, strict=True):
        base = {
            "metric": metric.name, "variant": name, "is_control": name == control, "units": s.n,
            "mean": r.mean, "std_error": finite(r.std_error), "numerator": s.sum_x,
            "denominator": s.sum_y if kind == "ratio" else float(s.n),
        }  # fmt: skip
        if r.error is not None:
            rows.append(VariantResult(**base, error=error(str(r.error), r.message)))
            continue
        if name == control:
            rows.append(VariantResult(**base))
            continue
        counts = (sample[0], s) if pooled_z else None
        rows.append(_candidate_row(metric, base, c_adj, a, cuped, opts, previous_p, counts))
    return rows


def _candidate_row(
    metric: Metric,
    base: dict[str, object],
    c: VariantEstimate,
    t: VariantEstimate,
    cuped: Cuped | None,
    opts: CompareOptions,
    previous_p: Mapping[tuple[str, str], float] | None,
    counts: tuple[SampleStats, SampleStats] | None = None,
) -> VariantResult:
    """``counts``: the arms' raw sums, for the pooled two-proportion z (else Welch on ``c``, ``t``)."""
    direction = direction_of(metric)
    fixed = (
        welch_lift(c, t, opts.alpha) if counts is None else proportion_lift(*counts, opts.alpha, "pooled_z")
    )
    method = Method(
        test="welch_t" if counts is None else "pooled_z", interval="welch_t" if counts is None else "wald_z",
        planned_units=opts.planned_units, cuped="none" if cuped is None else cuped.convention,
    )  # fmt: skip
    progress = _progress(min(c.n, t.n), c, metric.kind, opts)
    insufficient = too_few_units(c.n, t.n, opts)
    flat = fixed.error == ErrorCode.ZERO_VARIANCE or (fixed.error is None and zero_width(c, t))
    if insufficient is None and flat and c.mean != t.mean:
        insufficient = error("insufficient_data", _ZERO_WIDTH_MESSAGE)
    if insufficient is not None and c.mean is not None and t.mean is not None:
        # Point estimates only: nothing here may look like evidence.
        diff = t.mean - c.mean
        guard = None
        if metric.guardrail:
            guard = Guardrail(outcome="inconclusive", margin=metric.margin, bound=None, error=insufficient)
        return VariantResult(
            **base, lift_absolute=diff, lift_relative=diff / abs(c.mean) if c.mean else None,
            better=_good(diff, direction) > 0 if diff != 0 else None, guardrail=guard, progress=progress,
            error=insufficient,
        )  # fmt: skip
    seq = sequential_lift(c, t, opts.alpha, opts.planned_units)
    if fixed.error is not None or fixed.absolute is None:
        guard = _guardrail(metric, c, t, opts) if metric.guardrail else None
        return VariantResult(
            **base, progress=progress, guardrail=guard, error=error(str(fixed.error), fixed.message),
            method=method,
        )  # fmt: skip
    chance, loss = _bayes(c, t, direction, relative=fixed.relative is not None)
    p_seq = seq.absolute.p_value if seq.absolute is not None else None
    if p_seq is not None and previous_p:
        # mSPRT p-values are valid as a running minimum over looks (snapshots).
        prev = previous_p.get((metric.name, str(base["variant"])))
        p_seq = min(p_seq, prev) if prev is not None else p_seq
    rel_err = error(str(fixed.relative_error)) if fixed.relative_error is not None else None
    return VariantResult(
        **base,
        lift_absolute=fixed.absolute.estimate,
        lift_relative=fixed.relative.estimate if fixed.relative else None,
        ci_absolute=_iv(fixed.absolute),
        ci_relative=_iv(fixed.relative),
        sequential_ci_absolute=_iv(seq.absolute),
        sequential_ci_relative=_iv(seq.relative),
        p_value=fixed.absolute.p_value,
        p_value_sequential=p_seq,
        better=_good(fixed.absolute.estimate, direction) > 0 if fixed.absolute.estimate != 0 else None,
        chance_to_beat_control=chance,
        expected_loss=loss,
        guardrail=_guardrail(metric, c, t, opts) if metric.guardrail else None,
        cuped=cuped,
        progress=progress,
        error=rel_err,
        method=method,
    )


def compare_quantile(
    metric: Metric,
    hist: Mapping[str, Sequence[tuple[int, int]]],
    units: Mapping[str, int],
    variants: Sequence[str],
    control: str,
    opts: CompareOptions,
) -> list[VariantResult]:
    """Rows for a quantile metric from request-level log-bucketed histograms.

    CIs are the engine's order-statistic intervals, which treat requests as independent
    (heavy users can make them too narrow), so quantile guardrails are fixed-horizon.
    """
    q = float(metric.q or 0.5)
    direction = direction_of(metric)
    ordered = [control, *[v for v in variants if v != control]]
    counts = {v: dict(hist.get(v, ())) for v in ordered}
    rows: list[VariantResult] = []
    for v in ordered:
        base = {"metric": metric.name, "variant": v, "is_control": v == control, "units": units.get(v, 0),
                "denominator": float(sum(counts[v].values()))}  # fmt: skip
        own = quantile_ci(counts[v], q, opts.alpha)
        if own.error is not None:
            rows.append(VariantResult(**base, mean=None, error=error(str(own.error), own.message)))
            continue
        if v == control:
            rows.append(VariantResult(**base, mean=own.estimate, std_error=own.std_error))
            continue
        d = quantile_diff(counts[control], counts[v], q, opts.alpha)
        if d.error is not None or d.absolute is None:
            rows.append(VariantResult(**base, mean=own.estimate, std_error=own.std_error,
                                      error=error(str(d.error or "no_data"), d.message)))  # fmt: skip
            continue
        insufficient = too_few_units(units.get(control, 0), units.get(v, 0), opts)
        width = d.absolute.upper - d.absolute.lower
        if (
            insufficient is None
            and width <= ZERO_WIDTH * max(abs(own.estimate or 0.0), 1e-12)
            and d.absolute.estimate
        ):
            insufficient = error("insufficient_data", _ZERO_WIDTH_MESSAGE)
        if insufficient is not None:
            rel_est = d.relative.estimate if d.relative else None
            guard = None
            if metric.guardrail:
                guard = Guardrail(outcome="inconclusive", margin=metric.margin, bound=None,
                                  test="fixed_horizon", error=insufficient)  # fmt: skip
            rows.append(VariantResult(**base, mean=own.estimate, std_error=own.std_error,
                                      lift_absolute=d.absolute.estimate, lift_relative=rel_est,
                                      better=_good(d.absolute.estimate, direction) > 0 if d.absolute.estimate else None,
                                      guardrail=guard, error=insufficient))  # fmt: skip
            continue
        rel = d.relative
        effect = rel or d.absolute
        chance = finite(float(sps.norm.cdf(_good(effect.estimate, direction) / effect.std_error)))
        guard = None
        if metric.guardrail and rel is not None:
            n_both = units.get(control, 0) + units.get(v, 0)
            guard = _fixed_horizon_guardrail(metric, rel, direction, n_both, opts)
        rows.append(
            VariantResult(
                **base, mean=own.estimate, std_error=own.std_error,
                lift_absolute=d.absolute.estimate, lift_relative=rel.estimate if rel else None,
                ci_absolute=_iv(d.absolute), ci_relative=_iv(rel), p_value=d.absolute.p_value,
                better=_good(d.absolute.estimate, direction) > 0 if d.absolute.estimate else None,
                chance_to_beat_control=chance, guardrail=guard,
            )
        )  # fmt: skip
    return rows


def _fixed_horizon_guardrail(
    metric: Metric, rel: StatsInterval, direction: str, n_both: int, opts: CompareOptions
) -> Guardrail:
    """Non-inferiority from a fixed-horizon interval: valid only at the planned look.

    Looking at it before the planned sample and stopping on a "fail" is peeking (the
    false-alarm rate grows with every look), so until then it is shown, never acted on.
    """
    harm_hi = -rel.lower if direction == "increase" else rel.upper
    harm_lo = -rel.upper if direction == "increase" else rel.lower
    outcome = "pass" if harm_hi < metric.margin else "fail" if harm_lo > metric.margin else "inconclusive"
    bound = rel.lower if direction == "increase" else rel.upper
    if opts.final_look or n_both >= opts.planned_units:
        return Guardrail(outcome=outcome, margin=metric.margin, bound=bound, test="fixed_horizon")
    says = {"fail": "would fail", "pass": "would pass", "inconclusive": "is inconclusive"}[outcome]
    why = error(
        "not_yet_valid",
        f"fixed-horizon, not yet valid: {n_both:,} of {opts.planned_units:,} planned units; the "
        f"interval {says} at this look, which counts only at the planned sample or once the "
        "experiment stops",
    )
    return Guardrail(
        outcome="inconclusive", margin=metric.margin, bound=bound, test="fixed_horizon", error=why
    )
