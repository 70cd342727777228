"""The simulator answers the built-in suites' prompts with its per-category skill, through
the real openai client; other prompts are unaffected."""

from __future__ import annotations

import openai
import pytest

from evals.datasets.builtin import builtin_suite
from evals.scorers import score
from liftgate.simulator_model import ModelBehaviour, SimulatorModel, parse_skills


@pytest.mark.parametrize(("category", "suite", "skill"), [("math", "math", 0.9), ("code", "code", 0.45)])
def test_the_share_of_right_answers_follows_the_skill(category: str, suite: str, skill: float) -> None:
    behaviour = ModelBehaviour(SimulatorModel(name="m", skills=f"{category}:{skill}"))
    items = builtin_suite(suite)
    outputs = [
        "".join(behaviour.eval_answer(b.item.prompt_text(), seed) or []) for b in items for seed in range(3)
    ]
    right = sum(
        o == b.item.reference for o, b in zip(outputs, [b for b in items for _ in range(3)], strict=True)
    )
    assert abs(right / len(outputs) - skill) < 0.12
    if category == "math":  # every answer is one the scorer can verify, right or wrong
        verdicts = [
            score(b.item, o).passed
            for o, b in zip(outputs, [b for b in items for _ in range(3)], strict=True)
        ]
        assert sum(verdicts) == right


def test_answers_are_a_function_of_the_prompt_and_the_request_seed() -> None:
    behaviour = ModelBehaviour(SimulatorModel(name="m", skills="json:0.5"))
    prompt = builtin_suite("json")[0].item.prompt_text()
    assert behaviour.eval_answer(prompt, 1) == behaviour.eval_answer(prompt, 1)
    assert behaviour.eval_answer("an ordinary question", 1) is None
    assert ModelBehaviour(SimulatorModel(name="m")).eval_answer(prompt, 1) is None


def test_skills_are_validated() -> None:
    assert parse_skills("math:0.9/code:0") == {"math": 0.9, "code": 0.0}
    for bad in ("math", "math:2", "math:x", ":0.5"):
        with pytest.raises(ValueError):
            SimulatorModel(name="m", skills=bad)


def test_the_served_answer_is_the_skilled_one(simulator_url: str) -> None:
    client = openai.OpenAI(base_url=simulator_url, api_key="unused", max_retries=0)
    item = builtin_suite("code")[0].item
    reply = client.chat.completions.create(model="base", messages=item.chat(), seed=0)  # type: ignore[arg-type]
    content = reply.choices[0].message.content or ""
    assert content in (builtin_suite("code")[0].item.reference, *builtin_suite("code")[0].wrong)
    other = client.chat.completions.create(model="base", messages=[{"role": "user", "content": "hello"}])
    assert other.choices[0].message.content not in (item.reference,)
    client.close()
