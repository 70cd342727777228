"""The rollout controller: every interval, look at each running rollout and act on the evidence.

One look at one experiment is one transaction: take the experiment's advisory lock
(``pg_try_advisory_xact_lock``; busy → skip, another process is on it), re-read the row
``FOR UPDATE``, measure (guardrails, SRM, minimums), decide (:mod:`.decisions`), apply the
new weights/status and record the decision — all committed together. Everything that
matters lives in the database (stage, ``stage_started_at``, decisions), so a restarted or
second controller continues exactly where the last commit left off; the only memory is
when this process last looked at an experiment (to honour the plan's ``interval_s``).

A paused rollout is never looked at (``status = 'paused'`` is not running).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, text

from analytics.ingest.samples import read_samples
from analytics.report.aggregate import unit_counts, variant_stats
from analytics.report.assembly import resolve_metrics
from analytics.report.catalogue import Metric
from analytics.report.risks import RiskOptions, rl_risks
from analytics.risks import Guardrail
from analytics.rollout.check import check_plan, guardrails_of, plan_metric_names
from analytics.rollout.decisions import Decision, Look, decide
from analytics.rollout.evidence import (
    GuardrailCheck,
    check_group_guardrail,
    check_guardrail,
    check_rank_guardrail,
    check_success,
    guardrail_alpha,
    look_srm,
    risk_look,
)
from analytics.rollout.margins import Margin
from analytics.rollout.plan import PlanError, RolloutPlan, Stage, parse_plan
from analytics.rollout.telemetry import RolloutMetrics
from contracts import offline_gate
from contracts.events import ROLLOUT_STAGE_TAG
from control import locking, rollout

log = logging.getLogger(__name__)


def _running_rollouts(conn: Connection) -> list[int]:
    rows = conn.execute(
        text("SELECT id FROM experiments WHERE mode = 'rollout' AND status = 'running' ORDER BY id")
    )
    return [int(r[0]) for r in rows]


def _stage_split(conn: Connection, experiment_id: int, segment: str) -> dict[str, int]:
    """Units per variant in one stage's segment (``rollout_stage=<index>``, tagged by the gateway)."""
    rows = conn.execute(
        text(
            "SELECT variant, count(*) FROM segment_rollups WHERE experiment_id = :e AND segment = :s"
            " GROUP BY variant"
        ),
        {"e": experiment_id, "s": segment},
    )
    return {str(v): int(n) for v, n in rows}


Clock = Callable[[], datetime]
CONTROLLER_ACTOR = "controller"


def utcnow() -> datetime:
    return datetime.now(UTC)


def load_catalogue(conn: Connection, names: Sequence[str]) -> tuple[dict[str, Metric], list[str]]:
    """The named metrics (built-in or user-defined) and the reasons a named one is unusable."""
    if not names:
        return {}, []
    metrics, errors = resolve_metrics(conn, list(dict.fromkeys(names)))
    quoted = [repr(n) for n in names]
    relevant = [
        e.message for e in errors if e.code != "unknown_metric" and any(q in e.message for q in quoted)
    ]
    return {m.name: m for m in metrics}, relevant


def resolve_guardrails(
    conn: Connection, plan: RolloutPlan
) -> tuple[list[tuple[Metric, Margin]], list[Metric]]:
    """(guardrail metric, margin) pairs and success metrics; PlanError when one cannot be tested."""
    catalogue, errors = load_catalogue(
        conn, [g.metric for g in plan.guardrail_specs()] + list(plan.success_metrics)
    )
    if errors:
        raise PlanError("; ".join(errors))
    guards = guardrails_of(plan, catalogue)
    return guards, [catalogue[n] for n in plan.success_metrics]


def _last_group_checks(conn: Connection, experiment_id: int, stage: int) -> dict[str, dict[str, Any]]:
    """Each guardrail's check in the newest decision of this stage that carries group looks.

    A group-sequential plan's memory: which looks were taken at which information fractions,
    and the last look's outcome (every decision records it; a hold repeated at the same looks
    is not re-recorded, so the newest row is the latest state).
    """
    found = conn.execute(
        text(
            "SELECT evidence->'guardrails' FROM rollout_decisions WHERE experiment_id = :e AND stage = :s"
            " AND evidence ? 'group_looks' ORDER BY created_at DESC, id DESC LIMIT 1"
        ),
        {"e": experiment_id, "s": stage},
    ).first()
    checks = found[0] if found is not None and isinstance(found[0], list) else []
    return {str(c["metric"]): c for c in checks if isinstance(c, dict) and "metric" in c}


def measure(
    conn: Connection,
    row: rollout.RolloutRow,
    plan: RolloutPlan,
    stage: Stage,
    now: datetime,
    srm_grace_s: float,
) -> Look:
    control, candidate = row.control, row.candidate
    assert control is not None and candidate is not None and row.stage_started_at is not None
    guards, success = resolve_guardrails(conn, plan)
    metrics = [m for m, margin in guards if margin.method != "mann_whitney"] + success
    # The driver connection (same transaction): aggregate's SQL passes positional lists.
    pg = conn.connection.driver_connection
    assert isinstance(pg, psycopg.Connection)
    by_stage = plan.guardrail_window == "stage"
    segment = f"{ROLLOUT_STAGE_TAG}={row.stage}" if by_stage else ""
    stats = variant_stats(pg, row.id, metrics, segment) if metrics else {}
    counts = unit_counts(pg, row.id)
    # Rolling back: Bonferroni over guardrails, and with per-stage windows also over the
    # evaluated stages (each a fresh family of tests), so P(any false rollback) ≤ alpha.
    # Promoting: every guardrail must be shown non-inferior (an intersection-union test),
    # so each one at noninferiority_alpha keeps P(false promotion) ≤ noninferiority_alpha.
    alpha = guardrail_alpha(plan.alpha, guards, plan.evaluated_stages() if by_stage else 1)
    in_stage = _stage_split(conn, row.id, f"{ROLLOUT_STAGE_TAG}={row.stage}")
    elapsed_s = (now - row.stage_started_at).total_seconds()
    # Rank guardrails are fixed-horizon tests: judged once the stage's minimums are met.
    due = elapsed_s >= stage.min_duration_s and in_stage.get(candidate.name, 0) >= stage.min_units
    seq = plan.sequential
    previous = _last_group_checks(conn, row.id, stage.index) if seq.mode == "group" else {}

    def unit_test(m: Metric, margin: Margin) -> GuardrailCheck:
        control_stats = stats.get(m.name, {}).get(control.name)
        candidate_stats = stats.get(m.name, {}).get(candidate.name)
        if seq.mode == "group":
            assert seq.looks is not None
            return check_group_guardrail(
                m, margin, control_stats, candidate_stats, previous=previous.get(m.name),
                spending=seq.spending_function, looks=seq.looks, alpha=alpha,
                alpha_noninferiority=plan.noninferiority_alpha, planned_units=plan.planned_units,
                min_test_units=plan.min_test_units,
            )  # fmt: skip
        return check_guardrail(
            m, margin, control_stats, candidate_stats, alpha=alpha,
            alpha_noninferiority=plan.noninferiority_alpha, planned_units=plan.planned_units,
            min_test_units=plan.min_test_units,
        )  # fmt: skip

    checks = tuple(
        check_rank_guardrail(
            m,
            margin,
            *(
                read_samples(pg, row.id, m.histogram or "latency", segment).get(v.name)
                for v in (control, candidate)
            ),
            alpha=alpha,
            alpha_noninferiority=plan.noninferiority_alpha,
            due=due,
        )
        if margin.method == "mann_whitney"
        else unit_test(m, margin)
        for m, margin in guards
    )
    wins = tuple(
        check_success(
            m,
            stats.get(m.name, {}).get(control.name),
            stats.get(m.name, {}).get(candidate.name),
            alpha=plan.alpha,
            planned_units=plan.planned_units,
        )
        for m in success
    )
    # Units per variant tagged with this stage by the gateway: the gateway tags a call with the
    # stage of the configuration it served it under, so every one of these units was assigned
    # with this stage's weights however late the gateway applied them, and their split must
    # match the weights. (Counting units active since the stage began instead raised a false
    # SRM when a loaded gateway applied new weights more than a grace period late.)
    srm_since = row.stage_started_at + timedelta(seconds=srm_grace_s)
    srm_counts = in_stage if now >= srm_since else {}
    weights = {control.name: 100.0 - stage.percent, candidate.name: stage.percent}
    risks = None
    if plan.rl_risks is not None:
        rules = plan.rl_risks
        # Bonferroni over the rules acted on (the category guardrails count as one family,
        # Holm inside), so P(any false hold or rollback from these rules) ≤ alpha.
        families = len(set(rules.hold_on) | set(rules.rollback_on)) + (1 if rules.category_guardrails else 0)
        opts = RiskOptions(
            alpha=plan.alpha / max(1, families), planned_units=plan.planned_units,
            min_units=plan.min_test_units,
            guardrails=tuple(Guardrail(g.metric, g.margin, g.relative) for g in rules.category_guardrails),
        )  # fmt: skip
        section = rl_risks(conn, row.id, control.name, [candidate.name], opts)
        risks = risk_look(section[0], rules)
    return Look(
        stage=stage,
        elapsed_s=elapsed_s,
        candidate_units_in_stage=in_stage.get(candidate.name, 0),
        n_control=counts.get(control.name, 0),
        n_candidate=counts.get(candidate.name, 0),
        guardrails=checks,
        srm=look_srm(srm_counts, weights),
        success=wins,
        window=plan.guardrail_window,
        sequential=seq.mode,
        risks=risks,
    )


class Controller:
    """Evaluates running rollouts; ``run`` loops until ``stop`` is set."""

    def __init__(
        self,
        engine: Engine,
        metrics: RolloutMetrics,
        *,
        clock: Clock = utcnow,
        srm_grace_s: float = 2.0,
        actor: str = CONTROLLER_ACTOR,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self.srm_grace_s = srm_grace_s
        self.actor = actor
        self._last_look: dict[int, datetime] = {}

    def run(self, stop: threading.Event, tick_s: float = 5.0) -> None:
        log.info("rollout controller running (tick %ss)", tick_s)
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # a database hiccup must not end the controller
                log.exception("rollout controller tick failed")
            stop.wait(tick_s)

    def tick(self) -> list[Decision]:
        with self.engine.connect() as conn:
            ids = _running_rollouts(conn)
        out = []
        for eid in ids:
            try:
                decision = self.evaluate(eid)
            except Exception:
                self.metrics.evaluations.labels("error").inc()
                log.exception("rollout %s: evaluation failed", eid)
                continue
            if decision is not None:
                out.append(decision)
        return out

    def evaluate(self, experiment_id: int, *, force: bool = False) -> Decision | None:
        """One look at one experiment; None when skipped (locked, not running, not due)."""
        recorded = False
        with self.engine.begin() as conn:
            if not locking.try_lock(conn, experiment_id):
                self.metrics.evaluations.labels("skipped").inc()
                return None
            row = rollout.load(conn, experiment_id, for_update=True)
            if row is None or row.mode != "rollout" or row.status != "running":
                return None
            now = self.clock()
            decision = self._decide(conn, row, now, force)
            if decision is None:
                self.metrics.evaluations.labels("skipped").inc()
                return None
            self._last_look[experiment_id] = now
            if not rollout.is_repeat_hold(conn, experiment_id, decision):
                self._apply(conn, row, decision, now)
                recorded = True
            after = rollout.load(conn, experiment_id)
        self.metrics.evaluations.labels("ok").inc()
        if recorded:
            self.metrics.decisions.labels(decision.decision).inc()
            log.info("rollout %s (%s): %s — %s", row.name, row.id, decision.decision, decision.reason)
        if after is not None:
            observe_stage(self.metrics, after)
        return decision

    def _decide(
        self, conn: Connection, row: rollout.RolloutRow, now: datetime, force: bool
    ) -> Decision | None:
        catalogue, errors = load_catalogue(conn, plan_metric_names(row.plan))
        checked = check_plan(row.plan, catalogue, catalogue_errors=errors)
        if checked.errors:
            reason = f"invalid rollout plan: {'; '.join(checked.errors)}"
            return Decision("hold", reason, "plan_invalid", row.stage, row.stage)
        plan = parse_plan(row.plan)
        last = self._last_look.get(row.id)
        if not force and last is not None and (now - last).total_seconds() < plan.interval_s:
            return None
        if row.control is None or row.candidate is None:
            reason = "a rollout needs exactly one control and one candidate variant"
            return Decision("hold", reason, "variants_invalid", row.stage, row.stage)
        gate = offline_gate.check(
            conn, row.id, row.candidate.name, row.control.name, required=plan.offline_gate == "required"
        )
        started = row.stage is not None and row.stage_started_at is not None
        if not gate.passed and not started:
            return Decision(
                "hold", gate.reason, "offline_gate", row.stage, row.stage, {"offline_gate": gate.public()}
            )
        if not gate.passed:
            # The gate vouches for exactly one candidate: one repointed at another model or
            # URL mid-rollout (or judged failing since) must stop getting traffic now.
            reason = f"the offline gate no longer vouches for the candidate: {gate.reason}"
            return Decision(
                "rollback", reason, "offline_gate", row.stage, None, {"offline_gate": gate.public()}
            )
        if row.stage is None or row.stage_started_at is None:
            first = min(row.stage or 0, len(plan.stages) - 1)
            pct = plan.stage(first).percent
            return Decision(
                "start", f"rollout started at stage {pct:g}%", "start", None, first, {"stage_percent": pct}
            )
        stage = plan.stage(min(row.stage, len(plan.stages) - 1))
        try:
            look = measure(conn, row, plan, stage, now, self.srm_grace_s)
        except PlanError as exc:
            return Decision("hold", f"invalid rollout plan: {exc}", "plan_invalid", row.stage, row.stage)
        return decide(plan, look)

    def _apply(self, conn: Connection, row: rollout.RolloutRow, decision: Decision, now: datetime) -> None:
        apply_decision(conn, row, decision, now)
        after = rollout.load(conn, row.id)
        rollout.record(conn, row.id, decision, self.actor, now, row.state(), after.state() if after else None)


def apply_decision(conn: Connection, row: rollout.RolloutRow, decision: Decision, now: datetime) -> None:
    """Change weights/status for a decision (hold changes nothing)."""
    if decision.decision in ("start", "advance"):
        assert decision.to_stage is not None
        plan = parse_plan(row.plan)
        rollout.set_stage(conn, row, decision.to_stage, plan.stage(decision.to_stage).percent, now)
    elif decision.decision == "rollback":
        rollout.rollback(conn, row, decision.reason, now)
    elif decision.decision == "promote":
        rollout.promote(conn, row, decision.reason, now)


def observe_stage(metrics: RolloutMetrics, row: rollout.RolloutRow) -> None:
    """Set the stage gauge from the committed row (the Grafana 'current stage' panel)."""
    gauge = metrics.stage_percent.labels(row.route, row.name)
    if row.status == "rolled_back":
        gauge.set(0)
    elif row.status == "completed":
        gauge.set(100)
    elif row.candidate is not None:
        gauge.set(row.candidate.weight)
