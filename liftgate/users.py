"""Simulated users: who they are, what they ask, and how they react to an answer.

Pure logic, no I/O (the async driver lives in :mod:`liftgate.traffic`). Real products see
a few heavy users sending most requests, so activity weights are lognormal; users also
differ in how often they leave feedback at all. Reactions are drawn from the *quality*
(0..1) of the model that answered, which the simulator reports with every response:

* thumbs: a user who votes gives thumbs-up with probability ``quality``;
* regenerate: probability ``regenerate_max * (1 - quality)``;
* copy: probability ``copy_max * quality`` (higher for code answers);
* rating (1..5): ``1 + 4 * quality`` plus noise, rounded;
* continued: the conversation goes on with probability ``continue_base + continue_gain * quality``
  (the next turn sends a ``continued`` signal for the previous answer).

So a candidate with a higher configured quality earns measurably more thumbs-up,
fewer regenerations and longer conversations, and tests can compute the expected rates.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

TASKS = ("code", "math", "chat")
_TASK_WEIGHTS = (0.35, 0.2, 0.45)
_PROMPTS = {
    "code": (
        "Write a Python function that {verb} a list of {noun}.",
        "Why does my {noun} loop raise an IndexError when I {verb} it?",
        "Refactor this snippet so it can {verb} {noun} in parallel.",
    ),
    "math": (
        "What is the derivative of x^{n} times log x?",
        "Prove that the sum of the first {n} odd numbers is a square.",
        "How many ways can {n} {noun} be arranged in a circle?",
    ),
    "chat": (
        "Can you suggest a name for a team that {verb}s {noun}?",
        "Summarise the pros and cons of {noun} in {n} bullet points.",
        "Help me write a polite e-mail asking to {verb} the {noun}.",
    ),
}
_FOLLOW_UPS = (
    "Can you explain that in more detail?",
    "Thanks. What about edge cases?",
    "Shorter please.",
    "Can you give an example?",
)
_VERBS = ("sort", "merge", "filter", "rank", "cache", "stream")
_NOUNS = ("invoices", "tokens", "requests", "users", "vectors", "orders")


@dataclass(frozen=True, slots=True)
class FeedbackModel:
    """How users turn answer quality into signals (probabilities per answer)."""

    vote_rate: float = 0.35
    regenerate_max: float = 0.3
    copy_max: float = 0.35
    copy_code_boost: float = 1.6
    rating_rate: float = 0.1
    rating_noise: float = 0.6
    continue_base: float = 0.25
    continue_gain: float = 0.4
    max_turns: int = 6


@dataclass(frozen=True, slots=True)
class SimUser:
    """One stable user: id, relative activity, and personal feedback propensity."""

    user_id: str
    activity: float
    vote_propensity: float
    task_mix: tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class Signal:
    """One feedback signal to post for a response."""

    kind: str
    value: float = 1.0


def build_population(
    n_users: int, *, seed: int = 0, activity_sigma: float = 1.3, prefix: str = "user"
) -> list[SimUser]:
    """``n_users`` users with lognormal activity: a few heavy users, a long tail of light ones.

    Ids are stable for (prefix, seed, index), so two runs with the same seed reuse users
    (and, with sticky assignment, their variants).
    """
    if n_users < 1:
        raise ValueError("n_users must be >= 1")
    rng = random.Random(f"population:{seed}")
    users = []
    for i in range(n_users):
        activity = rng.lognormvariate(0.0, activity_sigma)
        # Some people vote on almost everything, most rarely: a Beta around the model's mean.
        propensity = rng.betavariate(1.2, 1.2)
        mix = [w * rng.uniform(0.3, 1.7) for w in _TASK_WEIGHTS]
        total = sum(mix)
        users.append(
            SimUser(
                user_id=f"{prefix}-{seed}-{i:05d}",
                activity=activity,
                vote_propensity=2 * propensity,
                task_mix=(mix[0] / total, mix[1] / total, mix[2] / total),
            )
        )
    return users


class UserPicker:
    """Draws the next user to start a conversation, proportionally to activity."""

    def __init__(self, users: list[SimUser], rng: random.Random) -> None:
        self._users = users
        self._rng = rng
        cum, acc = [], 0.0
        for u in users:
            acc += u.activity
            cum.append(acc)
        self._cum = cum

    def pick(self) -> SimUser:
        return self._rng.choices(self._users, cum_weights=self._cum, k=1)[0]


def pick_task(user: SimUser, rng: random.Random) -> str:
    return rng.choices(TASKS, weights=user.task_mix, k=1)[0]


def first_prompt(task: str, rng: random.Random) -> str:
    template = rng.choice(_PROMPTS[task])
    return template.format(verb=rng.choice(_VERBS), noun=rng.choice(_NOUNS), n=rng.randint(2, 12))


def follow_up(rng: random.Random) -> str:
    return rng.choice(_FOLLOW_UPS)


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def continue_probability(quality: float, model: FeedbackModel) -> float:
    return _clip01(model.continue_base + model.continue_gain * quality)


def react(quality: float, task: str, user: SimUser, rng: random.Random, model: FeedbackModel) -> list[Signal]:
    """The signals a user leaves for one answer of the given quality (may be empty)."""
    q = _clip01(quality)
    out: list[Signal] = []
    if rng.random() < _clip01(model.vote_rate * user.vote_propensity):
        out.append(Signal("thumbs_up" if rng.random() < q else "thumbs_down"))
    if rng.random() < model.regenerate_max * (1.0 - q):
        out.append(Signal("regenerate"))
    copy_p = model.copy_max * q * (model.copy_code_boost if task == "code" else 1.0)
    if rng.random() < _clip01(copy_p):
        out.append(Signal("copy"))
    if rng.random() < model.rating_rate:
        stars = 1.0 + 4.0 * q + rng.gauss(0.0, model.rating_noise)
        out.append(Signal("rating", float(min(5, max(1, round(stars))))))
    return out


def expected_rates(quality: float, model: FeedbackModel, *, mean_propensity: float = 1.0) -> dict[str, float]:
    """Per-answer expected signal rates for an average user (what tests check against)."""
    q = _clip01(quality)
    vote = _clip01(model.vote_rate * mean_propensity)
    return {
        "thumbs_up": vote * q,
        "thumbs_down": vote * (1.0 - q),
        "regenerate": model.regenerate_max * (1.0 - q),
        "rating_mean": 1.0 + 4.0 * q,
        "continue": continue_probability(q, model),
    }


def turns_bound(model: FeedbackModel) -> int:
    return max(1, model.max_turns)


def lognormal_think_time(rng: random.Random, mean_s: float) -> float:
    """A pause between turns (seconds); zero keeps accelerated runs fast."""
    if mean_s <= 0:
        return 0.0
    sigma = 0.6
    return rng.lognormvariate(math.log(mean_s) - sigma * sigma / 2, sigma)
