"""Text as curation compares it: redaction re-applied, then normalised for hashing.

Normalisation (for de-duplication only; items keep their redacted text as it was): Unicode
NFKC, zero-width characters removed, case folded, every run of whitespace one space,
trimmed. Two prompts with the same normalised text are exact duplicates.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from contracts.content import redact_content

_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")
_SPACE = re.compile(r"\s+")
#: Longest prompt or response an item keeps (characters); longer text is cut, and the item
#: says so in its provenance (``truncated``).
MAX_TEXT = 100_000


def clean(text: str) -> tuple[str, bool]:
    """The text with the content redaction rules applied again and NUL removed; cut at
    ``MAX_TEXT`` characters (second value: whether it was cut)."""
    text = redact_content(text.replace("\x00", "\ufffd"))
    if len(text) > MAX_TEXT:
        return text[:MAX_TEXT], True
    return text, False


def normalise(text: str) -> str:
    text = _ZERO_WIDTH.sub("", unicodedata.normalize("NFKC", text))
    return _SPACE.sub(" ", text.casefold()).strip()


def text_hash(normalised: str) -> str:
    return hashlib.sha256(normalised.encode()).hexdigest()
