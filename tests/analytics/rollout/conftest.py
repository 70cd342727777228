"""Fixtures for rollout tests (helpers live in :mod:`tests.analytics.rollout.synthetic`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from analytics.rollout.controller import Controller
from analytics.rollout.telemetry import for_registry
from tests.analytics.rollout.synthetic import Clock


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def controller(engine: Engine, registry: CollectorRegistry, clock: Clock) -> Iterator[Controller]:
    yield Controller(engine, for_registry(registry), clock=clock, srm_grace_s=2.0)
