"""Blinding of the model name: the ``model`` of an upstream's answer becomes the route the
client asked for, so a client cannot tell the arms of an experiment apart by it.

The field is the top-level ``"model": "…"`` of a JSON answer, and of every SSE event of a
stream: a key spelled exactly so, outside any string. Inside a JSON string every quote is
escaped, so generated text that mentions "model" never matches: a ``"model"`` preceded by a
backslash is text (or the end of a key such as ``"a\\"model"``), never the field.

This runs on every streamed block, so the usual case costs a few C-level byte scans: an
upstream echoes the model it was asked for, in compact JSON (vLLM, SGLang, OpenAI's SSE),
and then every ``"model"`` in the block starts that exact field and ``bytes.replace``
rewrites them all. Anything else — spaces around the colon (OpenAI's pretty-printed JSON),
another model name (an upstream that answers with its own name), escapes in the name —
takes the general path, a regular expression with the same result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import orjson

# Starts with a literal, so ``re`` looks for ``"model"`` with a fast search instead of trying
# the pattern at every byte (which a leading look-behind would force); the backslash check
# is done on each match instead.
_FIELD = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
_KEY = b'"model"'
_ESCAPED_KEY = b'\\"model"'
_BACKSLASH = 0x5C


@dataclass(frozen=True, slots=True)
class ModelEcho:
    """Rewrites the model field of answers from one upstream model to one route."""

    usual: bytes  # the field as an upstream echoes ``model`` in compact JSON
    value: bytes  # the field with the route

    def first(self, body: bytes) -> bytes:
        """``body`` (one JSON document) with its first model field set to the route."""
        i = body.find(_KEY)
        if i < 0:
            return body
        if body.startswith(self.usual, i) and (i == 0 or body[i - 1] != _BACKSLASH):
            if self.usual == self.value:
                return body
            return body[:i] + self.value + body[i + len(self.usual) :]
        for m in _FIELD.finditer(body, i):
            if _is_field(body, m.start()):
                return body[: m.start()] + self.value + body[m.end() :]
        return body

    def every(self, block: bytes) -> bytes:
        """``block`` (whole SSE events) with the model field of every event set to the route."""
        n = block.count(_KEY)
        if n == 0:
            return block
        if block.count(self.usual) == n and _ESCAPED_KEY not in block:
            # Every "model" starts the usual field, none is inside a string.
            return block if self.usual == self.value else block.replace(self.usual, self.value)
        value = self.value
        return _FIELD.sub(lambda m: value if _is_field(block, m.start()) else m.group(), block)


def _is_field(data: bytes, start: int) -> bool:
    return start == 0 or data[start - 1] != _BACKSLASH


@lru_cache(maxsize=1024)
def model_echo(upstream_model: str, route: str) -> ModelEcho:
    """The rewrite from an upstream model to a route (memoised: both come from the config
    snapshot, so there are few pairs)."""
    return ModelEcho(b'"model":' + orjson.dumps(upstream_model), b'"model":' + orjson.dumps(route))
