"""Report assembly: experiment → metric catalogue → SQL sufficient statistics (one pass)
→ statistics engine → :class:`~analytics.report.schema.Report`.

Cost grows with units and segments, never with events: the overall table is one
aggregate query over ``unit_rollups`` (plus the small latency histograms), all tag
segments one more over ``segment_rollups`` (the largest ``max_segments`` are shown), the
time series a bounded read of stored snapshots, and the shadow pairs a bounded join on a
recent window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Connection, text

from analytics.report.aggregate import histograms, unit_counts, variant_stats
from analytics.report.allocation import STAGE_GRACE_S, srm_all_units, srm_rollout, stage_weights
from analytics.report.catalogue import BUILTINS, DEFAULT_METRICS, Metric, MetricError, MetricSpec, parse_spec
from analytics.report.comparison import (
    MIN_TEST_UNITS,
    CompareOptions,
    compare_metric,
    compare_quantile,
    error,
)
from analytics.report.paired import paired_comparisons
from analytics.report.risks import RiskOptions, rl_risks
from analytics.report.risks_schema import RlRisks
from analytics.report.schema import (
    AllocationRow,
    ErrorInfo,
    MetricInfo,
    Report,
    RolloutSection,
    SegmentBreakdown,
    SrmCheck,
    VariantResult,
    Verdict,
)
from analytics.report.segments import segment_stats
from analytics.report.snapshots import load_timeseries, with_current_point
from analytics.risks import Guardrail
from analytics.stats.correction import benjamini_hochberg, holm
from analytics.stats.sequential import DEFAULT_PLANNED_UNITS
from analytics.stats.sufficient import SampleStats
from contracts import offline_gate
from contracts.events import ROLLOUT_STAGE_TAG
from contracts.ngrams import NgramKey, phrase_lookup
from contracts.rollout_plan import RolloutPlanSchema

#: Statuses after which the current look is an experiment's last (fixed-horizon tests valid).
FINAL_STATUSES = frozenset({"stopped", "completed", "rolled_back"})


class PlanMargin(Protocol):
    """A rollout plan's guardrail margin, as the report states it."""

    @property
    def relative(self) -> float | None: ...
    @property
    def kind(self) -> str: ...
    def spec_text(self) -> str: ...


class PlanFacts(Protocol):
    """What the report reads of a rollout plan: its sample sizes and its stages (percent)."""

    @property
    def planned_units(self) -> int: ...
    @property
    def min_test_units(self) -> int: ...
    @property
    def stages(self) -> Sequence[float]: ...


class RolloutPart(Protocol):
    """A rollout's share of its report, computed by the rollout controller's code.

    The rollout package reads this package's aggregates and catalogue, so this package does
    not import it back: the part arrives through :attr:`ReportOptions.rollout`
    (``analytics.rollout.view.report_part``).
    """

    @property
    def plan(self) -> PlanFacts | None: ...
    @property
    def guards(self) -> Sequence[tuple[Metric, PlanMargin]]: ...
    def judge(
        self,
        conn: Connection,
        rows: Sequence[VariantResult],
        stats: Mapping[str, Mapping[str, SampleStats]],
        srm: SrmCheck,
        metrics: Sequence[Metric],
        now: datetime,
        grace_s: float,
    ) -> tuple[list[VariantResult], list[Verdict], RolloutSection]:
        """The table with the controller's guardrail cells, the verdicts, the section."""
        ...


#: ``(conn, experiment_id) -> RolloutPart | None`` (None: not a rollout).
RolloutPartLoader = Callable[[Connection, int], RolloutPart | None]


class RolloutViewMissing(RuntimeError):
    """A rollout experiment's report was asked for without ``ReportOptions.rollout``."""


class _Settings(Protocol):
    alpha: float
    max_segments: int
    max_timeseries_points: int
    max_pairs: int
    paired_window_s: float
    rollout_srm_grace_s: float
    rl_risks: bool
    rl_risks_max_age_s: float
    ngram_key: str | None
    ngram_phrases: str | None


@dataclass(frozen=True, slots=True)
class ReportOptions:
    alpha: float = 0.05
    power: float = 0.8
    mde: float = 0.05
    max_segments: int = 12
    max_timeseries_points: int = 200
    max_pairs: int = 20_000
    paired_window_s: float = 86_400.0
    segments: bool = True
    timeseries: bool = True
    # Units (both arms) an experiment plans to collect; a rollout's plan sets its own.
    planned_units: int = DEFAULT_PLANNED_UNITS
    min_units: int = MIN_TEST_UNITS  # per arm, for any test (a rollout's min_test_units)
    srm_grace_s: float = STAGE_GRACE_S  # the rollout controller's SRM grace after a stage change
    # Conventions of the comparisons (docs/statistics.md): "pooled" | "pooled_sums" | "per_arm",
    # and "welch" | "pooled_z" for proportion metrics.
    cuped_theta: str = "pooled"
    proportion_test: str = "welch"
    # Required for rollout experiments (their verdicts are the controller's): see RolloutPart.
    rollout: RolloutPartLoader | None = None
    # The RL-risk detectors (analytics.report.risks); off: no rl_risks section.
    rl_risks: bool = True
    rl_risks_max_age_s: float = 0.0  # reuse the latest snapshot's section while younger
    judge_score_min: float = 1.0
    judge_score_max: float = 10.0
    # Hashed n-grams: the deployment's key (its rows are read, and phrases hashed with it) and
    # hash → text of the operator's phrase list (contracts.ngrams.phrase_lookup).
    ngram_key: NgramKey | None = None
    phrase_lookup: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, s: _Settings, rollout: RolloutPartLoader | None = None) -> ReportOptions:
        return cls(
            rollout=rollout,
            alpha=s.alpha,
            max_segments=s.max_segments,
            max_timeseries_points=s.max_timeseries_points,
            max_pairs=s.max_pairs,
            paired_window_s=s.paired_window_s,
            srm_grace_s=s.rollout_srm_grace_s,
            rl_risks=s.rl_risks,
            rl_risks_max_age_s=s.rl_risks_max_age_s,
            **ngram_options(s.ngram_key, s.ngram_phrases),
        )

    @property
    def compare(self) -> CompareOptions:
        return CompareOptions(
            alpha=self.alpha, power=self.power, mde=self.mde, planned_units=self.planned_units,
            min_units=self.min_units, cuped_theta=self.cuped_theta, proportion_test=self.proportion_test,
        )  # fmt: skip


def ngram_options(key: str | None, phrases_file: str | None) -> dict[str, Any]:
    """The key and the phrase list's lookup (a bad key or an unreadable list stops the
    service at start: it would otherwise show hashes an operator expects resolved)."""
    if not key:
        if phrases_file:
            raise ValueError("LIFTGATE_NGRAM_PHRASES needs LIFTGATE_NGRAM_KEY (the gateway's key)")
        return {}
    ngram_key = NgramKey(key)
    phrases = Path(phrases_file).read_text(encoding="utf-8").splitlines() if phrases_file else []
    return {
        "ngram_key": ngram_key,
        "phrase_lookup": phrase_lookup(ngram_key, (p for p in phrases if p.strip())),
    }


class ExperimentNotFound(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class _Experiment:
    id: int
    name: str
    route: str
    mode: str
    status: str
    stage: int | None
    started_at: datetime | None
    stage_started_at: datetime | None
    metrics: list[Any]
    variants: list[tuple[str, float, bool]]  # name, weight, is_control
    segment_tags: list[str]  # declared tag keys (rollout_stage is rolled up whether listed or not)

    @property
    def control(self) -> str | None:
        return next((n for n, _, c in self.variants if c), None)


def _load_experiment(conn: Connection, experiment_id: int) -> _Experiment:
    row = conn.execute(
        text(
            "SELECT id, name, route, mode, status, rollout_stage, started_at, stage_started_at, metrics,"
            " segment_tags FROM experiments WHERE id = :id"
        ),
        {"id": experiment_id},
    ).first()
    if row is None:
        raise ExperimentNotFound(f"experiment {experiment_id} not found")
    variants = conn.execute(
        text("SELECT name, weight, is_control FROM variants WHERE experiment_id = :id ORDER BY id"),
        {"id": experiment_id},
    ).all()
    eid, name, route, mode, status, stage, started, stage_started, wanted, tags = row
    return _Experiment(
        id=eid, name=name, route=route, mode=mode, status=status, stage=stage, started_at=started,
        stage_started_at=stage_started, metrics=list(wanted or []),
        variants=[(str(n), float(w), bool(c)) for n, w, c in variants], segment_tags=list(tags or []),
    )  # fmt: skip


def resolve_metrics(conn: Connection, wanted: Sequence[Any]) -> tuple[list[Metric], list[ErrorInfo]]:
    """The experiment's metrics: names (built-in or user-defined) or inline definitions.

    No list means every built-in plus every user definition.
    """
    user: dict[str, Metric] = {}
    errors: list[ErrorInfo] = []
    for name, definition in conn.execute(
        text("SELECT name, definition FROM metric_definitions ORDER BY name")
    ):
        try:
            user[name] = MetricSpec.model_validate(definition).to_metric()
        except ValueError as exc:
            errors.append(error("invalid_metric", f"user metric {name!r}: {exc}"))
    if not wanted:
        return [BUILTINS[n] for n in DEFAULT_METRICS] + list(user.values()), errors
    out: list[Metric] = []
    for item in wanted:
        if isinstance(item, str):
            metric = BUILTINS.get(item) or user.get(item)
            if metric is None:
                errors.append(error("unknown_metric", f"metric {item!r} is not defined"))
            else:
                out.append(metric)
        else:
            try:
                out.append(parse_spec(item))
            except MetricError as exc:
                errors.append(error("invalid_metric", str(exc)))
    return out, errors


def metric_info(m: Metric, mde: float) -> MetricInfo:
    return MetricInfo(
        name=m.name, label=m.description or m.name, kind=m.kind,
        direction="increase" if m.direction == "higher_is_better" else "decrease",
        guardrail=m.guardrail, margin=m.margin if m.guardrail else None, mde=mde, quantile=m.q,
        description=m.description,
    )  # fmt: skip


def _driver(conn: Connection) -> Any:
    """The psycopg connection under ``conn`` (same transaction) for ``analytics.report.aggregate``."""
    return conn.connection.driver_connection


def _overall_stats(
    conn: Connection,
    exp: _Experiment,
    metrics: Sequence[Metric],
    with_covariate: bool,
    failed: dict[str, str],
) -> tuple[dict[str, dict[str, SampleStats]], dict[str, int]]:
    """One pass over ``unit_rollups`` for every non-quantile metric; units per variant.

    A metric the database cannot compute is left out, its reason in ``failed``."""
    plain = [m for m in metrics if m.kind != "quantile"]
    stats = (
        variant_stats(_driver(conn), exp.id, plain, with_covariate=with_covariate, failed=failed)
        if plain
        else {}
    )
    return (stats, _units(stats)) if stats else (stats, unit_counts(_driver(conn), exp.id))


def _units(stats: Mapping[str, Mapping[str, SampleStats]]) -> dict[str, int]:
    for per_variant in stats.values():
        return {v: s.n for v, s in per_variant.items()}
    return {}


def _table(
    conn: Connection, exp: _Experiment, metrics: Sequence[Metric], segment: str, opts: CompareOptions,
    stats: Mapping[str, Mapping[str, SampleStats]], counts: Mapping[str, int],
    previous_p: Mapping[tuple[str, str], float] | None,
) -> list[VariantResult]:  # fmt: skip
    assert exp.control is not None
    names = [n for n, _, _ in exp.variants]
    rows: list[VariantResult] = []
    for m in metrics:
        if m.kind == "quantile":
            hist = histograms(_driver(conn), exp.id, m, segment)
            rows += compare_quantile(m, hist, counts, names, exp.control, opts)
        else:
            rows += compare_metric(m, stats.get(m.name, {}), names, exp.control, opts, previous_p)
    return rows


def apply_corrections(rows: list[VariantResult], alpha: float) -> list[VariantResult]:
    """Holm and BH over every candidate row with a p-value (one family: the whole list)."""
    idx = [i for i, r in enumerate(rows) if not r.is_control and r.p_value is not None]
    holm_p = holm([rows[i].p_value for i in idx])
    bh_p = benjamini_hochberg([rows[i].p_value for i in idx])
    sidx = [i for i, r in enumerate(rows) if not r.is_control and r.p_value_sequential is not None]
    seq_p = holm([rows[i].p_value_sequential for i in sidx])
    out = list(rows)
    for i, ph, pb in zip(idx, holm_p, bh_p, strict=True):
        out[i] = out[i].model_copy(update={"p_holm": ph, "p_bh": pb})
    for i, ps in zip(sidx, seq_p, strict=True):
        out[i] = out[i].model_copy(
            update={"p_sequential_holm": ps, "significant": ps is not None and ps < alpha}
        )
    return out


def verdicts(exp: _Experiment, rows: Sequence[VariantResult], metrics: Sequence[Metric], srm: SrmCheck,
             counts: Mapping[str, int], min_units: int = MIN_TEST_UNITS,
             gates: Mapping[str, offline_gate.GateCheck] | None = None) -> list[Verdict]:  # fmt: skip
    """Each candidate's verdict from the table. ``gates``: each candidate's offline gate check
    (``contracts.offline_gate.check``) when the experiment declares a gate: a candidate the
    gate failed is ``harm`` whatever users say (the gate found a regression the online
    metrics may not measure), and one without a passing decision as configured now is never
    ``ship``."""
    guard = {m.name for m in metrics if m.guardrail}
    out: list[Verdict] = []
    for name, _, is_control in exp.variants:
        if is_control:
            continue
        mine = [r for r in rows if r.variant == name]
        better = sorted(r.metric for r in mine if r.significant and r.better)
        worse = sorted(r.metric for r in mine if r.significant and r.better is False)
        failed = sorted(r.metric for r in mine if r.guardrail and r.guardrail.outcome == "fail")
        pending = sorted(
            r.metric
            for r in mine
            if r.metric in guard and (r.guardrail is None or r.guardrail.outcome != "pass")
        )
        kw: dict[str, Any] = {"variant": name, "better": better, "worse": worse, "failed_guardrails": failed}
        gate = (gates or {}).get(name)
        gate_failed: str | None = None  # why a gate decision failed the candidate
        gate_pending: str | None = None  # why it has no passing decision as configured now
        if gate is not None and gate.required and not gate.passed:
            if gate.decision_id is not None:
                gate_failed = gate.reason
            else:
                gate_pending = gate.reason
        if exp.mode == "shadow":
            out.append(Verdict(**kw, verdict="no_difference_yet",
                               reason="shadow: compare candidate and baseline in the paired comparison"))  # fmt: skip
        elif (n_min := min(counts.get(name, 0), counts.get(exp.control or "", 0))) < min_units:
            out.append(
                Verdict(
                    **kw,
                    verdict="insufficient_data",
                    reason=f"{n_min} units in the smaller arm; the tests need at least {min_units} per arm",
                )
            )
        elif srm.flagged:
            out.append(
                Verdict(
                    **kw,
                    verdict="srm",
                    reason=f"sample ratio mismatch (p={srm.p_value:.2g} < {srm.threshold})",
                )
            )
        elif failed or worse or gate_failed:
            what = ", ".join(
                [
                    *(f"guardrail {m} failed" for m in failed),
                    *(f"{m} worse" for m in worse if m not in failed),
                    *([gate_failed] if gate_failed else []),
                ]
            )
            out.append(Verdict(**kw, verdict="harm", reason=what))
        elif better and not pending and gate_pending:
            why = f"better on {', '.join(better)}; guardrails pass; but {gate_pending}"
            out.append(Verdict(**kw, verdict="no_difference_yet", reason=why))
        elif better and not pending:
            out.append(
                Verdict(**kw, verdict="ship", reason=f"better on {', '.join(better)}; guardrails pass")
            )
        else:
            why = "no significant difference yet"
            if better and pending:
                why = f"better on {', '.join(better)}, but guardrails not yet shown non-inferior: {', '.join(pending)}"
            out.append(Verdict(**kw, verdict="no_difference_yet", reason=why))
    return out


def _previous_sequential_p(conn: Connection, eid: int) -> dict[tuple[str, str], float]:
    rows = conn.execute(
        text(
            """
            SELECT r->>'metric', r->>'variant', (r->>'p_value_sequential')::float8
            FROM (SELECT points FROM analysis_snapshots WHERE experiment_id = :e
                  ORDER BY created_at DESC, id DESC LIMIT 1) s
            CROSS JOIN LATERAL jsonb_array_elements(s.points) r
            WHERE r->>'p_value_sequential' IS NOT NULL
            """
        ),
        {"e": eid},
    )
    return {(m, v): float(p) for m, v, p in rows}


def _has_preperiod(conn: Connection, eid: int) -> bool:
    row = conn.execute(
        text("SELECT EXISTS (SELECT 1 FROM preperiod_rollups WHERE experiment_id = :e)"), {"e": eid}
    )
    return bool(row.scalar_one())


def _segment_tables(conn: Connection, exp: _Experiment, metrics: Sequence[Metric], opts: ReportOptions,
                    compare: CompareOptions, errors: list[ErrorInfo]) -> list[SegmentBreakdown]:  # fmt: skip
    plain = [m for m in metrics if m.kind != "quantile"]
    failed: dict[str, str] = {}
    stats, units = segment_stats(_driver(conn), exp.id, plain, failed)
    errors += [error("metric_failed", f"metric {n!r} in segments: {why}") for n, why in failed.items()]
    metrics = [m for m in metrics if m.name not in failed]
    # Only declared keys (and rollout_stage) are rolled up; rows of a key no longer declared
    # are left from before and not shown.
    shown = {*exp.segment_tags, ROLLOUT_STAGE_TAG}
    names = sorted(
        (s for s in units if s.partition("=")[0] in shown and "=" in s), key=lambda s: (-units[s], s)
    )
    if len(names) > opts.max_segments:
        errors.append(
            error("segments_truncated", f"{len(names)} segments; showing the {opts.max_segments} largest")
        )
        names = names[: opts.max_segments]
    tables: list[tuple[str, list[VariantResult], int]] = []
    for seg in sorted(names):
        per_metric = stats.get(seg, {})
        rows = _table(conn, exp, metrics, seg, compare, per_metric, _units(per_metric), None)
        tables.append((seg, rows, units[seg]))
    # One correction family over metrics × candidates × segments.
    flat = [r for _, rows, _ in tables for r in rows]
    corrected = apply_corrections(flat, opts.alpha)
    out: list[SegmentBreakdown] = []
    pos = 0
    for seg, rows, n_units in tables:
        tag, _, value = seg.partition("=")
        out.append(
            SegmentBreakdown(
                segment=seg, tag=tag, value=value, units=n_units, results=corrected[pos : pos + len(rows)]
            )
        )
        pos += len(rows)
    return out


def _with_plan_guardrails(metrics: list[Metric], guards: Sequence[tuple[Metric, PlanMargin]]) -> list[Metric]:
    """A rollout's metrics: the plan's guardrails (the controller's definitions and margins)
    replace the catalogue's flags for those metrics, and are added when not listed. A
    ``Metric`` carries one relative margin; absolute ones are shown through
    :func:`_plan_metric_info` (the table's cells come from the controller's own test)."""
    margins = {m.name: margin.relative or 0.0 for m, margin in guards}
    out = [replace(m, guardrail=True, margin=margins[m.name]) if m.name in margins else m for m in metrics]
    names = {m.name for m in out}
    return out + [
        replace(m, guardrail=True, margin=margins[m.name]) for m, _ in guards if m.name not in names
    ]


def _plan_metric_info(info: MetricInfo, guards: Sequence[tuple[Metric, PlanMargin]]) -> MetricInfo:
    """A plan guardrail's margin as the plan states it; ``margin`` (relative) only when it is one."""
    margin = next((g for m, g in guards if m.name == info.name), None)
    if margin is None:
        return info
    relative = margin.relative if margin.kind == "relative" else None
    return info.model_copy(update={"margin": relative, "margin_text": margin.spec_text()})


def _compare_options(opts: ReportOptions, exp: _Experiment, plan: PlanFacts | None) -> CompareOptions:
    base = replace(opts.compare, final_look=exp.status in FINAL_STATUSES)
    if plan is None:
        return base
    return replace(base, planned_units=plan.planned_units, min_units=plan.min_test_units)


def build_report(
    conn: Connection, experiment_id: int, *, now: datetime | None = None, options: ReportOptions | None = None
) -> Report:
    """The experiment's report at ``now`` (default: the current time)."""
    started = time.perf_counter()
    opts = options or ReportOptions()
    generated = now or datetime.now(UTC)
    exp = _load_experiment(conn, experiment_id)
    metrics, errors = resolve_metrics(conn, exp.metrics)
    part: RolloutPart | None = None
    guards: Sequence[tuple[Metric, PlanMargin]] = []
    if exp.mode == "rollout":
        if opts.rollout is None:
            raise RolloutViewMissing(
                f"experiment {exp.id} is a rollout: its report needs ReportOptions.rollout"
            )
        part = opts.rollout(conn, exp.id)
        if part is not None:
            guards = part.guards
            metrics = _with_plan_guardrails(metrics, guards)
    plan = part.plan if part is not None else None
    compare = _compare_options(opts, exp, plan)
    head: dict[str, Any] = {
        "experiment_id": exp.id, "name": exp.name, "route": exp.route, "mode": exp.mode, "status": exp.status,
        "stage": exp.stage, "started_at": exp.started_at, "generated_at": generated, "alpha": opts.alpha,
        "control": exp.control, "metrics": [_plan_metric_info(metric_info(m, opts.mde), guards) for m in metrics],
        "planned_units": compare.planned_units, "min_units": compare.min_units,
        "segment_tags": exp.segment_tags,
    }  # fmt: skip
    if exp.control is None:
        allocation, srm = srm_all_units(exp.variants, {}, exp.mode)
        errors.append(error("no_control", "the experiment has no control variant"))
        return Report(**head, units=0, allocation=allocation, srm=srm, results=[], verdicts=[], errors=errors,
                      build_seconds=time.perf_counter() - started)  # fmt: skip
    previous = _previous_sequential_p(conn, exp.id)
    failed: dict[str, str] = {}
    stats, counts = _overall_stats(conn, exp, metrics, _has_preperiod(conn, exp.id), failed)
    errors += [error("metric_failed", f"metric {n!r}: {why}") for n, why in failed.items()]
    metrics = [m for m in metrics if m.name not in failed]
    rows = _table(conn, exp, metrics, "", compare, stats, counts, previous)
    rows = apply_corrections(rows, opts.alpha)
    allocation, srm = _allocation(conn, exp, counts, plan, opts.srm_grace_s)
    units = sum(counts.values())
    if units == 0:
        errors.append(error("no_data", "no units have been recorded for this experiment yet"))
    update: dict[str, Any] = {}
    if part is not None:
        rows, verdict_list, update["rollout"] = part.judge(
            conn, rows, stats, srm, metrics, generated, opts.srm_grace_s
        )
    else:
        gates = None
        if exp.mode == "ab" and exp.control is not None:
            gates = {
                n: offline_gate.check(conn, exp.id, n, exp.control, required=False)
                for n, _, c in exp.variants
                if not c
            }
        verdict_list = verdicts(exp, rows, metrics, srm, counts, compare.min_units, gates)
    report = Report(
        **head, units=units, allocation=allocation, srm=srm, results=rows, verdicts=verdict_list, errors=errors,
    )  # fmt: skip
    if opts.segments and units:
        update["segments"] = _segment_tables(conn, exp, metrics, opts, compare, errors)
    if exp.mode == "shadow":
        update["paired"] = paired_comparisons(conn, exp.id, exp.control, [n for n, _, c in exp.variants if not c],
                                              generated, opts.paired_window_s, opts.max_pairs, opts.alpha)  # fmt: skip
    if opts.rl_risks and units and exp.mode != "shadow":
        candidates = [n for n, _, c in exp.variants if not c]
        reused = _recent_risks(conn, exp.id, exp.control, candidates, generated, opts.rl_risks_max_age_s)
        if reused is None:
            fresh = rl_risks(conn, exp.id, exp.control, candidates, risk_options(conn, exp.id, opts, compare))
            reused = [r.model_copy(update={"computed_at": generated}) for r in fresh]
        update["rl_risks"] = reused
    if opts.timeseries:
        series = load_timeseries(conn, exp.id, opts.max_timeseries_points)
        update["timeseries"] = with_current_point(series, report)
    update["errors"] = errors
    update["build_seconds"] = time.perf_counter() - started
    return report.model_copy(update=update)


def _recent_risks(conn: Connection, eid: int, control: str, candidates: Sequence[str], now: datetime,
                  max_age_s: float) -> list[RlRisks] | None:  # fmt: skip
    """The latest snapshot's rl_risks when every entry was computed within ``max_age_s`` for
    the same control and candidates (None: compute afresh)."""
    if max_age_s <= 0:
        return None
    raw = conn.execute(
        text(
            "SELECT report->'rl_risks' FROM analysis_snapshots WHERE experiment_id = :e AND report IS NOT NULL"
            " ORDER BY created_at DESC, id DESC LIMIT 1"
        ),
        {"e": eid},
    ).scalar()
    if not isinstance(raw, list) or not raw:
        return None
    try:
        found = [RlRisks.model_validate(r) for r in raw]
    except ValueError:
        return None  # a section of an older schema: compute afresh
    fresh = all(
        r.computed_at is not None
        and 0 <= (now - r.computed_at).total_seconds() <= max_age_s
        and r.control == control
        for r in found
    )
    return found if fresh and [r.variant for r in found] == list(candidates) else None


def plan_risk_guardrails(raw: Any) -> tuple[Guardrail, ...]:
    """The per-category guardrails a stored rollout plan declares (none when it is invalid:
    the controller holds an invalid plan, and the report shows the plan's errors)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("rl_risks"), dict):
        return ()
    try:
        rules = RolloutPlanSchema.model_validate(raw).rl_risks
    except ValueError:
        return ()
    if rules is None:
        return ()
    return tuple(Guardrail(g.metric, g.margin, g.relative) for g in rules.category_guardrails)


def risk_options(conn: Connection, eid: int, opts: ReportOptions, compare: CompareOptions) -> RiskOptions:
    raw = conn.execute(text("SELECT rollout_plan FROM experiments WHERE id = :e"), {"e": eid}).scalar()
    return RiskOptions(
        alpha=opts.alpha, planned_units=compare.planned_units, min_units=compare.min_units,
        guardrails=plan_risk_guardrails(raw), score_min=opts.judge_score_min, score_max=opts.judge_score_max,
        ngram_key_id=opts.ngram_key.key_id if opts.ngram_key is not None else None,
        phrase_lookup=opts.phrase_lookup,
    )  # fmt: skip


def _allocation(
    conn: Connection, exp: _Experiment, counts: Mapping[str, int], plan: PlanFacts | None, grace_s: float
) -> tuple[list[AllocationRow], SrmCheck]:
    if exp.mode != "rollout":
        return srm_all_units(exp.variants, counts, exp.mode)
    control = exp.control
    candidates = [n for n, _, c in exp.variants if not c]
    weights: dict[int, dict[str, float]] = {}
    if plan is not None and control is not None and len(candidates) == 1:
        weights = stage_weights(control, candidates[0], plan.stages)
    elif exp.stage is not None and exp.status == "running":
        # No usable plan: only the current stage's weights are known (the configured ones).
        weights = {exp.stage: {n: w for n, w, _ in exp.variants}}
    n_stages = len(plan.stages) if plan is not None else (exp.stage or 0) + 1
    return srm_rollout(
        conn, exp.id, exp.variants, exp.stage, exp.stage_started_at, weights, n_stages, grace_s
    )


__all__ = [
    "ExperimentNotFound",
    "PlanFacts",
    "PlanMargin",
    "ReportOptions",
    "RolloutPart",
    "RolloutPartLoader",
    "RolloutViewMissing",
    "build_report",
]
