from typing import Any

def records_v2(
    buf: bytes,
    pos: int,
    count: int,
    base_offset: int,
    first_ts: int,
    max_ts: int,
    ts_type: int,
    topic: str,
    partition: int,
    leader_epoch: int,
    record_type: type,
) -> tuple[list[Any], int, str | None]: ...
