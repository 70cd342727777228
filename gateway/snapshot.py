"""The in-memory config snapshot the request path reads: routes -> experiment -> variants -> upstreams.

The snapshot is immutable (frozen dataclasses); the loader builds a new one in the background
and swaps a single reference, so a request never sees half a config and never touches the
database.

What a route serves, by the status of its experiments (``contracts.tables.Experiment``):

* ``running`` — the experiment decides (A/B/n, shadow or rollout); events are attributed.
* ``paused``, ``rolled_back`` — everyone gets the **control**; events have mode ``"none"`` and
  no experiment attribution. This keeps a route alive between experiments.
* ``completed`` — everyone gets the **baseline**: the variant with the largest weight (the
  control on ties). A promoted rollout leaves its candidate at weight 100 and the old
  control at 0, so the candidate serves the route while the experiment keeps its original
  control flag — its report still reads "candidate vs control", not inverted.
* ``draft``, ``stopped`` — never serve. A route whose only experiments are draft/stopped
  answers 404 ``model_not_found``.

When several experiments could serve a route, the running one wins, else the most recently
updated paused/completed/rolled_back one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.assignment import Layout, layout_from_weights

SERVING_STATUSES = ("running", "paused", "completed", "rolled_back")


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    name: str
    base_url: str
    api_key: str | None = None
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    max_connections: int = 100


@dataclass(frozen=True, slots=True)
class VariantConfig:
    name: str
    upstream: str
    model: str
    weight: float = 0.0
    is_control: bool = False


@dataclass(frozen=True, slots=True)
class ExperimentConfig:
    id: int
    name: str
    route: str
    mode: str  # ab | shadow | rollout
    status: str
    salt: str
    variants: tuple[VariantConfig, ...]
    unit_key: str = "auto"
    coverage: float = 1.0
    targeting: tuple[Mapping[str, Any], ...] = ()
    forced: Mapping[str, str] = field(default_factory=dict)
    shadow_sample_rate: float = 1.0
    fallback_to_control: bool = False
    content_logging: str = "none"
    rollout_stage: int | None = None
    # Blinding: the response's ``model`` is the route asked for; the variant header is sent
    # "on_request" (X-Liftgate-Show-Variant: true), "always" or "never".
    echo_model: bool = True
    variant_header: str = "on_request"

    @property
    def control(self) -> VariantConfig:
        return next(v for v in self.variants if v.is_control)

    @property
    def baseline(self) -> VariantConfig:
        """What a non-running experiment serves to everyone (see the module docstring)."""
        if self.status != "completed":
            return self.control
        return max(self.variants, key=lambda v: (v.weight, v.is_control))

    @property
    def candidates(self) -> tuple[VariantConfig, ...]:
        return tuple(v for v in self.variants if not v.is_control)


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """What the hot path needs for one route, precomputed."""

    route: str
    experiment: ExperimentConfig
    active: bool  # running: assignment applies and events are attributed
    layout: Layout
    control: VariantConfig
    by_name: Mapping[str, VariantConfig]
    shadows: tuple[VariantConfig, ...]  # candidates mirrored in shadow mode
    # unit id -> its variant under this layout (gateway.routing.decide): a unit sends many
    # requests, and its variant is a pure function of the unit while the snapshot lasts.
    assigned: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)


def build_route(exp: ExperimentConfig) -> RouteConfig:
    # A rollout the controller has not started (no stage yet: e.g. its offline gate has not
    # passed) serves only its control, whatever weights it was created with.
    unstarted = exp.mode == "rollout" and exp.rollout_stage is None
    layout = layout_from_weights(
        [
            (v.name, (1.0 if v.is_control else 0.0) if unstarted else v.weight, v.is_control)
            for v in exp.variants
        ]
    )
    return RouteConfig(
        route=exp.route,
        experiment=exp,
        active=exp.status == "running",
        layout=layout,
        control=exp.control if exp.status == "running" else exp.baseline,
        by_name={v.name: v for v in exp.variants},
        shadows=exp.candidates if exp.mode == "shadow" else (),
    )


@dataclass(frozen=True, slots=True)
class Snapshot:
    routes: Mapping[str, RouteConfig]
    upstreams: Mapping[str, UpstreamConfig]
    api_key_hashes: frozenset[str] = frozenset()
    version: str = ""
    # Custom feedback kinds something declares (a metric definition's ``counters['kind']``):
    # /v1/feedback refuses any other custom kind (gateway.feedback).
    feedback_kinds: frozenset[str] = frozenset()


EMPTY = Snapshot(routes={}, upstreams={})


def build_snapshot(
    experiments: list[ExperimentConfig],
    upstreams: list[UpstreamConfig],
    api_key_hashes: frozenset[str] = frozenset(),
    version: str = "",
    updated_order: Mapping[int, float] | None = None,
    feedback_kinds: frozenset[str] = frozenset(),
) -> Snapshot:
    """Pick the serving experiment per route (see module docstring) and precompute its layout."""
    order = updated_order or {}
    best: dict[str, ExperimentConfig] = {}
    for exp in experiments:
        if exp.status not in SERVING_STATUSES or not any(v.is_control for v in exp.variants):
            continue
        cur = best.get(exp.route)
        if cur is None:
            best[exp.route] = exp
            continue
        rank = (exp.status == "running", order.get(exp.id, 0.0), exp.id)
        cur_rank = (cur.status == "running", order.get(cur.id, 0.0), cur.id)
        if rank > cur_rank:
            best[exp.route] = exp
    return Snapshot(
        routes={route: build_route(exp) for route, exp in best.items()},
        upstreams={u.name: u for u in upstreams},
        api_key_hashes=api_key_hashes,
        version=version,
        feedback_kinds=feedback_kinds,
    )
