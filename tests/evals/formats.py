"""Small datasets in the public formats (written for these tests), and writers for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GSM8K: list[dict[str, Any]] = [
    {"question": "Tom has 3 boxes of 250 pens. How many pens?", "answer": "3 * 250 = 750\n#### 750"},
    {"question": "A book costs $1,200 and is 25% off. Price?", "answer": "1200 * 0.75 = 900\n#### 900"},
    {"question": "Half of 7?", "answer": "7 / 2 = 3.5\n#### 3.5"},
]

HUMANEVAL: list[dict[str, Any]] = [
    {
        "task_id": "Toy/0",
        "prompt": 'def below_zero(ops: list) -> bool:\n    """True when the running sum of ops drops below zero."""\n',
        "canonical_solution": "    total = 0\n    for op in ops:\n        total += op\n        if total < 0:\n"
        "            return True\n    return False\n",
        "test": "def check(candidate):\n    assert candidate([]) is False\n    assert candidate([1, 2, -4, 5]) is True\n"
        "    assert candidate([1, -1]) is False\n",
        "entry_point": "below_zero",
    },
    {
        "task_id": "Toy/1",
        "prompt": "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n\n"
        'def root(xs: list) -> float:\n    """A root of the linear polynomial xs[0] + xs[1]*x."""\n',
        "canonical_solution": "    return -xs[0] / xs[1]\n",
        # As in HumanEval, the test uses a helper the prompt defines.
        "test": "def check(candidate):\n    for xs in ([1, 2], [-3, 1], [4, -8]):\n"
        "        assert abs(poly(xs, candidate(xs))) < 1e-9\n",
        "entry_point": "root",
    },
]

IFEVAL: list[dict[str, Any]] = [
    {"key": 1, "prompt": "Write a haiku in lowercase without commas.",
     "instruction_id_list": ["change_case:english_lowercase", "punctuation:no_comma"], "kwargs": [{}, {}]},
    {"key": 2, "prompt": "List 3 fruits as markdown bullets and end with 'Done.'",
     "instruction_id_list": ["detectable_format:number_bullet_lists", "startend:end_checker"],
     "kwargs": [{"num_bullets": 3}, {"end_phrase": "Done.", "num_words": None}]},
]  # fmt: skip

OPENAI: list[dict[str, Any]] = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
                  {"role": "assistant", "content": "Paris."}]},
    {"input": [{"role": "user", "content": "2 + 2?"}], "ideal": "4"},
]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
