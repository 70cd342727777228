"""What the analytics service's parts share: the ``ServiceContext`` and its background workers.

Built once in the app's lifespan (``analytics.service.app``) and kept on ``app.state.ctx``;
routers reach it through the ``Ctx`` dependency, workers get it from their factory. It sits
below the app and the routers so that neither imports the other to reach it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Connection, Engine

from analytics.report.assembly import ReportOptions, build_report
from analytics.report.schema import Report
from analytics.service.settings import AnalyticsSettings
from analytics.service.telemetry import ServiceMetrics


@dataclass(frozen=True, slots=True)
class BackgroundWorker:
    """A long-running job: ``run(stop)`` must return soon after ``stop`` is set."""

    name: str
    run: Callable[[threading.Event], None]


@dataclass(slots=True)
class ServiceContext:
    """What the service's parts share; built in the lifespan, kept on ``app.state.ctx``."""

    settings: AnalyticsSettings
    engine: Engine
    metrics: ServiceMetrics
    options: ReportOptions
    threads: dict[str, threading.Thread] = field(default_factory=dict)
    fresh_at: dict[int, float] = field(default_factory=dict)  # experiment -> last ?fresh=true
    fresh_lock: threading.Lock = field(default_factory=threading.Lock)

    def fresh_wait(self, experiment_id: int) -> float:
        """0 when a fresh report of this experiment may be computed now (and it is counted),
        else the seconds to wait (at most one per ``fresh_min_interval_s`` per experiment)."""
        now = time.monotonic()
        with self.fresh_lock:
            last = self.fresh_at.get(experiment_id)
            wait = 0.0 if last is None else last + self.settings.fresh_min_interval_s - now
            if wait > 0:
                return wait
            if len(self.fresh_at) > 10_000:  # bounded: forget what no longer limits anything
                horizon = now - self.settings.fresh_min_interval_s
                self.fresh_at = {k: t for k, t in self.fresh_at.items() if t > horizon}
            self.fresh_at[experiment_id] = now
            return 0.0

    def build(
        self,
        conn: Connection,
        experiment_id: int,
        now: datetime | None = None,
        *,
        cuped_theta: str | None = None,
        proportion_test: str | None = None,
    ) -> Report:
        """``cuped_theta``/``proportion_test``: another convention than the service's options."""
        options = self.options
        if cuped_theta is not None:
            options = replace(options, cuped_theta=cuped_theta)
        if proportion_test is not None:
            options = replace(options, proportion_test=proportion_test)
        report = build_report(conn, experiment_id, now=now, options=options)
        self.metrics.observe_risks(report)  # the snapshotter's reports set the alarm gauges too
        return report


WorkerFactory = Callable[[ServiceContext], BackgroundWorker | None]


def get_ctx(request: Request) -> ServiceContext:
    ctx: ServiceContext = request.app.state.ctx
    return ctx


Ctx = Annotated[ServiceContext, Depends(get_ctx)]
