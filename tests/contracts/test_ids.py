"""Hot-path ids: valid, unique, time-ordered UUIDv7 event ids and random request ids."""

from __future__ import annotations

import time
import uuid

import pytest

from contracts.ids import request_id, uuid7


def test_event_ids_are_valid_unique_time_ordered_uuid7() -> None:
    ids = [uuid7() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    parsed = [uuid.UUID(i) for i in ids[:100]]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in parsed)
    ms = int(ids[-1].replace("-", "")[:12], 16)
    assert abs(ms - time.time() * 1000) < 5_000
    assert ids == sorted(ids)  # within a millisecond too: the counter counts on


def test_request_ids_are_unique_and_not_sequential() -> None:
    ids = [request_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("req-") and len(i) == 28 for i in ids)


def test_a_forked_child_never_repeats_the_ids_its_parent_hands_out() -> None:
    import os

    request_id()  # the parent's buffer now holds unused random bytes
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, request_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child.startswith("req-") and child != request_id()


def test_event_ids_of_the_contract_are_the_same_uuid7() -> None:
    from contracts.events import new_event_id

    assert uuid.UUID(new_event_id()).version == 7


def test_more_ids_than_the_counter_holds_in_one_millisecond_still_sort_and_stay_unique(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)  # a stopped clock
    ids = [uuid7() for _ in range(10_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(uuid.UUID(i).version == 7 for i in ids[::997])
