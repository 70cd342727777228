"""The consumer's GC tuning (pure, process-wide: every test restores what it changed)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from analytics.ingest.consumer import ConsumerSettings, tune_gc


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_the_young_generation_threshold_is_raised_and_startup_objects_frozen() -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    tune_gc(20_000)
    assert gc.get_threshold() == (20_000, 20, 20)
    assert gc.get_freeze_count() > 0


def test_a_higher_threshold_set_elsewhere_is_kept_and_zero_changes_nothing() -> None:
    gc.set_threshold(50_000, 30, 40)
    tune_gc(20_000)
    assert gc.get_threshold() == (50_000, 30, 40)
    gc.set_threshold(700, 10, 10)
    tune_gc(0)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_default_setting_raises_the_threshold() -> None:
    assert ConsumerSettings(database_url="postgresql://x/y").consumer_gc_gen0 > 700
