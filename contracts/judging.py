"""How liftgate asks a judge or reward model for a score, shared by the gateway's online
sampler (``gateway.judge``) and analytics' judge probe (``analytics.report.probe``): the same
rubric, the same message and the same reading of the answer, so a probe's scores are on the
scale of the sampled ones.

The judge is any OpenAI-compatible chat endpoint: the rubric is the system message, the user
message is ``Question: … Answer: …`` (each cut at ``TEXT_MAX`` characters), ``temperature 0``;
the first number of its reply in [low, high] is the score.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

DEFAULT_RUBRIC = (
    "You are grading an AI assistant's answer for a user. Judge correctness first, then how "
    "well the answer serves the user's request (relevant, complete, no padding). Reply with a "
    "single integer score from {low} to {high} and nothing else."
)
#: Characters of the question and of the answer sent to the judge (bounds its cost and the queue).
TEXT_MAX = 8000
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def system_prompt(rubric: str, low: float, high: float) -> str:
    return rubric.format(low=f"{low:g}", high=f"{high:g}")


def judge_request(model: str, system: str, question: str, answer: str) -> dict[str, Any]:
    user = f"Question:\n{question[:TEXT_MAX]}\n\nAnswer:\n{answer[:TEXT_MAX]}"
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": 16,
    }


def parse_score(body: bytes, low: float, high: float) -> float | None:
    """The first number of the judge's answer when it lies in [low, high], else None."""
    try:
        data = orjson.loads(body)
        content = data["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(content, str):
        return None
    m = _NUMBER.search(content)
    if m is None:
        return None
    score = float(m.group())
    return score if math.isfinite(score) and low <= score <= high else None
