"""The content redaction rules: what the gateway applies to prompt and response text before
it is stored (content logging ``hashed`` or ``full``), and curation applies again to every
item it copies into a dataset (so items made after a rule was added follow it too).

By default e-mail addresses become ``<email>`` and runs of three or more digits ``<num>``.
The rules live in ``contracts`` because the gateway and curation both apply them and neither
may import the other. Applying them twice changes nothing.
"""

from __future__ import annotations

import re

# The lookbehind starts a match only where a run of address characters starts: without it,
# a long run with no '@' is scanned again from each of its positions (quadratic time).
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NUMBER = re.compile(r"\d{3,}")


def redact_content(text: str) -> str:
    if "@" in text:  # most text has no address: skip that scan
        text = _EMAIL.sub("<email>", text)
    return _NUMBER.sub("<num>", text)
