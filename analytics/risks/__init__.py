"""RL-risk detectors on live traffic: pure functions over sufficient statistics / arrays.

An RL-trained candidate can win its reward and lose its users. Each detector answers one
way that happens, with an alarm that fires on an honest candidate (including A/A) with
probability ≤ α under continuous monitoring (always-valid p-values):

* :func:`capability_matrix` — per category × metric harm (forgetting), Holm for
  decisions, BH for exploration, empirical-Bayes shrinkage for display, per-category
  guardrails;
* :func:`category_mix` — the category mix per arm (an SRM-style check);
* :func:`verbosity` — length shift and the length-explained / residual split of a lift;
* :func:`judge_divergence` — the judge's predicted user lift against the observed one,
  and the judge-to-user correlation;
* :func:`stuffed_phrases` — phrases over-represented in the candidate.

Formulas and references: ``docs/rl-risks.md``.
"""

from analytics.risks.curve import Cells, Decomposition, length_bin, residual_decomposition, score_bin
from analytics.risks.evidence import Evidence, evidence
from analytics.risks.judge import (
    CorrelationDrop,
    JudgeDivergence,
    PairMoments,
    correlation_drop,
    judge_divergence,
)
from analytics.risks.matrix import CapabilityMatrix, Guardrail, MatrixInput, capability_matrix, shrink
from analytics.risks.mix import MixResult, MixStats, category_mix
from analytics.risks.phrases import PhraseArm, PhraseResult, stuffed_phrases
from analytics.risks.verbosity import LengthShift, VerbosityResult, length_shift, verbosity

__all__ = [
    "CapabilityMatrix",
    "Cells",
    "CorrelationDrop",
    "Decomposition",
    "Evidence",
    "Guardrail",
    "JudgeDivergence",
    "LengthShift",
    "MatrixInput",
    "MixResult",
    "MixStats",
    "PairMoments",
    "PhraseArm",
    "PhraseResult",
    "VerbosityResult",
    "capability_matrix",
    "category_mix",
    "correlation_drop",
    "evidence",
    "judge_divergence",
    "length_bin",
    "length_shift",
    "residual_decomposition",
    "score_bin",
    "shrink",
    "stuffed_phrases",
    "verbosity",
]
