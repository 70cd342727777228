"""Seeded, vectorised synthetic traffic for the RL-risk detectors' calibration tests.

Per arm, ``units`` users each send 1 + Poisson(2) responses (clustered: every unit has
its own taste u_i ~ N(0, 0.5²)). A response has a category, a latent quality q, a length
and a user outcome y ~ Bernoulli(σ(q + u_i + γ·log2(length/120))) — on the control,
longer answers are a little better liked (γ > 0), which is what makes "the gain is just
length" possible. A judge scores s = q + N(0, 0.7²) (+ a bias on the candidate when it is
gamed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CATEGORIES = ("code", "math", "chat", "other")
MIX = (0.35, 0.2, 0.35, 0.1)


@dataclass(frozen=True)
class Arm:
    """How one arm behaves; the defaults are the control."""

    length_factor: float = 1.0
    quality: float = 0.0  # added to every response's latent quality
    by_category: dict[int, float] = field(default_factory=dict)  # category -> quality shift
    judge_bias: float = 0.0  # added to judge scores only (users do not see it)
    judge_noise: float = 0.7
    mix: tuple[float, ...] = MIX
    gamma: float = 0.4  # user outcome per doubling of length


@dataclass(frozen=True)
class Responses:
    unit: np.ndarray
    arm: np.ndarray
    category: np.ndarray
    tokens: np.ndarray
    y: np.ndarray
    score: np.ndarray


def simulate(rng: np.random.Generator, units: int, control: Arm, candidate: Arm) -> Responses:
    parts = []
    for a, spec in enumerate((control, candidate)):
        m = 1 + rng.poisson(2.0, units)
        unit = np.repeat(np.arange(units) + a * units, m)
        taste = rng.normal(0.0, 0.5, units)[unit - a * units]
        n = len(unit)
        cat = rng.choice(len(spec.mix), size=n, p=np.asarray(spec.mix) / sum(spec.mix))
        q = rng.normal(0.0, 1.0, n) + spec.quality
        for k, shift in spec.by_category.items():
            q = q + np.where(cat == k, shift, 0.0)
        tokens = np.maximum(1.0, 120.0 * spec.length_factor * rng.lognormal(-0.08, 0.4, n))
        logit = q + taste + spec.gamma * np.log2(tokens / 120.0) - 0.3
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(float)
        score = q + rng.normal(0.0, spec.judge_noise, n) + spec.judge_bias
        parts.append((unit, np.full(n, a), cat, tokens, y, score))
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    return Responses(*cols)
