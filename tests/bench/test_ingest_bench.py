"""The ingest benchmark's sustained rate (``bench.ingest.bench_ingest.sustained_rate``): pure arithmetic
over a timeline of committed offsets, checked against figures worked by hand."""

from __future__ import annotations

import pytest

from bench.ingest.bench_ingest import sustained_rate

A = frozenset({0, 1, 2})
B = frozenset({3, 4, 5})


def test_a_late_member_is_measured_from_its_own_first_commit_after_the_group_formed() -> None:
    # B owned every partition at first: its commit at t=0 moved A's partitions too (1,000
    # events on partition 0). The group formed at t=1; A committed at 2, 4, 6; B at 1.5, 3.5, 5.5.
    timeline = [
        (0.0, {0: 1000, 3: 50_000}),
        (1.5, {0: 1000, 3: 100_000}),
        (2.0, {0: 4000, 3: 100_000}),
        (3.5, {0: 4000, 3: 150_000}),
        (4.0, {0: 4000, 1: 50_000, 3: 150_000}),
        (5.5, {0: 4000, 1: 50_000, 3: 150_000, 4: 40_000}),
        (6.0, {0: 4000, 1: 50_000, 2: 50_000, 3: 150_000, 4: 40_000}),
    ]
    rate = sustained_rate(timeline, [A, B], formed_t=1.0, checkpoint_s=0.0)
    # A: 100,000 events from t=2 to t=6; B: 90,000 from t=1.5 to t=5.5.
    assert rate == pytest.approx(100_000 / 4.0 + 90_000 / 4.0)


def test_the_final_checkpoint_is_shared_in_proportion_to_the_events() -> None:
    timeline = [(0.5, {0: 0, 3: 0}), (1.0, {0: 30_000, 3: 10_000}), (3.0, {0: 90_000, 3: 30_000})]
    # Windows from the first commit (t=1; the look at t=0.5 saw none) to the last (t=3): A
    # 60,000 events, B 20,000; a 0.8 s checkpoint is 0.6 s for A and 0.2 s for B.
    rate = sustained_rate(timeline, [A, B], formed_t=0.0, checkpoint_s=0.8)
    assert rate == pytest.approx(60_000 / 2.6 + 20_000 / 2.2)


def test_a_member_with_fewer_than_two_commits_after_formation_is_an_error_not_a_figure() -> None:
    timeline = [(0.0, {0: 10, 3: 10}), (1.0, {0: 20, 3: 20}), (2.0, {0: 20, 3: 30})]
    with pytest.raises(RuntimeError, match="more --events"):
        sustained_rate(timeline, [A, B], formed_t=0.5, checkpoint_s=0.0)
