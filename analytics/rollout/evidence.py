"""The evidence for one look at a rollout stage: guardrail tests, success metrics, SRM.

Pure functions over sufficient statistics (no I/O). Each guardrail is one-sided and
always-valid (valid at every look simultaneously, by Ville's inequality), with two levels:

- **harm** (roll back) at ``alpha``: the always-valid lower bound of the harm exceeds the
  margin. Event rates with an absolute margin use the score test on the difference
  (:func:`analytics.stats.sequential_rate_noninferiority`, defined at a control rate of 0);
  everything else the mean test (:func:`analytics.stats.sequential_noninferiority`, relative
  margins on the Fieller contrast). See :mod:`analytics.rollout.margins`.
- **non-inferior** (may be promoted) at ``alpha_noninferiority``: the always-valid upper
  bound of the harm is below the margin.

A quantile guardrail with ``method: mann_whitney`` is a rank test on request-level samples
(:func:`check_rank_guardrail`): the per-batch quantiles of whole units (20 batches by a hash
of the unit) of the candidate against the control's, one-sided on the log scale with a
relative margin (Mann–Whitney, Hodges–Lehmann bounds). It is fixed-horizon, so the
controller judges it once the stage's minimums are met, not at every look.

A guardrail is *tested* only when both variants have ``min_test_units`` units and the test
ran; otherwise its outcome is ``no_data``, ``insufficient_data`` or ``error`` and ``lacking``
says what is missing — never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from analytics.report.catalogue import Metric
from analytics.report.risks_schema import RlRisks
from analytics.rollout.margins import Margin
from analytics.stats import (
    Direction,
    ErrorCode,
    GroupSequentialGuardrail,
    MetricKind,
    SampleStats,
    SequentialGuardrail,
    batch_quantiles,
    estimate,
    group_sequential_noninferiority,
    group_sequential_rate_noninferiority,
    mann_whitney_guardrail,
    sequential_lift,
    sequential_noninferiority,
    sequential_rate_noninferiority,
    sequential_srm,
)
from contracts.rollout_plan import RlRiskRules

Outcome = Literal["harm", "noninferior", "inconclusive", "no_data", "insufficient_data", "error"]
TESTED: frozenset[str] = frozenset({"harm", "noninferior", "inconclusive"})


@dataclass(frozen=True, slots=True)
class GuardrailCheck:
    """One guardrail at one look.

    ``harm``, ``lower``, ``upper`` and ``margin`` share one scale, ``harm_scale``: absolute
    (metric units) for absolute and max(relative, absolute) margins, relative (0.1 = 10%
    worse) for relative ones. ``margin`` is the tolerated harm in force at this look
    (``margin_text`` says how it was formed); ``lower`` is at ``alpha``, ``upper`` at
    ``alpha_noninferiority``. ``lacking`` names what keeps an untested guardrail from being
    tested. ``relative`` holds the relative test's numbers when the margin is max(…).
    """

    metric: str
    outcome: Outcome
    margin: float | None
    alpha: float
    direction: str
    n_control: int
    n_candidate: int
    control_mean: float | None = None
    candidate_mean: float | None = None
    harm: float | None = None
    lower: float | None = None
    upper: float | None = None
    p_value: float | None = None
    message: str | None = None
    harm_scale: str = "relative"
    test: str = "mean"
    relative_margin: float | None = None
    absolute_margin: float | None = None
    margin_text: str = ""
    alpha_noninferiority: float | None = None
    min_test_units: int = 0
    lacking: str | None = None
    relative: dict[str, float | None] | None = None
    # How the numbers were produced: {"mode": "always_valid"} or the group-sequential look
    # (see :func:`check_group_guardrail`); None for the fixed-horizon rank test.
    sequential: dict[str, Any] | None = None

    @property
    def tested(self) -> bool:
        return self.outcome in TESTED

    def evidence(self) -> dict[str, Any]:
        return {**asdict(self), "tested": self.tested}

    @classmethod
    def from_evidence(cls, data: Mapping[str, Any]) -> GuardrailCheck:
        """The check recorded in a decision's evidence (a group look's outcome carried over)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, slots=True)
class SuccessCheck:
    """A success metric's always-valid relative lift (reported, never gating)."""

    metric: str
    n_control: int
    n_candidate: int
    lift: float | None
    lower: float | None
    upper: float | None
    p_value: float | None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class SrmLook:
    flagged: bool
    p_value: float | None
    counts: dict[str, int]
    weights: dict[str, float]
    message: str | None = None


def _kind(metric: Metric) -> MetricKind:
    return MetricKind(metric.kind)


def _direction(metric: Metric) -> Direction:
    return Direction.INCREASE if metric.direction == "higher_is_better" else Direction.DECREASE


def _mean(stats: SampleStats, kind: MetricKind) -> float | None:
    est = estimate(stats, kind)
    return est.mean


def _lacking_units(nc: int, nt: int, need: int) -> str:
    return ", ".join(f"{n}/{need} {arm} units" for arm, n in (("control", nc), ("candidate", nt)) if n < need)


def _error_text(res: SequentialGuardrail | GroupSequentialGuardrail) -> str:
    if res.error is ErrorCode.ZERO_CONTROL_MEAN:
        return "control mean 0, relative margin undefined"
    if res.error is ErrorCode.ZERO_VARIANCE:
        return "no variance in either variant (every unit has the same value): no test possible"
    return res.message or str(res.error)


def check_guardrail(
    metric: Metric,
    margin: Margin,
    control: SampleStats | None,
    candidate: SampleStats | None,
    *,
    alpha: float,
    planned_units: int,
    min_test_units: int,
    alpha_noninferiority: float | None = None,
    group: GroupLook | None = None,
) -> GuardrailCheck:
    """Test one guardrail: harm at ``alpha``, non-inferiority at ``alpha_noninferiority``.

    ``group``: test at this group-sequential look instead (Lan–DeMets boundaries at the
    look's information fractions; the same contrasts, Wald/score statistics against c_k).
    """
    direction, kind = _direction(metric), _kind(metric)
    a_ni = alpha if alpha_noninferiority is None else alpha_noninferiority
    nc, nt = (control.n if control else 0), (candidate.n if candidate else 0)
    mc = _mean(control, kind) if control and nc >= 2 else None
    mt = _mean(candidate, kind) if candidate and nt >= 2 else None
    scale = "relative" if margin.kind == "relative" else "absolute"
    test = "rate_score" if margin.rate and margin.absolute is not None else "mean"
    base: dict[str, Any] = {
        "metric": metric.name, "alpha": alpha, "direction": direction.value, "n_control": nc,
        "n_candidate": nt, "control_mean": mc, "candidate_mean": mt, "harm_scale": scale, "test": test,
        "relative_margin": margin.relative, "absolute_margin": margin.absolute,
        "margin_text": margin.describe(mc), "alpha_noninferiority": a_ni, "min_test_units": min_test_units,
        "margin": margin.relative if scale == "relative" else margin.effective(mc),
        "sequential": {"mode": "always_valid"} if group is None else group.public(),
    }  # fmt: skip
    if control is None or candidate is None or min(nc, nt) == 0:
        empty = " and ".join(arm for arm, n in (("control", nc), ("candidate", nt)) if n == 0)
        return GuardrailCheck(**base, outcome="no_data", lacking=f"no {empty} units", message="no data")
    if min(nc, nt) < min_test_units:
        lacking = _lacking_units(nc, nt, min_test_units)
        return GuardrailCheck(**base, outcome="insufficient_data", lacking=lacking,
                              message=f"the test needs {min_test_units} units per variant")  # fmt: skip

    def absolute(level_harm: float, level_ni: float) -> SequentialGuardrail | GroupSequentialGuardrail:
        assert margin.absolute is not None and control is not None and candidate is not None
        if group is not None and test == "rate_score":
            return group_sequential_rate_noninferiority(
                control, candidate, margin.absolute, direction, group.fractions, level_harm, group.spending,
                kind=kind, alpha_noninferiority=level_ni,
            )  # fmt: skip
        if group is not None:
            return group_sequential_noninferiority(
                estimate(control, kind), estimate(candidate, kind), margin.absolute, direction,
                group.fractions, level_harm, group.spending, relative=False, alpha_noninferiority=level_ni,
            )  # fmt: skip
        if test == "rate_score":
            return sequential_rate_noninferiority(
                control, candidate, margin.absolute, direction, level_harm, planned_units,
                kind=kind, alpha_noninferiority=level_ni,
            )  # fmt: skip
        return sequential_noninferiority(
            estimate(control, kind), estimate(candidate, kind), margin.absolute, direction, level_harm,
            planned_units, relative=False, alpha_noninferiority=level_ni,
        )  # fmt: skip

    def relative(level_harm: float, level_ni: float) -> SequentialGuardrail | GroupSequentialGuardrail:
        assert margin.relative is not None and control is not None and candidate is not None
        if group is not None:
            return group_sequential_noninferiority(
                estimate(control, kind), estimate(candidate, kind), margin.relative, direction,
                group.fractions, level_harm, group.spending, relative=True, alpha_noninferiority=level_ni,
            )  # fmt: skip
        return sequential_noninferiority(
            estimate(control, kind), estimate(candidate, kind), margin.relative, direction, level_harm,
            planned_units, relative=True, alpha_noninferiority=level_ni,
        )  # fmt: skip

    if margin.kind == "relative" and mc == 0.0:
        text = "control mean 0, relative margin undefined"
        return GuardrailCheck(**base, outcome="error", lacking=text, message=text)
    extra: dict[str, Any] = {}
    if margin.kind == "absolute":
        res = absolute(alpha, a_ni)
        harm_shown, ni_shown, errors = res.reject_harm, res.noninferior, [res]
    elif margin.kind == "relative":
        res = relative(alpha, a_ni)
        harm_shown, ni_shown, errors = res.reject_harm, res.noninferior, [res]
    else:
        # max(relative, absolute): harm must exceed both (intersection-union, full level each);
        # non-inferiority to either suffices (union: half the level each).
        res, rel = absolute(alpha, a_ni / 2), relative(alpha, a_ni / 2)
        extra["relative"] = {"harm": rel.harm, "lower": rel.harm_lower, "upper": rel.harm_upper,
                             "p_value": rel.p_value_harm}  # fmt: skip
        if rel.error is ErrorCode.ZERO_CONTROL_MEAN:  # max(r × 0, a) = a: the absolute test alone
            harm_shown, ni_shown, errors = res.reject_harm, res.noninferior, [res]
        else:
            harm_shown, ni_shown, errors = (
                res.reject_harm and rel.reject_harm,
                res.noninferior or rel.noninferior,
                [res, rel],
            )
    failed = next((r for r in errors if r.error is not None), None)
    if failed is not None:
        text = _error_text(failed)
        return GuardrailCheck(**base, **extra, outcome="error", lacking=text, message=text)
    outcome: Outcome = "harm" if harm_shown else "noninferior" if ni_shown else "inconclusive"
    if group is not None and isinstance(res, GroupSequentialGuardrail):
        # the per-look adjusted levels this look tested at (the margin's first test's)
        extra["sequential"] = {
            **base["sequential"], "z_bound": res.z_bound, "adjusted_alpha": res.nominal_alpha,
            "z_bound_noninferiority": res.z_bound_noninferiority,
            "adjusted_alpha_noninferiority": res.nominal_alpha_noninferiority,
        }  # fmt: skip
        del base["sequential"]
    return GuardrailCheck(
        **base, **extra, outcome=outcome, harm=res.harm, lower=res.harm_lower, upper=res.harm_upper,
        p_value=res.p_value_harm, message=res.message,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class GroupLook:
    """One group-sequential look: the information fractions of this and every earlier look."""

    fractions: tuple[float, ...]
    spending: str
    looks: int  # planned
    planned_units: int

    def public(self) -> dict[str, Any]:
        return {
            "mode": "group", "spending": self.spending, "look": len(self.fractions), "looks": self.looks,
            "fractions": list(self.fractions), "planned_units": self.planned_units, "carried": False,
        }  # fmt: skip


def look_bin(fraction: float, looks: int) -> int:
    """Which planned look an information fraction has reached (0: none yet; ``looks``: t ≥ 1)."""
    return min(looks, math.floor(fraction * looks + 1e-9))


def check_group_guardrail(
    metric: Metric,
    margin: Margin,
    control: SampleStats | None,
    candidate: SampleStats | None,
    *,
    previous: Mapping[str, Any] | None,
    spending: str,
    looks: int,
    alpha: float,
    planned_units: int,
    min_test_units: int,
    alpha_noninferiority: float | None = None,
) -> GuardrailCheck:
    """A guardrail in a group-sequential plan at one controller look.

    The information fraction is t = (control + candidate units in the window) / planned_units.
    A group look is taken when t reaches the next planned fraction j/K (Lan–DeMets: the
    boundary uses the actual fractions of every look taken, so late or skipped looks keep
    the level); between looks the last look's outcome stands (``previous``, this guardrail's
    check recorded with the last decision of this stage), so decisions change only at
    looks. Before the first look the guardrail is untested. A look whose test cannot run
    (no variance, …) spends nothing and is retried at the next controller look.
    """
    nc, nt = (control.n if control else 0), (candidate.n if candidate else 0)
    t = (nc + nt) / planned_units
    prev_seq = (previous or {}).get("sequential") or {}
    taken: tuple[float, ...] = ()
    if (
        prev_seq.get("mode") == "group"
        and prev_seq.get("spending") == spending
        and prev_seq.get("looks") == looks
    ):
        taken = tuple(float(f) for f in prev_seq.get("fractions") or ())
    done = look_bin(taken[-1], looks) if taken else 0
    group = GroupLook((*taken, min(1.0, t)), spending, looks, planned_units)
    if look_bin(t, looks) > done:
        check = check_guardrail(
            metric, margin, control, candidate, alpha=alpha, planned_units=planned_units,
            min_test_units=min_test_units, alpha_noninferiority=alpha_noninferiority, group=group,
        )  # fmt: skip
        if check.tested:
            return check
        if not taken:  # nothing spent: the look is retried at the next controller look
            seq = {**group.public(), "look": 0, "fractions": [], "units_now": nc + nt}
            return replace(check, sequential=seq)
    if taken and previous is not None:
        carried = GuardrailCheck.from_evidence(previous)
        nxt = None if done >= looks else math.ceil((done + 1) * planned_units / looks)
        why = "the test is over (every planned look taken)" if nxt is None else f"next look at {nxt} units"
        seq = {**prev_seq, "carried": True, "units_now": nc + nt, "next_look_units": nxt}
        return replace(carried, sequential=seq, message=f"outcome of group look {len(taken)}; {why}")
    first = math.ceil(planned_units / looks)
    base = check_guardrail(
        metric, margin, None, None, alpha=alpha, planned_units=planned_units, min_test_units=min_test_units,
        alpha_noninferiority=alpha_noninferiority, group=group,
    )  # fmt: skip
    lacking = f"first group look at {first} units in the stage window (now {nc + nt})"
    seq = {**group.public(), "look": 0, "fractions": [], "units_now": nc + nt, "next_look_units": first}
    return replace(
        base, outcome="insufficient_data", n_control=nc, n_candidate=nt, lacking=lacking,
        message="waiting for the first planned look", sequential=seq,
    )  # fmt: skip


#: A batch's quantile needs this many sampled requests; the test needs this many batches per arm.
MIN_BATCH_REQUESTS = 20
MIN_BATCHES = 10

Samples = tuple[NDArray[np.float64], NDArray[np.int64]]  # values, unit batches


def check_rank_guardrail(
    metric: Metric,
    margin: Margin,
    control: Samples | None,
    candidate: Samples | None,
    *,
    alpha: float,
    alpha_noninferiority: float | None = None,
    due: bool = True,
) -> GuardrailCheck:
    """A quantile guardrail by Mann–Whitney on per-batch quantiles (see the module doc).

    ``due``: the stage's minimums are met. The test is fixed-horizon, so before that the
    guardrail is reported untested (``insufficient_data``) rather than tested at every look.
    """
    direction = _direction(metric)
    a_ni = alpha if alpha_noninferiority is None else alpha_noninferiority
    q = float(metric.q or 0.5)
    empty: Samples = (np.zeros(0), np.zeros(0, dtype=np.int64))
    (xc, bc), (xt, bt) = control or empty, candidate or empty
    qc = batch_quantiles(xc, bc, q, MIN_BATCH_REQUESTS) if len(xc) else np.zeros(0)
    qt = batch_quantiles(xt, bt, q, MIN_BATCH_REQUESTS) if len(xt) else np.zeros(0)
    assert margin.relative is not None
    base: dict[str, Any] = {
        "metric": metric.name, "alpha": alpha, "direction": direction.value, "n_control": len(xc),
        "n_candidate": len(xt), "harm_scale": "relative", "test": "mann_whitney",
        "relative_margin": margin.relative, "margin": margin.relative,
        "control_mean": float(np.quantile(xc, q)) if len(xc) else None,
        "candidate_mean": float(np.quantile(xt, q)) if len(xt) else None,
        "margin_text": f"{margin.relative:.0%} of the control's p{q * 100:g} (rank test)",
        "alpha_noninferiority": a_ni, "min_test_units": MIN_BATCHES,
    }  # fmt: skip
    if not len(xc) or not len(xt):
        empty_arms = " and ".join(arm for arm, n in (("control", len(xc)), ("candidate", len(xt))) if n == 0)
        return GuardrailCheck(
            **base, outcome="no_data", lacking=f"no {empty_arms} samples", message="no data"
        )
    if min(len(qc), len(qt)) < MIN_BATCHES:
        lacking = ", ".join(
            f"{len(b)}/{MIN_BATCHES} {arm} batches of {MIN_BATCH_REQUESTS}+ requests"
            for arm, b in (("control", qc), ("candidate", qt))
            if len(b) < MIN_BATCHES
        )
        return GuardrailCheck(**base, outcome="insufficient_data", lacking=lacking, message="too few batches")
    if not due:
        text = "a rank test (fixed horizon): judged once the stage's minimums are met"
        return GuardrailCheck(**base, outcome="insufficient_data", lacking=text, message=text)
    harm = mann_whitney_guardrail(qc, qt, margin.relative, direction, alpha)
    ni = mann_whitney_guardrail(qc, qt, margin.relative, direction, a_ni, with_bounds=True)
    if harm.error is not None:
        text = harm.message or str(harm.error)
        return GuardrailCheck(**base, outcome="error", lacking=text, message=text)
    outcome: Outcome = "harm" if harm.reject_harm else "noninferior" if ni.noninferior else "inconclusive"
    return GuardrailCheck(
        **base, outcome=outcome, harm=harm.harm, lower=harm.harm_lower, upper=ni.harm_upper,
        p_value=harm.p_value_harm,
    )  # fmt: skip


def check_success(
    metric: Metric,
    control: SampleStats | None,
    candidate: SampleStats | None,
    *,
    alpha: float,
    planned_units: int,
) -> SuccessCheck:
    nc, nt = (control.n if control else 0), (candidate.n if candidate else 0)
    if control is None or candidate is None:
        return SuccessCheck(metric.name, nc, nt, None, None, None, None, "no data")
    res = sequential_lift(
        estimate(control, _kind(metric)), estimate(candidate, _kind(metric)), alpha, planned_units
    )
    rel = res.relative
    if rel is None:
        return SuccessCheck(
            metric.name, nc, nt, None, None, None, None, res.message or str(res.relative_error)
        )
    return SuccessCheck(metric.name, nc, nt, rel.estimate, rel.lower, rel.upper, rel.p_value)


#: The look's SRM check flags when its anytime-valid p-value is at most this.
LOOK_SRM_THRESHOLD = 0.001
#: Dirichlet concentration of the look's check. The controller's SRM guards against broken
#: assignment or lost events — losses of tens of percent of an arm's units — so the prior
#: is wider than the report's default (1,000, tuned for one- or two-point drifts): half the
#: candidate's units lost at a 20% stage is caught after about 330 units instead of 660.
LOOK_SRM_CONCENTRATION = 100.0


def look_srm(
    counts: Mapping[str, int], weights: Mapping[str, float], threshold: float = LOOK_SRM_THRESHOLD
) -> SrmLook:
    """Units tagged with this stage against the stage's weights, anytime-valid.

    The controller evaluates this at every look on growing counts, so a fixed-horizon χ²
    repeated at each look would flag healthy stages far more often than ``threshold``
    (peeking). The Dirichlet–multinomial Bayes factor's p-value (``sequential_srm``) stays
    valid whatever the number of looks: a correct split is flagged in at most ``threshold``
    of stages.
    """
    names = list(weights)
    res = sequential_srm(
        [counts.get(n, 0) for n in names], [weights[n] for n in names], threshold, LOOK_SRM_CONCENTRATION
    )
    stray = sum(v for k, v in counts.items() if k not in weights)
    if stray:
        return SrmLook(True, 0.0, dict(counts), dict(weights), f"{stray} units in unknown variants")
    return SrmLook(res.flagged, res.p_value, dict(counts), dict(weights), res.message)


def guardrail_alpha(plan_alpha: float, guardrails: Sequence[object], families: int = 1) -> float:
    """Bonferroni: each of k guardrails in each of ``families`` stages at alpha/(k·families)
    keeps the chance of any false rollback over the whole rollout ≤ alpha."""
    return plan_alpha / (max(1, len(guardrails)) * max(1, families))


@dataclass(frozen=True, slots=True)
class RiskLook:
    """What the plan's ``rl_risks`` rules see at one look (cumulative data since the start).

    ``breaches``: per-category guardrails over their margin, one line each naming the metric
    and category; ``firing``: (alarm, detail) of the alarms the plan acts on that fire;
    ``untested``: the plan's category guardrails with no category tested yet."""

    breaches: tuple[str, ...]
    breached_categories: tuple[str, ...]
    firing: tuple[tuple[str, str], ...]
    untested: bool
    unevaluated: tuple[str, ...]  # alarms the plan acts on whose detector cannot decide yet
    states: dict[str, str]
    on_category_breach: str
    hold_on: tuple[str, ...]
    rollback_on: tuple[str, ...]

    def evidence(self) -> dict[str, Any]:
        return {
            "breaches": list(self.breaches), "categories": list(self.breached_categories),
            "firing": [{"alarm": a, "detail": d} for a, d in self.firing], "untested": self.untested,
            "states": self.states,
        }  # fmt: skip


def _pct(v: float | None) -> str:
    return "none" if v is None else f"{v:+.3g}"


def risk_look(section: RlRisks, rules: RlRiskRules) -> RiskLook:
    """The rules' view of one candidate's RL-risks section (pure)."""
    breaches = []
    categories: list[str] = []
    for g in section.capability.guardrails:
        if g.breached:
            scale = "relative" if g.relative else "absolute"
            breaches.append(
                f"category {g.category}: {g.metric} worse than its {scale} margin {g.margin:g} "
                f"(harm {_pct(g.harm)}, always-valid lower bound {_pct(g.harm_lower)}, Holm p {g.p_holm:.2g})"
            )
            categories.append(g.category)
    acted = set(rules.hold_on) | set(rules.rollback_on)
    firing = tuple((a.name, a.detail or a.name) for a in section.alarms if a.firing and a.name in acted)
    untested = bool(rules.category_guardrails) and not any(
        g.state == "ok" for g in section.capability.guardrails
    )
    return RiskLook(
        breaches=tuple(breaches), breached_categories=tuple(dict.fromkeys(categories)), firing=firing,
        untested=untested, states={a.name: a.state for a in section.alarms},
        unevaluated=tuple(a.name for a in section.alarms if a.name in acted and a.state != "ok"),
        on_category_breach=rules.on_category_breach, hold_on=tuple(rules.hold_on),
        rollback_on=tuple(rules.rollback_on),
    )  # fmt: skip
