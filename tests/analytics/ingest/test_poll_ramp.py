"""The consumer's poll ramp (``PollRamp``): small first batches after a start or a rebalance."""

from __future__ import annotations

from analytics.ingest.consumer import PollRamp


def test_the_limit_doubles_per_poll_up_to_the_top_and_a_rebalance_starts_it_again() -> None:
    ramp = PollRamp(5_000, 50_000)
    seen = []
    for _ in range(6):
        seen.append(ramp.limit)
        ramp.polled()
    assert seen == [5_000, 10_000, 20_000, 40_000, 50_000, 50_000]
    ramp.reset()
    assert ramp.limit == 5_000


def test_a_start_above_the_top_is_the_top() -> None:
    ramp = PollRamp(80_000, 50_000)
    assert ramp.limit == 50_000
    ramp.polled()
    assert ramp.limit == 50_000
    assert PollRamp(0, 0).limit == 1  # at least one record per poll
