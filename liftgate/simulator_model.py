"""What a simulated model does: its configuration, its random draws and its text.

A :class:`SimulatorModel` describes one served model (latency, time to first token,
verbosity, error rate, quality). :class:`ModelBehaviour` turns it into per-request
decisions. Two kinds of randomness are kept apart on purpose:

* the *content* (text and its length) is a pure function of (model seed, model name,
  prompt), so the same prompt always gets the same answer — tests and paired shadow
  comparisons rely on that;
* *timing and errors* come from one seeded generator per model, so a run is repeatable
  for a given request order while still varying between identical prompts.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass, fields
from typing import Any

# A neutral vocabulary; one word counts as one completion token.
_WORDS = [
    "the",
    "model",
    "answers",
    "with",
    "a",
    "short",
    "and",
    "careful",
    "explanation",
    "of",
    "each",
    "step",
    "so",
    "that",
    "readers",
    "can",
    "follow",
    "the",
    "reasoning",
    "check",
    "the",
    "result",
    "and",
    "apply",
    "it",
    "to",
    "their",
    "own",
    "problem",
    "while",
    "keeping",
    "in",
    "mind",
    "edge",
    "cases",
    "limits",
    "assumptions",
    "data",
    "units",
    "tests",
    "performance",
    "memory",
    "latency",
    "cost",
    "quality",
    "safety",
    "context",
    "examples",
    "code",
    "math",
    "chat",
    "summary",
    "detail",
    "option",
    "choice",
    "value",
    "error",
    "retry",
    "request",
    "response",
    "token",
    "stream",
    "user",
    "system",
    "prompt",
    "plan",
    "review",
    "improve",
    "measure",
    "compare",
    "baseline",
    "candidate",
    "ramp",
]
_CORPUS_LEN = 8192


@dataclass(frozen=True, slots=True)
class SimulatorModel:
    """One simulated served model. Times in milliseconds; ``*_sd`` are standard deviations.

    ``latency_ms`` is the mean total response time and ``ttft_ms`` the mean time to the
    first streamed token (both lognormal); ``tokens`` is the mean completion length
    (lognormal, derived from the prompt). ``error_rate`` is the share of requests that fail
    (HTTP 500, or an error frame mid-stream for ``midstream_error_share`` of streamed
    failures). ``hang`` makes every request wait ``hang_s`` without answering. ``quality``
    (0..1) is only reported (``X-Sim-Quality`` header, ``sim_quality`` body field) for
    simulated users to draw feedback from. ``skills`` ("math:0.9/code:0.5", categories of
    the built-in eval suites) makes the model answer those suites' prompts: correctly with
    that probability (the item's reference), else with one of its known-wrong outputs —
    a pure function of (seed, name, prompt, request seed), like the text.

    RL-risk scenarios: ``category_quality`` ("math:0.8/code:0.3") overrides ``quality`` for
    prompts of those task categories (the gateway's built-in rules tell them apart);
    ``stuff_phrase`` starts every answer with that phrase. ``judge`` makes the model a judge:
    it answers a rubric prompt with a score in 1..10 — ``1 + 9·q`` for an answer this simulator
    produced with quality q (5.5 for one it does not know), plus ``judge_length_gain`` per
    doubling of the answer's words beyond 120, plus ``judge_phrase_bonus`` when the answer
    contains ``judge_phrase``, plus N(0, ``judge_noise``²) — a judge that tracks what users
    react to, with the biases an RL policy can exploit.
    """

    name: str
    latency_ms: float = 200.0
    latency_sd: float = 50.0
    ttft_ms: float = 40.0
    ttft_sd: float = 10.0
    tokens: float = 120.0
    tokens_sd: float = 30.0
    error_rate: float = 0.0
    midstream_error_share: float = 0.5
    hang: bool = False
    hang_s: float = 3600.0
    quality: float = 0.5
    seed: int = 0
    chunk_tokens: int = 4
    embedding_dim: int = 64
    max_model_len: int = 8192
    skills: str = ""
    category_quality: str = ""
    stuff_phrase: str = ""
    judge: bool = False
    judge_phrase: str = ""
    judge_phrase_bonus: float = 0.0
    judge_length_gain: float = 0.0
    judge_noise: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or "," in self.name or "=" in self.name:
            raise ValueError(f"invalid model name {self.name!r}")
        for attr in ("latency_ms", "latency_sd", "ttft_ms", "ttft_sd", "tokens", "tokens_sd", "hang_s"):
            if getattr(self, attr) < 0:
                raise ValueError(f"{attr} must be >= 0")
        for attr in ("error_rate", "midstream_error_share", "quality"):
            if not 0.0 <= getattr(self, attr) <= 1.0:
                raise ValueError(f"{attr} must be within [0, 1]")
        if self.chunk_tokens < 1 or self.embedding_dim < 1:
            raise ValueError("chunk_tokens and embedding_dim must be >= 1")
        parse_skills(self.skills)
        for value in parse_skills(self.category_quality).values():
            if not 0.0 <= value <= 1.0:
                raise ValueError("category_quality values must be within [0, 1]")
        if "," in self.stuff_phrase or "," in self.judge_phrase:
            raise ValueError("phrases cannot contain ',' (the --model separator)")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> SimulatorModel:
        """Build from a config-file entry or parsed CLI option, converting value types."""
        types = {f.name: f.type for f in fields(cls)}
        unknown = data.keys() - types.keys()
        if unknown:
            raise ValueError(f"unknown simulator model option(s): {sorted(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            kind = types[key]
            if kind == "bool" and isinstance(value, str):
                kwargs[key] = value.strip().lower() in ("1", "true", "yes", "on")
            elif kind == "bool":
                kwargs[key] = bool(value)
            elif kind == "int":
                kwargs[key] = int(value)
            elif kind == "float":
                kwargs[key] = float(value)
            else:
                kwargs[key] = str(value)
        return cls(**kwargs)

    @classmethod
    def parse(cls, spec: str) -> SimulatorModel:
        """Parse ``name=baseline,latency_ms=200,quality=0.6`` (the ``--model`` CLI form)."""
        data: dict[str, Any] = {}
        for part in spec.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"expected key=value, got {part!r}")
            data[key.strip()] = value.strip()
        if "name" not in data:
            raise ValueError(f"model spec needs name=...: {spec!r}")
        return cls.from_mapping(data)

    def to_spec(self) -> str:
        """The inverse of :meth:`parse`: a ``--model`` argument for a subprocess."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def parse_skills(text: str) -> dict[str, float]:
    """``"math:0.9/code:0.5"`` -> {"math": 0.9, "code": 0.5} (probabilities of a right answer)."""
    skills: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split("/"))):
        category, sep, value = part.partition(":")
        try:
            p = float(value)
        except ValueError:
            p = -1.0
        if not sep or not category or not 0.0 <= p <= 1.0:
            raise ValueError(f"skills: expected CATEGORY:P with P in [0, 1], got {part!r}")
        skills[category] = p
    return skills


def _lognormal(rng: random.Random, mean: float, sd: float) -> float:
    """A lognormal draw with the given mean and standard deviation (not log-space ones)."""
    if mean <= 0:
        return 0.0
    if sd <= 0:
        return mean
    sigma2 = math.log1p((sd / mean) ** 2)
    return rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))


@dataclass(frozen=True, slots=True)
class Draw:
    """The timing and outcome of one request (seconds)."""

    ttft_s: float
    latency_s: float
    error: bool
    midstream: bool


class ModelBehaviour:
    """Per-process state of one model: its timing generator and its word corpus."""

    def __init__(self, model: SimulatorModel) -> None:
        self.model = model
        self._rng = random.Random(f"timing:{model.seed}:{model.name}")
        corpus_rng = random.Random(f"corpus:{model.seed}:{model.name}")
        corpus = [" " + corpus_rng.choice(_WORDS) for _ in range(_CORPUS_LEN)]
        # Doubled, so any answer is one slice (no per-word indexing on the request path).
        self._tokens = corpus + corpus
        self._salt = f"{model.seed}:{model.name}:".encode()
        self._skills = parse_skills(model.skills)
        self._answers: dict[str, Any] | None = None
        self._category_quality = parse_skills(model.category_quality)
        self._rules: Any = None
        self._judge_seed = f"judge:{model.seed}:{model.name}:".encode()

    def quality_for(self, prompt: str) -> float:
        """The model's quality on this prompt: per task category when configured."""
        if not self._category_quality:
            return self.model.quality
        if self._rules is None:
            from gateway.category import default_rules  # the composition root may import gateway

            self._rules = default_rules()
        category = self._rules.categorize({"prompt": prompt}, "completions", {})
        return self._category_quality.get(category, self.model.quality)

    def stuffed(self, tokens: list[str]) -> list[str]:
        """The answer with ``stuff_phrase`` in front (unchanged without one)."""
        if not self.model.stuff_phrase:
            return tokens
        words = self.model.stuff_phrase.split()
        head = [words[0], *(" " + w for w in words[1:])]
        if not tokens:
            return head
        return [*head, " " + tokens[0].lstrip(), *tokens[1:]]

    def judge_score(self, answer: str, known_quality: float | None) -> float:
        """A simulated judge's score of ``answer`` (see :class:`SimulatorModel`)."""
        m = self.model
        score = 1.0 + 9.0 * known_quality if known_quality is not None else 5.5
        words = max(1, len(answer.split()))
        score += m.judge_length_gain * math.log2(words / 120.0)
        if m.judge_phrase and m.judge_phrase.lower() in answer.lower():
            score += m.judge_phrase_bonus
        if m.judge_noise > 0:
            # Drawn per answer (seeded by its text), not in call order: the same answers get the
            # same scores however concurrent calls interleave, so a run is reproducible.
            noise = random.Random(self._judge_seed + answer.strip().encode())
            score += noise.gauss(0.0, m.judge_noise)
        return round(min(10.0, max(1.0, score)), 2)

    def draw(self) -> Draw:
        m, rng = self.model, self._rng
        ttft = _lognormal(rng, m.ttft_ms, m.ttft_sd)
        latency = max(_lognormal(rng, m.latency_ms, m.latency_sd), ttft)
        error = m.error_rate > 0 and rng.random() < m.error_rate
        midstream = error and rng.random() < m.midstream_error_share
        return Draw(ttft / 1000.0, latency / 1000.0, error, midstream)

    def _digest(self, prompt: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(self._salt + prompt, digest_size=8).digest(), "little")

    def completion(self, prompt: bytes, max_tokens: int | None) -> tuple[list[str], str]:
        """The answer's tokens (words with their leading space) and its finish reason."""
        digest = self._digest(prompt)
        length_rng = random.Random(digest)
        wanted = max(1, round(_lognormal(length_rng, self.model.tokens, self.model.tokens_sd)))
        finish = "stop"
        if max_tokens is not None and 0 < max_tokens < wanted:
            wanted, finish = max_tokens, "length"
        start = digest % _CORPUS_LEN
        tokens = self._tokens[start : start + min(wanted, _CORPUS_LEN)]
        tokens[0] = tokens[0][1:]  # no leading space before the first word
        return tokens, finish

    def eval_answer(self, prompt: str, request_seed: object = None) -> list[str] | None:
        """The answer tokens for a built-in eval prompt of a category with a skill, else None."""
        if not self._skills:
            return None
        if self._answers is None:
            from evals.datasets.builtin import builtin_suite  # the composition root may import evals

            self._answers = {b.item.prompt_text(): b for b in builtin_suite("demo")}
        found = self._answers.get(prompt)
        skill = self._skills.get(found.item.category) if found is not None else None
        if found is None or skill is None:
            return None
        digest = self._digest(f"eval:{request_seed}:{prompt}".encode())
        if (digest % 1_000_000) / 1_000_000 < skill:
            text = str(found.item.reference)
        else:
            text = found.wrong[(digest // 1_000_000) % len(found.wrong)]
        return re.findall(r"\s*\S+|\s+", text)

    def embedding(self, text: bytes) -> list[float]:
        """A unit-length vector that depends only on (seed, model, text)."""
        rng = random.Random(self._digest(text))
        vec = [rng.gauss(0.0, 1.0) for _ in range(self.model.embedding_dim)]
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]


def count_prompt_tokens(text: str) -> int:
    """A rough, deterministic prompt token count (about four characters per token)."""
    return max(1, (len(text) + 3) // 4)
