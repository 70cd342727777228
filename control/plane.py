"""What the admin API needs from the process serving it, built once at startup.

The analytics service (the control plane's home) passes its engine and the hooks that
need analytics knowledge: the metric catalogue's validation, the rollout actions and the
segment backfill (the rollup formulas). A
process that passes neither (the gateway, which keeps serving the configuration routes for
compatibility) answers those routes with a pointer to the control plane.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, create_engine

from control.auth import Authenticator
from control.notify_settings import NotifySettings

#: Validates and normalises a metric definition body; raises ValueError with the reason.
MetricSpec = Callable[[Any], dict[str, Any]]
#: (experiment id or name, action, actor) -> the rollout's status after the action.
RolloutAction = Callable[[str, str, str], dict[str, Any]]
#: (the caller's connection, experiment id, tag keys) -> segment rollup rows written: recompute
#: those segments from the stored requests (the caller holds the locks and writes the audit).
SegmentBackfill = Callable[[Connection, int, list[str]], int]


class ControlPlane:
    def __init__(
        self,
        admin_token: str,
        *,
        engine: Engine | None = None,
        database_url: str | None = None,
        metric_spec: MetricSpec | None = None,
        builtin_metrics: frozenset[str] = frozenset(),
        rollout_action: RolloutAction | None = None,
        segment_backfill: SegmentBackfill | None = None,
        read_token: str | None = None,
        auth: Authenticator | None = None,
        notify: NotifySettings | None = None,
    ) -> None:
        if engine is None and database_url is None:
            raise ValueError("the control plane needs an engine or a database URL")
        self.admin_token = admin_token
        self.metric_spec = metric_spec
        self.builtin_metrics = builtin_metrics
        self.rollout_action = rollout_action
        self.segment_backfill = segment_backfill
        # Webhook delivery settings (the SSRF policy, the test button's deadline).
        self.notify = notify if notify is not None else NotifySettings()
        self._engine = engine
        self._owned = engine is None
        self._database_url = database_url
        self._lock = threading.Lock()
        # Who may do what: the caller's authenticator (the analytics service shares its own
        # with its request guard), else one over this plane's engine.
        self.auth = auth if auth is not None else Authenticator(admin_token, read_token, lambda: self.engine)

    @property
    def engine(self) -> Engine:
        """The engine (created on first use when only a URL was given: admin calls are rare)."""
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    assert self._database_url is not None
                    self._engine = create_engine(
                        self._database_url,
                        pool_size=2,
                        max_overflow=4,
                        pool_pre_ping=True,
                        hide_parameters=True,
                    )
        return self._engine

    def dispose(self) -> None:
        """Close the engine this object created (an engine passed in belongs to the caller)."""
        with self._lock:
            if self._owned and self._engine is not None:
                self._engine.dispose()
                self._engine = None
