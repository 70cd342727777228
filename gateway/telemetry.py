"""Prometheus metrics of the gateway (bounded labels only: never a unit or user id).

Metric names (the Grafana dashboards are built on these):

=============================================  =========  ==========================================
name                                           type       labels
=============================================  =========  ==========================================
liftgate_gateway_requests_total                counter    route, experiment, variant, role, status_class
liftgate_gateway_request_duration_seconds      histogram  route, experiment, variant, role
liftgate_gateway_ttft_seconds                  histogram  route, experiment, variant, role
liftgate_gateway_tokens_total                  counter    route, experiment, variant, kind (prompt|completion)
liftgate_gateway_upstream_errors_total         counter    route, experiment, variant, error_type
liftgate_gateway_fallbacks_total               counter    route, experiment, variant (the failed candidate)
liftgate_gateway_shadow_total                  counter    route, experiment, variant, outcome
                                                          (sent|dropped|ok|failed)
liftgate_gateway_refused_total                 counter    reason (unauthorized|body_too_large|rate_limited|
                                                          invalid_request|model_not_found|not_ready):
                                                          requests answered by the gateway itself, no
                                                          upstream called
liftgate_gateway_events_emitted_total          counter    type (interaction|feedback)
liftgate_gateway_feedback_unknown_request_total counter   —  (feedback accepted with the warning
                                                          ``unknown_request_id``)
liftgate_gateway_sink_events                   gauge      state (queued|spooled|delivered|dropped|...)
                                                          as reported by ``sink.stats()``
liftgate_gateway_variant_weight                gauge      route, experiment, variant (normalised share)
liftgate_gateway_rollout_stage                 gauge      route, experiment
liftgate_gateway_config_reloads_total          counter    outcome (ok|error)
liftgate_gateway_config_age_seconds            gauge      —  (seconds since the last successful refresh)
=============================================  =========  ==========================================

``experiment`` and ``variant`` are ``""`` for traffic outside any experiment.
``status_class`` is ``2xx``/``4xx``/``5xx``; ``error_type`` is one of ``connect``, ``timeout``,
``http_4xx``, ``http_5xx``, ``stream``, ``protocol``.

Several worker processes: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory before the
workers start (``python -m gateway --workers N`` does this); ``/metrics`` then aggregates the
per-process files with ``MultiProcessCollector``. Gauges use ``livesum``/``max`` modes so
values of dead workers disappear.

The hot path must stay cheap: label children are bound once per (route, experiment, variant)
and cached in :class:`GatewayMetrics` (``children``), so one request costs a dict lookup and a
few ``inc``/``observe`` calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_STATUS_CLASSES = ("2xx", "4xx", "5xx")
_CLASS_INDEX = {c: i for i, c in enumerate(_STATUS_CLASSES)}
REFUSALS = (
    "unauthorized",
    "body_too_large",
    "rate_limited",
    "invalid_request",
    "model_not_found",
    "not_ready",
)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


_PROMPT, _COMPLETION = 3, 4  # after the status classes in VariantChildren.pending


@dataclass(slots=True)
class VariantChildren:
    """Pre-bound label children for one (route, experiment, variant, role).

    Counts go through :meth:`count`. In one process they are added up in plain integers and
    handed to the counters by :meth:`GatewayMetrics.flush` (before every ``/metrics``
    render, and on every config refresh tick): a counter's ``inc`` takes a lock and checks
    its arguments, several times per request, while an integer add is a few bytecodes. With
    several worker processes the counters are written at once (another worker may answer
    the scrape)."""

    requests: dict[str, Any]  # status_class -> counter child
    duration: Any
    ttft: Any
    prompt_tokens: Any
    completion_tokens: Any
    # [2xx, 4xx, 5xx, prompt tokens, completion tokens] not yet added to the counters;
    # None: added at once (several worker processes).
    pending: list[int] | None = None

    def count(self, status_class: str, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """One answered request (``status_class``: 2xx, 4xx or 5xx) and the tokens it reported."""
        pending = self.pending
        if pending is not None:
            pending[_CLASS_INDEX[status_class]] += 1
            if prompt_tokens:
                pending[_PROMPT] += prompt_tokens
            if completion_tokens:
                pending[_COMPLETION] += completion_tokens
            return
        self.requests[status_class].inc()
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
        if completion_tokens:
            self.completion_tokens.inc(completion_tokens)

    def flush(self) -> None:
        pending = self.pending
        if pending is None or not any(pending):
            return
        counters = (*self.requests.values(), self.prompt_tokens, self.completion_tokens)
        for i, counter in enumerate(counters):
            n = pending[i]
            if n:
                pending[i] = 0
                counter.inc(n)


class GatewayMetrics:
    """Declares every metric once on an injectable registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        variant = ["route", "experiment", "variant"]
        self.requests = Counter(
            "liftgate_gateway_requests", "Requests answered", [*variant, "role", "status_class"], registry=r
        )
        self.duration = Histogram(
            "liftgate_gateway_request_duration_seconds",
            "Upstream call latency measured by the gateway",
            [*variant, "role"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "liftgate_gateway_ttft_seconds",
            "Time to first token of streamed responses",
            [*variant, "role"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "liftgate_gateway_tokens", "Tokens reported by upstreams", [*variant, "kind"], registry=r
        )
        self.upstream_errors = Counter(
            "liftgate_gateway_upstream_errors", "Failed upstream calls", [*variant, "error_type"], registry=r
        )
        self.fallbacks = Counter(
            "liftgate_gateway_fallbacks", "Candidate calls retried on the control", variant, registry=r
        )
        self.shadow = Counter(
            "liftgate_gateway_shadow", "Shadow calls by outcome", [*variant, "outcome"], registry=r
        )
        self.judge = Counter(
            "liftgate_gateway_judge",
            "Judge sampler jobs by outcome (queued, dropped, scored, failed)",
            [*variant, "outcome"],
            registry=r,
        )
        self.ngrams = Counter(
            "liftgate_gateway_ngrams",
            "Hashed n-gram sampler jobs by outcome (queued, dropped, hashed, failed)",
            [*variant, "outcome"],
            registry=r,
        )
        self.events = Counter(
            "liftgate_gateway_events_emitted", "Events handed to the sink", ["type"], registry=r
        )
        refused = Counter(
            "liftgate_gateway_refused",
            "Requests answered by the gateway itself (no upstream called)",
            ["reason"],
            registry=r,
        )
        self.refused = {reason: refused.labels(reason) for reason in REFUSALS}
        self.sink_events = Gauge(
            "liftgate_gateway_sink_events",
            "Event sink counters",
            ["state"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.variant_weight = Gauge(
            "liftgate_gateway_variant_weight",
            "Configured traffic share per variant",
            variant,
            registry=r,
            multiprocess_mode="max",
        )
        self.rollout_stage = Gauge(
            "liftgate_gateway_rollout_stage",
            "Current rollout stage index",
            ["route", "experiment"],
            registry=r,
            multiprocess_mode="max",
        )
        self.config_reloads = Counter(
            "liftgate_gateway_config_reloads", "Config snapshot reloads", ["outcome"], registry=r
        )
        self.config_age = Gauge(
            "liftgate_gateway_config_age_seconds",
            "Seconds since the last successful config refresh",
            registry=r,
            multiprocess_mode="max",
        )
        self.feedback_unknown_request = Counter(
            "liftgate_gateway_feedback_unknown_request",
            "Feedback accepted for a request id this process has not served recently",
            registry=r,
        )
        self._children: dict[tuple[str, str, str, str], VariantChildren] = {}
        # One process: counts are batched (VariantChildren, count_interaction) until flush().
        self.batched = not multiprocess_enabled()
        self._interactions = 0
        self.interaction_events = self.events.labels("interaction")
        self.feedback_events = self.events.labels("feedback")
        self.judge_events = self.events.labels("judge")
        self.ngrams_events = self.events.labels("ngrams")

    def children(self, route: str, experiment: str, variant: str, role: str) -> VariantChildren:
        key = (route, experiment, variant, role)
        found = self._children.get(key)
        if found is None:
            found = VariantChildren(
                requests={
                    c: self.requests.labels(route, experiment, variant, role, c) for c in _STATUS_CLASSES
                },
                duration=self.duration.labels(route, experiment, variant, role),
                ttft=self.ttft.labels(route, experiment, variant, role),
                prompt_tokens=self.tokens.labels(route, experiment, variant, "prompt"),
                completion_tokens=self.tokens.labels(route, experiment, variant, "completion"),
                pending=[0] * 5 if self.batched else None,
            )
            # Bounded: keys come from the config snapshot (routes x experiments x variants), not
            # from clients; the cap only guards against a pathological config churn.
            if len(self._children) > 10_000:
                self.flush()
                self._children.clear()
            self._children[key] = found
        return found

    def count_interaction(self) -> None:
        """One interaction event handed to the sink."""
        if self.batched:
            self._interactions += 1
        else:
            self.interaction_events.inc()

    def flush(self) -> None:
        """Add the batched counts to the counters. Called on the event loop's thread, the one
        that counts (the ``/metrics`` route and the config refresh tick run there)."""
        for children in self._children.values():
            children.flush()
        n = self._interactions
        if n:
            self._interactions = 0
            self.interaction_events.inc(n)

    def update_sink(self, stats: dict[str, int]) -> None:
        for state, value in stats.items():
            self.sink_events.labels(state).set(value)

    def render(self) -> tuple[bytes, str]:
        """The exposition text; aggregates all worker processes in multiprocess mode."""
        self.flush()
        if multiprocess_enabled():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def status_class(status: int) -> str:
    if status < 400:
        return "2xx"
    return "4xx" if status < 500 else "5xx"
