"""What ``liftgate up`` runs for the demo: the built-in suites against the demo models (their
real skills), then the gate, which blocks the candidate for forgetting code."""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import Engine, text

from liftgate.demo import GATE_EXPERIMENT
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from liftgate.stack import demo_models
from tests.evals.conftest import Arm, make_experiment


def test_the_demo_gate_blocks_the_demo_candidate_for_forgetting_code(
    engine: Engine, module_database_url: str
) -> None:
    fast = [SimulatorModel.from_mapping({**{f: getattr(m, f) for f in ("name", "seed", "skills")},
                                         "latency_ms": 5, "ttft_ms": 1}) for m in demo_models()]  # fmt: skip
    with SimulatorProcess(fast) as sim:
        url = sim.url + "/v1"
        make_experiment(
            engine,
            [Arm("baseline", "baseline", url, True), Arm("candidate", "candidate", url)],
            GATE_EXPERIMENT,
        )
        env = {**os.environ, "LIFTGATE_DATABASE_URL": module_database_url}
        res = subprocess.run([sys.executable, "-m", "liftgate.demo_gate"], env=env, capture_output=True, text=True,
                             timeout=300, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "offline gate for candidate: fail — forgetting: code −" in res.stderr
    with engine.connect() as conn:
        reasons = conn.execute(text("SELECT reasons FROM gate_decisions d JOIN experiments x"
                                    " ON x.id = d.experiment_id WHERE x.name = :n"), {"n": GATE_EXPERIMENT}).scalar_one()  # fmt: skip
    assert len(reasons) == 1 and reasons[0].startswith("forgetting: code −")
