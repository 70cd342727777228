"""A model simulator process shared by the simulator tests (real HTTP, real child process)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

SIM_MODELS = (
    SimulatorModel(
        name="fast", latency_ms=5, latency_sd=0, ttft_ms=2, ttft_sd=0, tokens=40, tokens_sd=10, seed=7
    ),
    SimulatorModel(
        name="timed", latency_ms=300, latency_sd=0, ttft_ms=120, ttft_sd=0, tokens=64, tokens_sd=0, seed=7
    ),
    SimulatorModel(name="flaky", latency_ms=1, latency_sd=0, ttft_ms=1, ttft_sd=0, error_rate=0.3, seed=7),
    SimulatorModel(
        name="broken-stream",
        latency_ms=1,
        ttft_ms=1,
        error_rate=1.0,
        midstream_error_share=1.0,
        tokens=40,
        tokens_sd=0,
    ),
    SimulatorModel(name="stuck", hang=True, hang_s=60, quality=0.2),
    SimulatorModel(name="good", latency_ms=1, ttft_ms=1, quality=0.8),
)


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with SimulatorProcess(SIM_MODELS) as sim:
        yield sim.url
