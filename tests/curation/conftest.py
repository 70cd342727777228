from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine


@pytest.fixture(scope="module")
def engine(module_database_url: str) -> Iterator[Engine]:
    """A database of this module's own: holdouts are global, so other modules' must not leak in."""
    eng = create_engine(module_database_url, pool_size=5, max_overflow=10)
    yield eng
    eng.dispose()
