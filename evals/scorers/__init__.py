"""Scorers: an item's spec + a model's output -> :class:`Score` (passed, score, reason).

Verifiable scorers (answer, regex, json_schema, constraints, python_tests) need nothing
but the output; ``judge`` and ``reward_model`` need an :class:`Endpoint` in the context and
fail (never pass) without one. ``SCORER_VERSION`` is part of every cached score's key:
bump it whenever a scorer's verdicts change.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp

from evals.items import (
    AnswerSpec,
    ConstraintsSpec,
    EvalItem,
    JsonSchemaSpec,
    JudgeSpec,
    PythonTestsSpec,
    RegexSpec,
    RewardModelSpec,
)
from evals.scorers.answer import score_answer
from evals.scorers.base import Score
from evals.scorers.code import score_code
from evals.scorers.constraints import score_constraints
from evals.scorers.json_output import score_json
from evals.scorers.judge import Endpoint, judge_pointwise, reward
from evals.scorers.pattern import score_regex
from evals.scorers.sandbox import SandboxLimits

__all__ = ["SCORER_VERSION", "Endpoint", "Score", "ScoringContext", "score", "score_async"]

SCORER_VERSION = "1"


@dataclass(frozen=True, slots=True)
class ScoringContext:
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    judge: Endpoint | None = None
    reward_model: Endpoint | None = None


def score(item: EvalItem, output: str, ctx: ScoringContext | None = None) -> Score:
    """Score with a verifiable scorer (judge and reward-model items need :func:`score_async`)."""
    ctx = ctx or ScoringContext()
    spec = item.scorer
    if isinstance(spec, AnswerSpec):
        return score_answer(spec, output)
    if isinstance(spec, RegexSpec):
        return score_regex(spec, output)
    if isinstance(spec, JsonSchemaSpec):
        return score_json(spec, output)
    if isinstance(spec, ConstraintsSpec):
        return score_constraints(spec, output)
    if isinstance(spec, PythonTestsSpec):
        return score_code(spec, output, ctx.sandbox)
    return Score.fail(f"a {spec.type} item needs an endpoint: score it with score_async")


async def score_async(
    item: EvalItem,
    output: str,
    ctx: ScoringContext,
    session: aiohttp.ClientSession | None = None,
    sandbox_slots: asyncio.Semaphore | None = None,
) -> Score:
    """Any scorer; code runs in a thread (one sandbox per ``sandbox_slots`` slot)."""
    spec = item.scorer
    if isinstance(spec, PythonTestsSpec):
        if sandbox_slots is None:
            return await asyncio.to_thread(score, item, output, ctx)
        async with sandbox_slots:
            return await asyncio.to_thread(score, item, output, ctx)
    if isinstance(spec, JudgeSpec | RewardModelSpec):
        endpoint = ctx.judge if isinstance(spec, JudgeSpec) else ctx.reward_model
        if endpoint is None or session is None:
            return Score.fail(f"no {spec.type} endpoint configured")
        if isinstance(spec, JudgeSpec):
            return await judge_pointwise(session, endpoint, spec, item.prompt_text(), output)
        return await reward(session, endpoint, spec, item.chat(), output)
    return score(item, output, ctx)
