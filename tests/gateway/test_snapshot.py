"""What a route serves for each experiment status (pure snapshot logic)."""

from __future__ import annotations

import pytest

from gateway.snapshot import ExperimentConfig, VariantConfig, build_snapshot


def _experiment(status: str, control_weight: float, candidate_weight: float) -> ExperimentConfig:
    return ExperimentConfig(
        id=1,
        name="exp",
        route="assistant",
        mode="rollout",
        status=status,
        salt="s",
        variants=(
            VariantConfig("control", "up-a", "base", control_weight, is_control=True),
            VariantConfig("candidate", "up-b", "cand", candidate_weight),
        ),
    )


@pytest.mark.parametrize(
    ("status", "weights", "served", "active"),
    [
        ("running", (50, 50), "control", True),
        ("paused", (25, 75), "control", False),
        ("rolled_back", (100, 0), "control", False),
        ("completed", (0, 100), "candidate", False),  # a promoted rollout
        ("completed", (50, 50), "control", False),  # ties go to the control
    ],
)
def test_a_route_serves_by_experiment_status(
    status: str, weights: tuple[float, float], served: str, active: bool
) -> None:
    snap = build_snapshot([_experiment(status, *weights)], [])
    route = snap.routes["assistant"]
    assert route.control.name == served
    assert route.active is active
    # The experiment keeps its original control flag, so its report is never inverted.
    assert route.experiment.control.name == "control"


@pytest.mark.parametrize("status", ["draft", "stopped"])
def test_draft_and_stopped_experiments_serve_nothing(status: str) -> None:
    assert build_snapshot([_experiment(status, 100, 0)], []).routes == {}


def test_a_rollout_the_controller_has_not_started_serves_only_its_control() -> None:
    """Created with weights 50/50 but no stage yet (its offline gate has not passed):
    no unit reaches the candidate until the controller starts the first stage."""
    from dataclasses import replace

    from gateway.assignment import choose

    unstarted = _experiment("running", 50, 50)
    route = build_snapshot([unstarted], []).routes["assistant"]
    assert {choose("s", f"user-{i}", route.layout) for i in range(2_000)} == {"control"}
    started = build_snapshot([replace(unstarted, rollout_stage=0)], []).routes["assistant"]
    assert "candidate" in {choose("s", f"user-{i}", started.layout) for i in range(2_000)}
