"""The demo's offline gate, run by ``liftgate up`` once the stack is ready (as a child process).

Declares the ``demo-gate`` experiment's ``offline_gate`` (when it has none), runs the built-in
``demo`` suite against both variants, and decides: the simulated candidate, better at math
and worse at code, is blocked with "forgetting: code −X pts". ``liftgate eval show demo-gate``
shows the evidence. ``demo-gate`` has the demo's two models and is never started (a failing
decision would pause a running A/B test that shows the candidate: ``demo`` keeps its users).
Exits 0 whatever the verdict (the decision is recorded); 1 on errors.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from evals import gatekeeper, store
from evals.datasets import load_dataset
from evals.gate import OfflineGate
from evals.runner import RunnerSettings, run_experiment
from liftgate import db
from liftgate.demo import GATE_EXPERIMENT as EXPERIMENT

log = logging.getLogger("liftgate.demo_gate")
DEMO_GATE = OfflineGate(suites=("demo",), margins={"code": 0.05, "math": 0.05}, default_margin=0.05)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    engine = db.make_engine(os.environ["LIFTGATE_DATABASE_URL"])
    try:
        with engine.begin() as conn:
            exp = store.experiment(conn, EXPERIMENT)
            if store.declaration(conn, exp.id) is None:
                store.set_declaration(conn, exp.id, DEMO_GATE.model_dump(mode="json"), "liftgate-up")
            gate = OfflineGate.model_validate(store.declaration(conn, exp.id))
        settings = RunnerSettings(params=gate.params, samples=gate.samples)
        dataset = load_dataset("demo")
        for run in asyncio.run(run_experiment(engine, dataset, exp.targets, settings, experiment_id=exp.id)):
            log.info("eval run %s (%s): %s/%s passed, %s failed calls", run.run_id, run.variant, run.passed,
                     run.outputs, run.errors)  # fmt: skip
        _, outcomes = gatekeeper.evaluate(engine, EXPERIMENT, None, "liftgate-up")
        for o in outcomes:
            log.info("offline gate for %s: %s — %s", o.candidate.variant, o.decision.verdict,
                     "; ".join(o.decision.reasons) or "every category passed")  # fmt: skip
    except (store.StoreError, KeyError) as exc:
        log.error("offline gate demo failed: %s", exc)
        return 1
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
