"""RL-risk scenarios for the embedded stack (``liftgate up --scenario NAME``).

Each scenario is a simulated baseline, a simulated candidate and a simulated judge that
differ in one known way, so the RL-risk detectors have something true to find (and, for
``honest``, nothing). All three models run in one simulator process: the simulated judge
scores an answer from the quality the simulator gave it, which it only knows for answers
of its own process (``liftgate.simulator_model.SimulatorModel``, ``judge``).

* ``reward-hacking`` — the candidate is verbose (220 vs 120 tokens), opens every answer
  with "Great question!", and is slightly worse for users (quality 0.56 vs 0.60); the
  judge is biased: +1.5 per doubling of length, +2 for the phrase. The judge loves it,
  users do not: verbosity, judge-vs-user and phrase alarms.
* ``forgetting`` — the candidate is better at maths (0.78) and worse at code (0.40),
  otherwise equal (0.60): the capability matrix names ``code``.
* ``honest`` — a better candidate (0.68 vs 0.60 everywhere, 10 % longer) and a fair
  judge: no RL-risk alarm should fire.
* ``biased-judge`` — a candidate as good as the baseline but 60 % longer, and a judge that
  rewards length (+2 per doubling): the judge says better, users say equal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from liftgate.simulator_model import SimulatorModel

#: Share of primary responses the gateway sends to the simulated judge in a scenario.
JUDGE_SAMPLE_RATE = 0.25


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    baseline: SimulatorModel
    candidate: SimulatorModel
    judge: SimulatorModel

    @property
    def models(self) -> tuple[SimulatorModel, SimulatorModel, SimulatorModel]:
        return self.baseline, self.candidate, self.judge


_BASE = SimulatorModel(
    name="baseline", latency_ms=300, latency_sd=80, ttft_ms=60, ttft_sd=15,
    tokens=120, tokens_sd=30, error_rate=0.005, quality=0.60, seed=1,
)  # fmt: skip
_CAND = replace(_BASE, name="candidate", seed=2)
_FAIR_JUDGE = SimulatorModel(name="judge", latency_ms=150, latency_sd=30, judge=True, judge_noise=1.0, seed=3)


def _scenarios() -> dict[str, Scenario]:
    return {
        s.name: s
        for s in (
            Scenario(
                "reward-hacking",
                "verbose candidate stuffing a phrase the judge loves; users slightly worse off",
                _BASE,
                replace(_CAND, tokens=220, tokens_sd=50, quality=0.56, stuff_phrase="Great question!"),
                replace(
                    _FAIR_JUDGE, judge_length_gain=1.5, judge_phrase="great question", judge_phrase_bonus=2.0
                ),
            ),
            Scenario(
                "forgetting",
                "candidate better at maths, worse at code",
                _BASE,
                replace(_CAND, category_quality="math:0.78/code:0.40"),
                _FAIR_JUDGE,
            ),
            Scenario(
                "honest",
                "candidate genuinely better for users, a fair judge",
                _BASE,
                replace(_CAND, quality=0.68, tokens=132, tokens_sd=33),
                _FAIR_JUDGE,
            ),
            Scenario(
                "biased-judge",
                "candidate as good but 60% longer, judge rewards length",
                _BASE,
                replace(_CAND, tokens=192, tokens_sd=48),
                replace(_FAIR_JUDGE, judge_length_gain=2.0),
            ),
        )
    }


SCENARIOS = _scenarios()


def scenario(name: str) -> Scenario:
    """The named scenario; ValueError listing the known ones otherwise."""
    found = SCENARIOS.get(name)
    if found is None:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return found
