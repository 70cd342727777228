"""The gateway's input-validation boundary: what a request must look like before any work is
done for it, and what may never reach an event.

* **Identifiers** (unit id, ``user``, tags, conversation id, feedback fields) must not contain
  control characters (U+0000–U+001F, U+007F): PostgreSQL cannot store NUL, and the others
  poison logs and exports. Such a request is refused with 400 before it becomes an event.
* **Depth**: a JSON body nested deeper than :data:`MAX_DEPTH` is refused (orjson refuses to
  encode beyond 254 levels, which would surface as a 500 when the request is relayed).
* **Shape**: the minimal OpenAI request shape, checked in a few µs — ``model`` a non-empty
  string, ``stream`` a boolean, chat ``messages`` a non-empty list of objects with a string
  ``role``, completions a ``prompt``, embeddings an ``input``. Everything else passes through
  untouched: the upstream validates the rest.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 64

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_search_control = _CONTROL.search

Problem = tuple[str, str | None]  # (message, param)


def has_control(text: str) -> bool:
    """True when ``text`` holds a control character (see the module docstring)."""
    return _search_control(text) is not None


def too_deep(body: bytes, value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``value`` (parsed from ``body``) nests containers deeper than ``limit``.

    A body with at most ``limit`` opening brackets cannot be deeper: two C-speed counts
    answer for nearly every request; only the others are walked.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def completion_problem(req: dict[str, Any], endpoint: str) -> Problem | None:
    """What is wrong with a completion/embedding request's minimal shape, or None."""
    model = req.get("model")
    if not isinstance(model, str) or not model:
        return "'model' must be a non-empty string.", "model"
    stream = req.get("stream")
    if stream is not None and stream.__class__ is not bool:
        return "'stream' must be a boolean.", "stream"
    options = req.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return "'stream_options' must be an object.", "stream_options"
    if endpoint == "chat":
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            return "'messages' must be a non-empty list of messages.", "messages"
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                return f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}].role"
    elif endpoint == "completions":
        if req.get("prompt") is None:
            return "'prompt' is required.", "prompt"
    elif req.get("input") is None:
        return "'input' is required.", "input"
    user = req.get("user")
    if user is not None:
        if not isinstance(user, str):
            return "'user' must be a string.", "user"
        if _search_control(user) is not None:
            return "'user' must not contain control characters.", "user"
    return None


def header_problem(unit: str | None, tags: str | None, conversation: str | None) -> Problem | None:
    """Control characters in the liftgate request headers, or None."""
    if unit is not None and _search_control(unit) is not None:
        return "X-Liftgate-Unit must not contain control characters.", "X-Liftgate-Unit"
    if tags is not None and _search_control(tags) is not None:
        return "X-Liftgate-Tags must not contain control characters.", "X-Liftgate-Tags"
    if conversation is not None and _search_control(conversation) is not None:
        return "X-Liftgate-Conversation must not contain control characters.", "X-Liftgate-Conversation"
    return None
