"""Python unit tests against the program in an output, run in the sandbox.

The program is the item's ``prefix`` (a HumanEval prompt) followed by the code: the first
```python (or bare ```) fenced block of the output, or the whole output when it has no
fence or the item says ``extract: raw`` (HumanEval completions). What the sandbox
guarantees is in :mod:`evals.scorers.sandbox.harness` and docs/evals.md.
"""

from __future__ import annotations

import re

from evals.items import PythonTestsSpec
from evals.scorers.base import MAX_OUTPUT_CHARS, Score
from evals.scorers.sandbox import SandboxLimits, UnitTest, run_tests

_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(output: str, mode: str = "fenced") -> str:
    if mode == "raw":
        return output
    match = _FENCE.search(output)
    return match.group(1) if match else output


def program_of(spec: PythonTestsSpec, output: str) -> str:
    return spec.prefix + extract_code(output, spec.extract)


def score_code(spec: PythonTestsSpec, output: str, limits: SandboxLimits | None = None) -> Score:
    if len(output) > MAX_OUTPUT_CHARS:
        return Score.fail(f"output longer than {MAX_OUTPUT_CHARS:,} characters")
    tests = [UnitTest(f"test_{i}", code) for i, code in enumerate(spec.tests)]
    result = run_tests(program_of(spec, output), tests, entry_point=spec.entry_point, setup=spec.setup,
                       limits=limits)  # fmt: skip
    passed = sum(t.passed for t in result.tests)
    share = passed / len(tests)
    return Score(result.passed, 1.0 if result.passed else share, result.reason)
