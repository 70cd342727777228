"""The eval item: one prompt, its category and how to verify an answer (the JSONL format).

One JSON object per line (see docs/evals.md)::

    {"id": "math-0007", "category": "math",
     "messages": [{"role": "user", "content": "..."}],      # or "prompt": "..."
     "scorer": {"type": "answer", "answer": "42"},
     "reference": "... The answer is 42.",                   # optional: a known-good output
     "metadata": {}}

``scorer`` is one of the specs below, selected by ``type``. Everything is validated on load
(unknown keys are errors), so a typo in a dataset fails loudly instead of scoring nothing.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

CATEGORY_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
CATEGORIES = ("math", "code", "instruction_following", "json", "chat")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class AnswerSpec(_Strict):
    """A final answer: numbers compared exactly (as fractions) or within ``tolerance``
    (relative), text compared after normalising case, spaces and end punctuation."""

    type: Literal["answer"]
    answer: str = Field(min_length=1, max_length=1000)
    mode: Literal["numeric", "exact"] = "numeric"
    tolerance: float = Field(default=0.0, ge=0, le=0.5)


class RegexSpec(_Strict):
    """``pattern`` against the final answer (or the whole output): ``fullmatch`` by default;
    ``search`` must find exactly one distinct match unless ``unique`` is false."""

    type: Literal["regex"]
    pattern: str = Field(min_length=1, max_length=2000)
    target: Literal["final_answer", "output"] = "final_answer"
    mode: Literal["fullmatch", "search"] = "fullmatch"
    ignore_case: bool = False
    unique: bool = True
    forbid: tuple[str, ...] = ()


class JsonSchemaSpec(_Strict):
    """The output is exactly one JSON value (optionally in one ```json fence) valid against
    ``schema`` (Draft 2020-12) and, when given, equal to ``expected`` with types compared."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")
    expected: Any = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PythonTestsSpec(_Strict):
    """Unit tests run in the sandbox. ``prefix`` is prepended to the extracted code (a
    HumanEval prompt); ``setup`` runs in the tests' namespace (trusted dataset code);
    ``tests`` are separate test snippets, each calling ``candidate`` (= ``entry_point``)."""

    type: Literal["python_tests"]
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    tests: tuple[str, ...] = Field(min_length=1, max_length=200)
    setup: str = ""
    prefix: str = ""
    extract: Literal["fenced", "raw"] = "fenced"


class Constraint(BaseModel):
    """One instruction-following check; ``kind`` is an IFEval instruction id."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str = Field(min_length=1, max_length=128)


class ConstraintsSpec(_Strict):
    type: Literal["constraints"]
    constraints: tuple[Constraint, ...] = Field(min_length=1)


class JudgeSpec(_Strict):
    """An LLM judge grades the output 1–10 against ``rubric``; passes at ``threshold``."""

    type: Literal["judge"]
    rubric: str = Field(min_length=1, max_length=20_000)
    threshold: float = Field(default=7, ge=1, le=10)
    reference: str | None = None


class RewardModelSpec(_Strict):
    """A reward model scores (prompt, output); passes when the reward is >= ``threshold``."""

    type: Literal["reward_model"]
    threshold: float = 0.0


ScorerSpec = Annotated[
    AnswerSpec | RegexSpec | JsonSchemaSpec | PythonTestsSpec | ConstraintsSpec | JudgeSpec | RewardModelSpec,
    Field(discriminator="type"),
]


class EvalItem(_Strict):
    id: str = Field(min_length=1, max_length=256)
    category: str = Field(pattern=CATEGORY_PATTERN)
    messages: tuple[Message, ...] | None = None
    prompt: str | None = Field(default=None, max_length=200_000)
    scorer: ScorerSpec
    reference: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_prompt(self) -> EvalItem:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' and 'prompt'")
        if self.messages is not None and not any(m.role == "user" for m in self.messages):
            raise ValueError("'messages' needs at least one user message")
        return self

    def chat(self) -> list[dict[str, str]]:
        """The messages to send (a bare prompt becomes one user message)."""
        if self.messages is not None:
            return [{"role": m.role, "content": m.content} for m in self.messages]
        return [{"role": "user", "content": self.prompt or ""}]

    def prompt_text(self) -> str:
        """The last user message: what a simulator or a judge sees as the question."""
        return next(m["content"] for m in reversed(self.chat()) if m["role"] == "user")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=False)

    def fingerprint(self) -> str:
        """SHA-256 of the canonical JSON of what is asked and how it is scored (not metadata)."""
        core = self.model_dump(
            mode="json", by_alias=True, include={"id", "category", "messages", "prompt", "scorer"}
        )
        return hashlib.sha256(orjson.dumps(core, option=orjson.OPT_SORT_KEYS)).hexdigest()
