"""Hot-path ids: valid, unique, time-ordered UUIDv7 event ids and random request ids."""

from __future__ import annotations

import time
import uuid

from contracts.ids import request_id, uuid7


def test_event_ids_are_valid_unique_time_ordered_uuid7() -> None:
    ids = [uuid7() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    parsed = [uuid.UUID(i) for i in ids[:100]]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in parsed)
    ms = int(ids[-1].replace("-", "")[:12], 16)
    assert abs(ms - time.time() * 1000) < 5_000
    assert ids[0][:8] <= ids[-1][:8]


def test_request_ids_are_unique_and_not_sequential() -> None:
    ids = [request_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("req-") and len(i) == 28 for i in ids)
