from collections.abc import Set
from typing import Any

def render(
    events: list[Any], flags: bytes, declared: dict[int, Set[str]], always: Set[str]
) -> tuple[bytes, bytes]: ...
