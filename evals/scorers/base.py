"""What every scorer returns, and the final-answer extraction the verifiable scorers share."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

#: Outputs longer than this are not scored (fail): no scorer needs them, and regexes and
#: parsers must not be handed megabytes chosen by the model.
MAX_OUTPUT_CHARS = 100_000

#: Explicit final-answer markers, most specific first: GSM8K's "#### 42", LaTeX's \boxed{42},
#: "The (final) answer is 42", "Answer: 42".
_MARKERS = (
    re.compile(r"####\s*(?P<a>[^\n]*)"),
    re.compile(r"\\boxed\{(?P<a>[^{}\n]*)\}"),
    re.compile(r"(?i)\bthe\s+(?:final\s+)?answer\s+is\s*:?\s*(?P<a>[^\n]*)"),
    re.compile(r"(?im)^\s*(?:final\s+)?answer\s*:\s*(?P<a>[^\n]*)"),
)
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))


@dataclass(frozen=True, slots=True)
class Score:
    passed: bool
    score: float
    reason: str

    @classmethod
    def ok(cls, reason: str, score: float = 1.0) -> Score:
        return cls(True, score, reason)

    @classmethod
    def fail(cls, reason: str, score: float = 0.0) -> Score:
        return cls(False, score, reason)


def clean(output: str) -> str:
    """NFKC-normalised text without zero-width characters (so they cannot split or hide
    words, digits or markers)."""
    return unicodedata.normalize("NFKC", output).translate(_ZERO_WIDTH)


def final_answers(output: str) -> list[str]:
    """The text after every final-answer marker of the most specific kind present."""
    for marker in _MARKERS:
        found = [m.group("a").strip() for m in marker.finditer(output)]
        if found:
            return found
    return []


def too_long(output: str) -> Score | None:
    if len(output) > MAX_OUTPUT_CHARS:
        return Score.fail(f"output longer than {MAX_OUTPUT_CHARS:,} characters")
    return None
