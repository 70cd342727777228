"""Blinding of the model name: the ``model`` of an upstream's answer becomes the route the
client asked for, so a client cannot tell the arms of an experiment apart by it.

The field rewritten is the first ``"model": "…"`` of a JSON answer, and of each SSE event of
a stream (OpenAI-shaped answers carry it once, at the top level, near the start): a key
spelled exactly so, outside any string. Inside a JSON string every quote is escaped, so
generated text that mentions "model" never matches: a ``"model"`` preceded by a backslash
is text (or the end of a key such as ``"a\\"model"``), never the field.

The relay already parses every SSE event (``gateway.relay.SseFilter``), so it knows each
event's model and asks for a rewrite only when that is not the route; the rewrite then
looks for the field as compact JSON spells it (vLLM, SGLang, OpenAI's SSE) near the start
of the event. Anything else — spaces around the colon, escapes the search did not expect —
takes a regular expression with the same result.
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
_BACKSLASH = 0x5C


@lru_cache(maxsize=256)
def _spelled(model: str) -> bytes:
    """The field as compact JSON spells it (memoised: a stream repeats one model per event)."""
    return b'"model":' + orjson.dumps(model)


@dataclass(frozen=True, slots=True)
class ModelEcho:
    """Rewrites the model field of an upstream's answers to one route."""

    route: str
    value: bytes  # the field with the route

    def first(self, body: bytes, model: str) -> bytes:
        """``body`` (one JSON document, or one SSE event) with its first model field set to the
        route; ``model`` is the name the upstream most likely answered with."""
        field = _spelled(model)
        i = body.find(_KEY)
        if i < 0:
            return body
        if body.startswith(field, i) and (i == 0 or body[i - 1] != _BACKSLASH):
            if field == self.value:
                return body
            return body[:i] + self.value + body[i + len(field) :]
        for m in _FIELD.finditer(body, i):
            if _is_field(body, m.start()):
                return body[: m.start()] + self.value + body[m.end() :]
        return body

    def every(self, data: bytes) -> bytes:
        """Every model field in ``data`` set to the route: for bytes relayed without being
        split into events (an event too large to buffer), where each could start an event."""
        value = self.value
        return _FIELD.sub(lambda m: value if _is_field(data, m.start()) else m.group(), data)


def _is_field(data: bytes, start: int) -> bool:
    return start == 0 or data[start - 1] != _BACKSLASH


@lru_cache(maxsize=1024)
def model_echo(route: str) -> ModelEcho:
    """The rewrite to ``route`` (memoised: routes come from the config snapshot, so there are few)."""
    return ModelEcho(route, _spelled(route))
