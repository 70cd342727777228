"""Real PostgreSQL (a database per module) and a real simulator with per-category skills."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, create_engine, insert

from contracts.tables import Experiment, Upstream, Variant
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess

SKILLS = {
    "base": "math:0.65/code:0.85/json:0.85/instruction_following:0.8",
    "cand": "math:0.9/code:0.45/json:0.85/instruction_following:0.8",
}
SIM_MODELS = (
    SimulatorModel(
        name="base", latency_ms=4, latency_sd=1, ttft_ms=1, ttft_sd=0, seed=1, skills=SKILLS["base"]
    ),
    SimulatorModel(
        name="cand", latency_ms=4, latency_sd=1, ttft_ms=1, ttft_sd=0, seed=2, skills=SKILLS["cand"]
    ),
    SimulatorModel(
        name="slow", latency_ms=150, latency_sd=0, ttft_ms=1, ttft_sd=0, seed=1, skills=SKILLS["base"]
    ),
    SimulatorModel(
        name="flaky",
        latency_ms=2,
        latency_sd=0,
        ttft_ms=1,
        ttft_sd=0,
        seed=1,
        error_rate=0.2,
        skills=SKILLS["base"],
    ),
)


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with SimulatorProcess(SIM_MODELS) as sim:
        yield sim.url + "/v1"


@pytest.fixture(scope="module")
def engine(module_database_url: str) -> Iterator[Engine]:
    eng = create_engine(module_database_url, pool_size=5, max_overflow=10)
    yield eng
    eng.dispose()


@dataclass(frozen=True)
class Arm:
    variant: str
    model: str
    base_url: str
    control: bool = False


def make_experiment(engine: Engine, arms: list[Arm], name: str | None = None) -> str:
    """An experiment with one upstream per arm (committed: the runner uses its own connections)."""
    name = name or f"exp-{secrets.token_hex(4)}"
    with engine.begin() as conn:
        exp_id = conn.execute(insert(Experiment).values(name=name, route=name, mode="ab", salt="s")
                              .returning(Experiment.id)).scalar_one()  # fmt: skip
        for arm in arms:
            upstream = f"{name}-{arm.variant}"
            up_id = conn.execute(insert(Upstream).values(name=upstream, base_url=arm.base_url, timeout_s=10)
                                 .returning(Upstream.id)).scalar_one()  # fmt: skip
            conn.execute(insert(Variant).values(experiment_id=exp_id, name=arm.variant, upstream_id=up_id,
                                                model=arm.model, weight=50, is_control=arm.control))  # fmt: skip
    return name
