"""The bounded request-level latency sample (bottom-k sketch) both ingest paths keep."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import psycopg

from analytics.ingest.samples import BATCHES, SAMPLE_SIZE, SampleCuts, read_samples, sample_key_sql
from analytics.ingest.write import encode_for_ingest, ingest, ingest_raw
from contracts.events import ROLLOUT_STAGE_TAG, InteractionEvent, new_event_id
from tests.analytics.ingest_helpers import connect, declared_experiment, interaction

T0 = 1_780_000_000.0


def _events(exp: int, n: int, rng: random.Random, stage: int | None = 2) -> list[InteractionEvent]:
    tags = {ROLLOUT_STAGE_TAG: str(stage)} if stage is not None else {}
    return [
        interaction(
            exp,
            rng.choice(["control", "candidate"]),
            f"u{rng.randrange(200)}",
            latency_ms=rng.lognormvariate(5, 0.5),
            ttft_ms=rng.lognormvariate(3, 0.5),
            ts=T0 + i * 0.001,
            tags=tags,
        )
        for i in range(n)
    ]


def _rows(conn: psycopg.Connection[tuple[Any, ...]], exp: int) -> set[tuple[Any, ...]]:
    return set(
        conn.execute(
            "SELECT metric, segment, variant, sample_key, batch, value FROM latency_samples WHERE experiment_id = %s",
            (exp,),
        ).fetchall()
    )


def _all_keys(conn: psycopg.Connection[tuple[Any, ...]], exp: int) -> dict[str, list[int]]:
    """Every stored request's latency ``sample_key``, per variant (what the sample is drawn from)."""
    out: dict[str, list[int]] = {}
    for variant, key in conn.execute(
        f"SELECT variant, {sample_key_sql('latency_ms')} FROM interactions WHERE experiment_id = %s", (exp,)
    ).fetchall():
        out.setdefault(variant, []).append(key)
    return out


def _kept_smallest(conn: psycopg.Connection[tuple[Any, ...]], exp: int) -> dict[str, list[int]]:
    """The k smallest latency keys the overall sample holds, per variant (what readers take)."""
    rows = conn.execute(
        "SELECT variant, array_agg(sample_key ORDER BY sample_key) FROM (SELECT variant, sample_key,"
        " row_number() OVER (PARTITION BY variant ORDER BY sample_key) rn FROM latency_samples"
        " WHERE experiment_id = %s AND metric = 'latency' AND segment = '') x WHERE rn <= %s GROUP BY variant",
        (exp, SAMPLE_SIZE),
    ).fetchall()
    return {variant: list(keys) for variant, keys in rows}


def _group_counts(conn: psycopg.Connection[tuple[Any, ...]], exp: int) -> dict[str, int]:
    rows = conn.execute(
        "SELECT metric || ' ' || segment || ' ' || variant, count(*) FROM latency_samples"
        " WHERE experiment_id = %s GROUP BY 1",
        (exp,),
    ).fetchall()
    return {group: int(n) for group, n in rows}


def test_every_request_is_sampled_overall_and_in_its_stage_and_a_redelivery_changes_nothing(
    database_url: str,
) -> None:
    exp, rng = declared_experiment(database_url), random.Random(1)
    events = _events(exp, 300, rng)
    with connect(database_url) as conn:
        ingest(conn, events)
        rows = _rows(conn, exp)
        ingest(conn, events)  # redelivery
        assert _rows(conn, exp) == rows
    by = {(m, s) for m, s, *_ in rows}
    assert by == {
        ("latency", ""),
        ("ttft", ""),
        ("latency", f"{ROLLOUT_STAGE_TAG}=2"),
        ("ttft", f"{ROLLOUT_STAGE_TAG}=2"),
    }
    lat = sorted(v for m, s, _, _, _, v in rows if m == "latency" and s == "")
    assert lat == sorted(e.latency_ms for e in events)
    assert all(0 <= b < BATCHES for *_, b, _ in rows)
    assert len({b for *_, b, _ in rows}) > 10
    with connect(database_url) as conn:  # a unit's requests share one batch
        mixed = conn.execute(
            "SELECT count(*) FROM (SELECT i.unit_id FROM interactions i JOIN latency_samples l"
            " ON l.experiment_id = i.experiment_id AND l.metric = 'latency' AND l.segment = ''"
            " AND l.value = i.latency_ms WHERE i.experiment_id = %s"
            " GROUP BY i.unit_id HAVING count(DISTINCT l.batch) > 1) x",
            (exp,),
        ).fetchone()
    assert mixed == (0,)


def test_the_sql_path_and_the_copy_path_keep_the_same_sample(database_url: str) -> None:
    rng = random.Random(2)
    fast_exp, mixed_exp = declared_experiment(database_url), declared_experiment(database_url)
    base = _events(fast_exp, 200, rng)
    mixed = [dataclasses.replace(e, experiment_id=mixed_exp, event_id=new_event_id()) for e in base]
    with connect(database_url) as conn:
        ingest(conn, base)
        ingest(conn, mixed[:1])
        # a batch holding an already stored event takes the ON CONFLICT (SQL) path
        ingest(conn, mixed)
        fast = {r for r in _rows(conn, fast_exp)}
        slow = {r for r in _rows(conn, mixed_exp)}
    assert fast == slow and len(fast) == 4 * 200


def test_the_sample_stays_bounded_and_readers_get_the_k_smallest_keys(database_url: str) -> None:
    exp, rng = declared_experiment(database_url), random.Random(3)
    n = 3 * SAMPLE_SIZE
    events = _events(exp, n, rng, stage=None)
    with connect(database_url) as conn:
        for i in range(0, n, 1000):
            ingest(conn, events[i : i + 1000])
        stored = conn.execute(
            "SELECT variant, count(*) FROM latency_samples WHERE experiment_id = %s AND metric = 'latency'"
            " GROUP BY variant",
            (exp,),
        ).fetchall()
        all_keys = _all_keys(conn, exp)
        got = read_samples(conn, exp, "latency")
        smallest = _kept_smallest(conn, exp)
    for variant, count in stored:
        total = len(all_keys[variant])
        assert SAMPLE_SIZE <= count < total  # pruned as it goes, never below k
        assert count <= 1.3 * SAMPLE_SIZE * (1 + max(0.0, math.log(total / SAMPLE_SIZE)))
        values, batches = got[variant]
        assert len(values) == len(batches) == SAMPLE_SIZE
    # exactly the bottom-k of every request
    assert smallest == {v: sorted(keys)[:SAMPLE_SIZE] for v, keys in all_keys.items()}


def test_a_batch_larger_than_the_sample_inserts_at_most_k_rows_per_group(database_url: str) -> None:
    # A consumer's batch (tens of thousands of events) is far larger than k: the fold keeps
    # only the batch's k smallest keys per group (the k smallest of a union are among the
    # parts' k smallest), not every row below a cut the batch itself would have lowered.
    exp, rng = declared_experiment(database_url), random.Random(4)
    n = 5 * SAMPLE_SIZE
    events = _events(exp, n, rng)
    with connect(database_url) as conn:
        ingest(conn, events[: n // 2])
        first = _group_counts(conn, exp)
        ingest(conn, events[n // 2 :])
        stored = _group_counts(conn, exp)
        all_keys, smallest = _all_keys(conn, exp), _kept_smallest(conn, exp)
    assert len(first) == len(stored) == 8  # 2 metrics x (overall, stage 2) x 2 variants
    assert set(first.values()) == {SAMPLE_SIZE}  # each group saw > k requests in the batch
    assert all(SAMPLE_SIZE <= c <= 2 * SAMPLE_SIZE for c in stored.values())
    assert smallest == {v: sorted(keys)[:SAMPLE_SIZE] for v, keys in all_keys.items()}


def _staged_stream(exp: int, n: int, rng: random.Random) -> list[InteractionEvent]:
    """Stage 1, then stage 2 (a new group while the overall one already has a cut), some
    requests without a stage, and some with a tag holding the segment separator (kept
    apart from the segments text, ``tags_with_sep``): every kind of row the cut looks at."""
    out = []
    for i in range(n):
        tags = {ROLLOUT_STAGE_TAG: "1" if i < n // 2 else "2"}
        if i % 10 == 3:
            tags = {}
        elif i % 97 == 5:
            tags = {**tags, "task": "a\x1fb"}
        elif i % 13 == 7:
            tags = {**tags, "lang": "de"}
        out.append(
            interaction(
                exp,
                rng.choice(["control", "candidate"]),
                f"u{rng.randrange(500)}",
                latency_ms=rng.lognormvariate(5, 0.5),
                ttft_ms=rng.lognormvariate(3, 0.5) if i % 7 else None,
                ts=T0 + i * 0.001,
                tags=tags,
            )
        )
    return out


def test_known_cuts_drop_requests_early_and_keep_the_same_sample(database_url: str) -> None:
    # The same stream into two experiments, one written with the cuts a writer learns
    # (as a consumer does), one without: the samples must be the same row for row, in
    # every group, including a rollout stage that starts after the overall group has a cut.
    rng = random.Random(7)
    plain_exp, cached_exp = declared_experiment(database_url), declared_experiment(database_url)
    plain = _staged_stream(plain_exp, 24_000, rng)
    cached = [dataclasses.replace(e, experiment_id=cached_exp, event_id=new_event_id()) for e in plain]
    cuts = SampleCuts()
    learnt: list[int] = []
    with connect(database_url) as conn:
        for i in range(0, len(plain), 1500):
            ingest(conn, plain[i : i + 1500])
            enc = encode_for_ingest(cached[i : i + 1500])
            ingest_raw(conn, enc.interactions, enc.feedback, cuts=cuts)
            learnt.append(len(cuts))
        groups = _group_counts(conn, cached_exp)
        with_cut, without = _rows(conn, cached_exp), _rows(conn, plain_exp)
    assert with_cut == without
    assert any(s.startswith(f"latency {ROLLOUT_STAGE_TAG}=2") for s in groups)
    # cuts were known for the overall groups and for both stages before the stream ended
    known = set(zip(cuts.params()["k_metric"], cuts.params()["k_segment"], strict=True))
    assert {("latency", ""), ("ttft", ""), ("latency", f"{ROLLOUT_STAGE_TAG}=1")} <= known
    assert ("latency", f"{ROLLOUT_STAGE_TAG}=2") in known
    assert learnt[0] == 0 and learnt[-1] >= 6


def test_cuts_are_learnt_only_in_a_transaction_the_writer_opened(database_url: str) -> None:
    # Inside a caller's transaction the statement may see samples the caller could still
    # roll back: a cut read there could be below the committed one, so none is kept.
    exp, rng = declared_experiment(database_url), random.Random(8)
    events = _events(exp, 2 * SAMPLE_SIZE + 2000, rng, stage=None)
    cuts = SampleCuts()
    with connect(database_url) as conn:
        enc = encode_for_ingest(events[: 2 * SAMPLE_SIZE + 1000])
        ingest_raw(conn, enc.interactions, enc.feedback)
        with conn.transaction():
            enc = encode_for_ingest(events[2 * SAMPLE_SIZE + 1000 :])
            ingest_raw(conn, enc.interactions, enc.feedback, cuts=cuts)
            assert len(cuts) == 0
            raise psycopg.Rollback()
        enc = encode_for_ingest(events[2 * SAMPLE_SIZE + 1000 :])
        ingest_raw(conn, enc.interactions, enc.feedback, cuts=cuts)
    assert len(cuts) >= 2  # both variants' latency cut, read in the writer's own transaction
