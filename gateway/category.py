"""Task category of a request, assigned before treatment from what the user sent.

Order: the client's ``task`` tag (``X-Liftgate-Tags: task=code``) when it names a
configured category; else the first rule (in the configured order) whose keywords or
regular expression match the first user message; else ``other``. The category depends
only on the request, never on the variant, so per-category comparisons stay randomised.

Rules are compiled once when the gateway starts (``CategoryRules.compile``, or
``default_rules()``) into one RE2 *set*: per request, one linear-time pass over at most
``SCAN_CHARS`` characters finds every category whose pattern matches, and the first in the
configured order wins (µs figures: ``bench/gateway/category_bench.py``). A prompt of
megabytes costs what a short one does, and RE2 has no backtracking, so no rule — however
written — can make a request take exponential time. Regular expressions use RE2 syntax
(no look-around, no back-references).

Rules file (``LIFTGATE_CATEGORY_RULES``, YAML or JSON), first match wins::

    categories:
      - name: code
        keywords: [python, function, bug]     # whole words, case-insensitive
      - name: math
        regex: '\\b(derivative|integral|prove)\\b|\\d\\s*[-+*/^]\\s*\\d'
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import re2

OTHER = "other"
TASK_TAG = "task"
#: Rules look at this many characters of the first user message (bounds the CPU per request;
#: the task is nearly always stated at the start).
SCAN_CHARS = 512
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
_MAX_RULES = 64
#: Categories remembered per scanned text. Each turn of a conversation resends its first user
#: message, and many clients send the same fixed prompts: a dict lookup then replaces the
#: match. Keyed by the text's hash, so no user text outlives its request (two of 4,096 texts
#: sharing a 64-bit hash is the only way to get a wrong category); emptied when full.
SEEN_MAX = 4096

#: The built-in rules: the task families whose regressions RL post-training most often
#: causes (coding, maths, writing); everything else is ``other``.
DEFAULT_RULES: tuple[Mapping[str, Any], ...] = (
    {
        "name": "code",
        "keywords": [
            "python", "javascript", "typescript", "java", "rust", "golang", "sql", "function", "code",
            "snippet", "refactor", "compile", "compiler", "bug", "stack trace", "exception", "indexerror",
            "typeerror", "regex", "api", "loop", "class", "method", "unit test",
        ],
    },
    {
        "name": "math",
        "keywords": [
            "derivative", "integral", "prove", "proof", "equation", "solve", "probability", "theorem",
            "matrix", "sum of", "how many ways", "arranged", "factorial", "prime",
        ],
        "regex": r"\d\s*[-+*/^]\s*\d",
    },
    {
        "name": "writing",
        "keywords": [
            "write", "rewrite", "summarise", "summarize", "e-mail", "email", "essay", "letter", "translate",
            "proofread", "bullet points", "name for",
        ],
    },
)  # fmt: skip


class RulesError(ValueError):
    """A rules file or entry that cannot be used (the gateway refuses to start with it)."""


@dataclass(frozen=True, slots=True)
class CategoryRules:
    """Compiled, ordered rules: category names in order and one RE2 set of their patterns."""

    order: tuple[str, ...]
    names: frozenset[str]
    matcher: Any  # re2.Set: Match(text) -> indices of the matching patterns, or None
    # hash of a scanned text -> its category: the rules never change, so neither does the answer.
    _seen: dict[int, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def compile(cls, entries: Sequence[Mapping[str, Any]]) -> CategoryRules:
        if len(entries) > _MAX_RULES:
            raise RulesError(f"at most {_MAX_RULES} categories")
        order: list[str] = []
        patterns: list[str] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise RulesError(f"category #{i + 1}: expected a mapping with name, keywords and/or regex")
            unknown = set(entry) - {"name", "keywords", "regex"}
            if unknown:
                raise RulesError(f"category #{i + 1}: unknown field(s) {sorted(unknown)}")
            name = entry.get("name")
            if not isinstance(name, str) or not _NAME.match(name) or name == OTHER:
                raise RulesError(
                    f"category #{i + 1}: name must match {_NAME.pattern} and not be {OTHER!r}, got {name!r}"
                )
            parts: list[str] = []
            keywords = entry.get("keywords") or []
            if not isinstance(keywords, list) or not all(isinstance(k, str) and k.strip() for k in keywords):
                raise RulesError(f"category {name!r}: keywords must be a list of non-empty strings")
            if keywords:
                words = sorted({k.strip().lower() for k in keywords}, key=len, reverse=True)
                parts.append(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")\b")
            regex = entry.get("regex")
            if regex is not None:
                if not isinstance(regex, str) or not regex:
                    raise RulesError(f"category {name!r}: regex must be a non-empty string")
                try:
                    re2.compile(regex)
                except re2.error as exc:
                    raise RulesError(f"category {name!r}: invalid regex (RE2 syntax): {exc}") from None
                parts.append(f"(?:{regex})")
            if not parts:
                raise RulesError(f"category {name!r}: needs keywords or a regex")
            order.append(name)
            patterns.append("(?i)(?:" + "|".join(parts) + ")")
        if len(set(order)) != len(order):
            raise RulesError(f"duplicate category names: {order}")
        matcher = re2.Set.SearchSet()
        try:
            for pattern in patterns:
                matcher.Add(pattern)
            matcher.Compile()
        except re2.error as exc:  # e.g. RE2's memory budget for the combined automaton
            raise RulesError(f"cannot compile the rules: {exc}") from None
        return cls(tuple(order), frozenset(order), matcher)

    @classmethod
    def load(cls, path: Path) -> CategoryRules:
        """Rules from a YAML/JSON file: a list of entries, or ``{"categories": [...]}``."""
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        entries = data.get("categories") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise RulesError(f"{path}: expected a list of categories or {{'categories': [...]}}")
        return cls.compile(entries)

    def categorize(self, request: Mapping[str, Any], endpoint: str, tags: Mapping[str, str]) -> str:
        task = tags.get(TASK_TAG)
        if task is not None:
            task = task.lower()
            if task in self.names or task == OTHER:
                return task
        text = first_user_text(request, endpoint)
        if not text or not self.order:
            return OTHER
        seen = self._seen
        key = hash(text)
        category = seen.get(key)
        if category is None:
            found: list[int] | None = self.matcher.Match(text)
            category = self.order[min(found)] if found else OTHER
            if len(seen) >= SEEN_MAX:
                seen.clear()
            seen[key] = category
        return category


def first_user_text(request: Mapping[str, Any], endpoint: str) -> str:
    """The first user message's text (chat), or the prompt (completions), cut to SCAN_CHARS."""
    if endpoint == "chat":
        messages = request.get("messages")
        if not isinstance(messages, list):
            return ""
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    return content[:SCAN_CHARS]
                if isinstance(content, list):
                    out = ""
                    for part in content:
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            out += part["text"][: SCAN_CHARS - len(out)] + " "
                            if len(out) >= SCAN_CHARS:
                                break
                    return out
                return ""
        return ""
    prompt = request.get("prompt")
    return prompt[:SCAN_CHARS] if isinstance(prompt, str) else ""


def default_rules() -> CategoryRules:
    return CategoryRules.compile(DEFAULT_RULES)
