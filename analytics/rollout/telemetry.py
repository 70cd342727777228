"""Prometheus instruments of staged rollouts (bounded labels: decision kinds, route/experiment names).

=====================================  =======  ======================================
name                                   type     labels
=====================================  =======  ======================================
liftgate_rollout_decisions_total       counter  decision (start|advance|hold|rollback|
                                                promote|pause|resume)
liftgate_rollout_stage_percent         gauge    route, experiment (candidate's percent;
                                                100 after promotion, 0 after rollback)
liftgate_rollout_evaluations_total     counter  outcome (ok|skipped|error)
=====================================  =======  ======================================

One :class:`RolloutMetrics` per registry: the controller thread and the admin router of
one service share the service registry through :func:`for_registry`.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge

_LOCK = threading.Lock()
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, RolloutMetrics] = weakref.WeakKeyDictionary()


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "liftgate_rollout_decisions",
            "Rollout decisions recorded, by kind",
            ["decision"],
            registry=registry,
        )
        self.stage_percent = Gauge(
            "liftgate_rollout_stage_percent",
            "Candidate traffic percent of the current rollout stage",
            ["route", "experiment"],
            registry=registry,
        )
        self.evaluations = Counter(
            "liftgate_rollout_evaluations",
            "Controller looks at a rollout, by outcome",
            ["outcome"],
            registry=registry,
        )


def for_registry(registry: CollectorRegistry) -> RolloutMetrics:
    """The registry's RolloutMetrics, created on first use (a name registers only once)."""
    with _LOCK:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = RolloutMetrics(registry)
            _BY_REGISTRY[registry] = metrics
        return metrics
