"""The experiment files shipped in examples/ and the experiments `liftgate up` creates are
what the control plane accepts: a field renamed or added there breaks this test, not a
user's first `liftgate experiments create -f examples/experiment.yaml`."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.bodies import ExperimentIn, UpstreamIn
from liftgate.demo import Upstream, demo_experiments
from liftgate.experiment_file import load_experiment_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["experiment.yaml", "compose-demo.yaml"])
def test_every_shipped_experiment_file_validates_against_the_control_planes_bodies(name: str) -> None:
    upstreams, experiments = load_experiment_file(EXAMPLES / name)
    assert upstreams and experiments
    for up in upstreams:
        UpstreamIn.model_validate(up)
    for exp in experiments:
        ExperimentIn.model_validate(exp)


def test_the_demo_experiments_validate_and_break_results_down_by_the_simulated_task() -> None:
    control = Upstream("baseline", "http://127.0.0.1:8001/v1", "baseline")
    candidate = Upstream("candidate", "http://127.0.0.1:8002/v1", "candidate")
    for exp in demo_experiments(control, candidate):
        body = ExperimentIn.model_validate(exp)
        assert body.segment_tags == ["task"]  # the simulated users tag each call with its task
