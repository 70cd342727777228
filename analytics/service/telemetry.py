"""Prometheus metrics of the analytics service (bounded labels: experiment ids, never units).

=============================================  =========  =================================
name                                           type       labels
=============================================  =========  =================================
liftgate_analytics_report_build_seconds        histogram  source (api|snapshotter)
liftgate_analytics_snapshots_total             counter    outcome (ok|error)
liftgate_analytics_report_requests_total       counter    served (snapshot|computed)
liftgate_analytics_worker_up                   gauge      worker (1 while the thread runs)
=============================================  =========  =================================

The consumer's metrics (events consumed, dead letters, lag, batch write time) are
registered by ``analytics.ingest.consumer`` on the registry it is given, or on the default
registry; ``/metrics`` exposes both.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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

    def exposition(self) -> bytes:
        """This registry plus the process-default one (where library collectors live)."""
        own = generate_latest(self.registry)
        if self.registry is REGISTRY:
            return own
        return own + generate_latest(REGISTRY)
