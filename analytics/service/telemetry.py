"""Prometheus metrics of the analytics service (bounded labels: experiment ids, never units).

=============================================  =========  =================================
name                                           type       labels
=============================================  =========  =================================
liftgate_analytics_report_build_seconds        histogram  source (api|snapshotter)
liftgate_analytics_snapshots_total             counter    outcome (ok|error)
liftgate_analytics_report_requests_total       counter    served (snapshot|computed)
liftgate_analytics_worker_up                   gauge      worker (1 while the thread runs)
liftgate_analytics_rl_risk_alarm               gauge      experiment, variant, alarm
liftgate_analytics_rl_risk_evaluable           gauge      experiment, variant, alarm
liftgate_analytics_feedback_unjoined           gauge      state (unjoined|pending): feedback of the
                                               last 7 days without its interaction
                                               (``analytics.report.data_quality``)
liftgate_analytics_rl_compacted_rows_total     counter    rl_rollups rows the rl-compaction
                                               worker moved into compacted rows
liftgate_analytics_rl_compaction_runs_total    counter    outcome (ok|error)
=============================================  =========  =================================

The RL-risk gauges are set from every report built or served (``alarm`` is one of
``analytics.report.risks_schema.ALARM_NAMES``): ``rl_risk_alarm`` is 1 while the alarm fires,
``rl_risk_evaluable`` 1 while its detector has the data to decide (state ``ok``), so
"0 and not evaluable" is never read as "healthy". Labels are bounded by the experiments'
candidates × 6 alarms; a candidate no longer in the report loses its series.

The consumer's metrics (events consumed, dead letters, lag, batch write time) are
registered by ``analytics.ingest.consumer`` on the registry it is given, or on the default
registry; ``/metrics`` exposes both.
"""

from __future__ import annotations

import threading
import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from analytics.report.schema import Report

_BUILD_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServiceMetrics:
    """Declares the service's metrics once on an injectable registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_seconds = Histogram(
            "liftgate_analytics_report_build_seconds",
            "Time to build one experiment report",
            ["source"],
            buckets=_BUILD_BUCKETS,
            registry=r,
        )
        self.snapshots = Counter(
            "liftgate_analytics_snapshots", "Analysis snapshots written", ["outcome"], registry=r
        )
        self.report_requests = Counter(
            "liftgate_analytics_report_requests",
            "Report API requests by how they were served",
            ["served"],
            registry=r,
        )
        self.worker_up = Gauge(
            "liftgate_analytics_worker_up", "1 while a background worker thread runs", ["worker"], registry=r
        )

        self.risk_alarm = Gauge(
            "liftgate_analytics_rl_risk_alarm",
            "1 while an RL-risk alarm fires for a candidate",
            ["experiment", "variant", "alarm"],
            registry=r,
        )
        self.risk_evaluable = Gauge(
            "liftgate_analytics_rl_risk_evaluable",
            "1 while an RL-risk detector has the data to decide (state ok)",
            ["experiment", "variant", "alarm"],
            registry=r,
        )
        feedback = Gauge(
            "liftgate_analytics_feedback_unjoined",
            "Feedback of the last 7 days whose request id joined no interaction",
            ["state"],
            registry=r,
        )
        self._unjoined, self._pending = feedback.labels("unjoined"), feedback.labels("pending")
        self.rl_compacted_rows = Counter(
            "liftgate_analytics_rl_compacted_rows",
            "rl_rollups rows moved into one compacted row per key by the rl-compaction worker",
            registry=r,
        )
        self.rl_compaction_runs = Counter(
            "liftgate_analytics_rl_compaction_runs", "rl-compaction worker runs", ["outcome"], registry=r
        )
        self.feedback_quality_at = float("-inf")  # monotonic time of the last count
        self._risk_labels: dict[int, set[tuple[str, str]]] = {}
        self._risk_lock = threading.Lock()

    def observe_feedback_quality(self, unjoined: int, pending: int) -> None:
        self._unjoined.set(unjoined)
        self._pending.set(pending)
        self.feedback_quality_at = time.monotonic()

    def observe_risks(self, report: Report) -> None:
        """Set the RL-risk gauges of one experiment from its report (drops stale candidates)."""
        eid = str(report.experiment_id)
        current: set[tuple[str, str]] = {(r.variant, str(a.name)) for r in report.rl_risks for a in r.alarms}
        with self._risk_lock:
            for variant, alarm in self._risk_labels.get(report.experiment_id, set()) - current:
                self.risk_alarm.remove(eid, variant, alarm)
                self.risk_evaluable.remove(eid, variant, alarm)
            for r in report.rl_risks:
                for a in r.alarms:
                    self.risk_alarm.labels(eid, r.variant, a.name).set(1.0 if a.firing else 0.0)
                    self.risk_evaluable.labels(eid, r.variant, a.name).set(1.0 if a.state == "ok" else 0.0)
            self._risk_labels[report.experiment_id] = current

    def exposition(self) -> bytes:
        """This registry plus the process-default one (where library collectors live)."""
        own = generate_latest(self.registry)
        if self.registry is REGISTRY:
            return own
        return own + generate_latest(REGISTRY)
