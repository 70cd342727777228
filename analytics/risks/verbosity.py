"""Verbosity without gain: longer answers, and whether users got anything besides length.

Two parts (``docs/rl-risks.md`` has the formulas):

* **length shift** — completion tokens per response, a ratio metric per unit (delta
  method), candidate − control with always-valid evidence; ``longer`` when the one-sided
  p-value of "longer" is ≤ α.
* **length decomposition** — the control curve length → outcome per category
  (:mod:`analytics.risks.curve`) splits the candidate's outcome lift into the part its
  length predicts and a residual.

Alarms (each is evidence *for* the bad case, so an honest candidate trips it with
probability ≤ α):

* ``gain_is_length``: responses are significantly longer **and** the residual's one-sided
  upper bound is ≤ ``residual_margin`` (users got nothing beyond what length buys);
* ``no_gain``: responses are significantly longer **and** the total lift's one-sided upper
  bound is ≤ 0 (users are not better off at all).
"""

from __future__ import annotations

from dataclasses import dataclass

from analytics.risks.curve import Cells, Decomposition, residual_decomposition
from analytics.risks.evidence import Evidence, evidence
from analytics.stats import DEFAULT_PLANNED_UNITS, ErrorCode, MetricKind, SampleStats, estimate


@dataclass(frozen=True, slots=True)
class LengthShift:
    """Completion tokens per response: control, candidate, absolute and relative shift."""

    control: float | None
    candidate: float | None
    shift: Evidence | None
    relative: float | None
    longer: bool
    error: ErrorCode | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class VerbosityResult:
    length: LengthShift
    decomposition: Decomposition
    residual_margin: float
    alpha: float
    gain_is_length: bool
    no_gain: bool

    @property
    def alarm(self) -> bool:
        return self.gain_is_length or self.no_gain


def length_shift(
    control: SampleStats,
    candidate: SampleStats,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
) -> LengthShift:
    """``x`` = a unit's completion tokens, ``y`` = its responses (a ratio metric)."""
    c, t = estimate(control, MetricKind.RATIO), estimate(candidate, MetricKind.RATIO)
    if not (c.ok and t.ok):
        bad = c if not c.ok else t
        return LengthShift(c.mean, t.mean, None, None, False, bad.error, bad.message)
    mc, mt = float(c.mean or 0.0), float(t.mean or 0.0)
    ev = evidence(
        mt - mc, float(c.variance or 0.0) + float(t.variance or 0.0), c.n + t.n, alpha, planned_units
    )
    if ev is None:
        return LengthShift(mc, mt, None, None, False, ErrorCode.ZERO_VARIANCE, "lengths do not vary")
    relative = (mt - mc) / mc if mc > 0.0 else None
    return LengthShift(mc, mt, ev, relative, ev.p_above <= alpha)


def verbosity(
    length_control: SampleStats,
    length_candidate: SampleStats,
    cells: Cells,
    alpha: float = 0.05,
    planned_units: int = DEFAULT_PLANNED_UNITS,
    residual_margin: float = 0.0,
    replicates: int = 200,
    seed: int = 0,
) -> VerbosityResult:
    """The length guardrail and the decomposition of one outcome metric (``cells`` binned
    with :func:`analytics.risks.curve.length_bin`). A part that cannot be computed never
    raises an alarm by itself; its ``error`` says why (the report shows it)."""
    shift = length_shift(length_control, length_candidate, alpha, planned_units)
    dec = residual_decomposition(cells, alpha, planned_units, replicates, seed)
    gain_is_length = no_gain = False
    if shift.longer and dec.residual is not None and dec.total is not None:
        gain_is_length = dec.residual.upper_one_sided <= residual_margin
        no_gain = dec.total.upper_one_sided <= 0.0
    return VerbosityResult(shift, dec, residual_margin, alpha, gain_is_length, no_gain)
