"""``GET /api/experiments/{ref}/examples`` and ``/shadow-pairs`` on the real analytics service
over traffic written by the real ingest into real PostgreSQL. What each filter must return is
computed from the seeded requests, not from the API's SQL."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np
import pytest
from scipy.stats import binom
from sqlalchemy import Engine, create_engine, text

from analytics.ingest.write import ingest
from analytics.report.examples import MAX_LIMIT, NOTES, TEXT_MAX
from contracts.events import InteractionEvent, new_event_id
from tests.analytics.examples_data import XSS, Seeded, seed_ab, seed_shadow
from tests.known_secrets import secret
from tests.services import READ_TOKEN, analytics_service, http

PER_VARIANT = 240
ADMIN = secret("examples-admin")


@pytest.fixture(scope="module")
def ex_engine(module_database_url: str) -> Iterator[Engine]:
    eng = create_engine(module_database_url, pool_size=5, max_overflow=5)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def data(ex_engine: Engine) -> dict[str, Seeded]:
    rng = np.random.default_rng(19)
    return {
        "full": seed_ab(ex_engine, "ex-full", "full", PER_VARIANT, rng),
        "hashed": seed_ab(ex_engine, "ex-hashed", "hashed", 30, rng),
        "off": seed_ab(ex_engine, "ex-off", "none", 30, rng),
        "shadow": seed_shadow(ex_engine, "ex-shadow", 90, rng),
    }


@pytest.fixture(scope="module")
def service(module_database_url: str, data: dict[str, Seeded]) -> Iterator[str]:
    with analytics_service(module_database_url, ADMIN, snapshot_interval_s="0",
                           rollout_controller="false") as url:  # fmt: skip
        yield url


def call(url: str, path: str, token: str | None = ADMIN, **params: Any) -> tuple[int, Any]:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    status, body = http(
        "GET", f"{url}{path}?{query}", {"Authorization": f"Bearer {token}"} if token else None
    )
    return status, json.loads(body)


def examples(url: str, ref: str, **params: Any) -> dict[str, Any]:
    status, doc = call(url, f"/api/experiments/{quote(ref)}/examples", **params)
    assert status == 200, doc
    assert isinstance(doc, dict)
    return doc


def every_page(url: str, ref: str, path: str = "examples", key: str = "items", **params: Any) -> list[Any]:
    """Follow next_cursor to the end (bounded: the seeded tables are small)."""
    out: list[Any] = []
    cursor = None
    for _ in range(200):
        status, doc = call(url, f"/api/experiments/{quote(ref)}/{path}", cursor=cursor, **params)
        assert status == 200, doc
        out += doc[key]
        cursor = doc["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("more than 200 pages")


def hashes(engine: Engine, request_ids: list[str]) -> list[int]:
    with engine.connect() as conn:
        return [
            int(conn.execute(text("SELECT hashtextextended(:r, 0)"), {"r": r}).scalar_one())
            for r in request_ids
        ]


def ids(items: list[dict[str, Any]]) -> list[str]:
    return [it["request_id"] for it in items]


def test_paging_through_a_variant_returns_each_of_its_requests_once_in_hash_order(
    service: str, data: dict[str, Seeded], ex_engine: Engine
) -> None:
    full = data["full"]
    items = every_page(service, full.name, variant="candidate", limit=17)
    assert sorted(ids(items)) == sorted(r.request_id for r in full.where(variant="candidate"))
    keys = hashes(ex_engine, ids(items))
    assert keys == sorted(keys)
    assert {it["variant"] for it in items} == {"candidate"}


def test_the_same_query_answers_the_same_page_every_time(service: str, data: dict[str, Seeded]) -> None:
    first = examples(service, "ex-full", variant="baseline", limit=25)
    again = examples(service, "ex-full", variant="baseline", limit=25)
    assert first == again and len(first["items"]) == 25 and first["next_cursor"]


def test_without_a_variant_the_page_merges_every_variants_requests_in_one_hash_order(
    service: str, data: dict[str, Seeded], ex_engine: Engine
) -> None:
    items = every_page(service, "ex-full", limit=MAX_LIMIT)
    assert sorted(ids(items)) == sorted(r.request_id for r in data["full"].requests)
    keys = hashes(ex_engine, ids(items))
    assert keys == sorted(keys)


def test_the_sample_is_unbiased_where_time_order_would_show_only_failures(
    service: str, data: dict[str, Seeded]
) -> None:
    # The oldest third of the candidate's calls failed: the first 60 by time are all failures,
    # a uniform sample of 60 holds about 20 (binomial 99.9% bounds).
    page = examples(service, "ex-full", variant="candidate", limit=60)["items"]
    failed = sum(it["status"] == "error" for it in page)
    lo, hi = binom.ppf([0.0005, 0.9995], 60, 1 / 3)
    assert lo <= failed <= hi, failed


def test_rows_ingested_between_pages_never_repeat_or_hide_a_row_that_was_there(
    service: str, data: dict[str, Seeded], ex_engine: Engine
) -> None:
    before = {r.request_id for r in data["full"].where(variant="baseline")}
    first = examples(service, "ex-full", variant="baseline", limit=50)
    new = [
        InteractionEvent(
            request_id=new_event_id(), route="route-ex-full", unit_id="late", unit_source="header", role="primary",
            mode="ab", endpoint="chat", model="m", upstream="up", status="ok", http_status=200, latency_ms=5.0,
            experiment_id=data["full"].eid, experiment="ex-full", variant="baseline", response_chars=1,
            stream=False, category="zzz-late", tags={},
        )
        for _ in range(30)
    ]  # fmt: skip
    assert ingest(ex_engine, list(new)).dead_lettered == 0
    try:
        rest: list[dict[str, Any]] = []
        cursor = first["next_cursor"]
        for _ in range(50):
            status, doc = call(service, "/api/experiments/ex-full/examples", variant="baseline", limit=50,
                               cursor=cursor)  # fmt: skip
            assert status == 200, doc
            rest += doc["items"]
            cursor = doc["next_cursor"]
            if cursor is None:
                break
        seen = ids(first["items"]) + ids(rest)
        assert len(seen) == len(set(seen))
        assert before <= set(seen)
    finally:
        with ex_engine.begin() as conn:
            conn.execute(text("DELETE FROM interactions WHERE category = 'zzz-late'"))


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        ({"category": "math"}, lambda r: r.category == "math"),
        ({"segment": "task=beta"}, lambda r: r.task == "beta"),
        ({"feedback": "thumbs_down"}, lambda r: "thumbs_down" in r.feedback),
        ({"error": "true"}, lambda r: r.failed),
        ({"error": "false"}, lambda r: not r.failed),
        ({"score_min": 0.25, "score_max": 0.6}, lambda r: 0.25 <= r.scores.get("judge-a", -1) <= 0.6),
        ({"score_min": 0.8, "judge": "judge-a"}, lambda r: r.scores.get("judge-a", -1) >= 0.8),
        ({"score_min": 0.5, "judge": "other-judge"}, lambda r: False),
        ({"judge": "judge-a"}, lambda r: "judge-a" in r.scores),
    ],
    ids=[
        "category",
        "segment",
        "feedback",
        "failed",
        "succeeded",
        "score-range",
        "judge-and-min",
        "no-such-judge",
        "judged",
    ],
)
def test_each_filter_returns_exactly_the_seeded_requests_that_match_it(
    service: str, data: dict[str, Seeded], params: dict[str, Any], expect: Any
) -> None:
    items = every_page(service, "ex-full", variant="candidate", limit=MAX_LIMIT, **params)
    want = {r.request_id for r in data["full"].where(variant="candidate") if expect(r)}
    assert set(ids(items)) == want
    assert len(items) == len(want)


def test_a_time_window_keeps_requests_from_since_up_to_but_not_including_until(
    service: str, data: dict[str, Seeded]
) -> None:
    reqs = sorted(data["full"].where(variant="baseline"), key=lambda r: r.ts)
    since, until = reqs[40].ts, reqs[90].ts
    items = every_page(service, "ex-full", variant="baseline", limit=MAX_LIMIT,
                       since=since.isoformat(), until=until.isoformat())  # fmt: skip
    assert set(ids(items)) == {r.request_id for r in reqs[40:90]}


def test_full_content_shows_the_stored_text_feedback_and_judge_scores_of_each_request(
    service: str, data: dict[str, Seeded]
) -> None:
    doc = examples(service, "ex-full", variant="candidate", feedback="thumbs_down", limit=MAX_LIMIT)
    assert doc["content_logging"] == "full" and doc["note"] == NOTES["full"]
    by_id = {r.request_id: r for r in data["full"].requests}
    assert doc["items"]
    for it in doc["items"]:
        r = by_id[it["request_id"]]
        assert it["prompt"] == {
            "state": "full",
            "text": r.prompt,
            "length": len(r.prompt or ""),
            "truncated": False,
        }
        assert it["response"]["text"] == r.response
        assert sorted(f["kind"] for f in it["feedback"]) == sorted(r.feedback)
        assert {j["judge"]: j["score"] for j in it["judgements"]} == r.scores
        assert it["category"] == r.category and it["tags"] == {"task": r.task}


def test_markup_in_a_stored_answer_comes_back_as_the_same_plain_string(
    service: str, data: dict[str, Seeded]
) -> None:
    marked = next(r for r in data["full"].requests if r.response and XSS in r.response)
    items = every_page(service, "ex-full", variant="candidate", limit=MAX_LIMIT)
    (it,) = [i for i in items if i["request_id"] == marked.request_id]
    assert it["response"]["text"] == marked.response


def test_hashed_content_shows_digests_and_says_the_text_cannot_be_shown(
    service: str, data: dict[str, Seeded]
) -> None:
    doc = examples(service, "ex-hashed", limit=MAX_LIMIT)
    assert doc["content_logging"] == "hashed" and "keyed digests" in doc["note"]
    by_id = {r.request_id: r for r in data["hashed"].requests}
    for it in doc["items"]:
        r = by_id[it["request_id"]]
        assert it["prompt"]["state"] == "hashed" and len(it["prompt"]["text"]) == 64
        assert r.prompt is not None and r.prompt not in json.dumps(it)
        assert it["response"]["state"] == ("none" if r.response is None else "hashed")


def test_with_content_logging_off_the_answer_says_so_and_lists_metadata_without_text(
    service: str, data: dict[str, Seeded]
) -> None:
    doc = examples(service, "ex-off", limit=MAX_LIMIT)
    assert doc["content_logging"] == "none" and doc["note"].startswith("Content logging is off")
    assert len(doc["items"]) == len(data["off"].requests)
    for it in doc["items"]:
        assert it["prompt"] == it["response"] == {"state": "none", "text": None, "length": None}


def test_text_logged_before_content_logging_was_turned_off_is_withheld(
    service: str, data: dict[str, Seeded], ex_engine: Engine
) -> None:
    with ex_engine.begin() as conn:
        conn.execute(text("UPDATE experiments SET content_logging = 'none' WHERE name = 'ex-hashed'"))
    try:
        doc = examples(service, "ex-hashed", limit=5)
        assert doc["content_logging"] == "none"
        assert {it["prompt"]["state"] for it in doc["items"]} == {"withheld"}
        assert all(it["prompt"]["text"] is None for it in doc["items"])
    finally:
        with ex_engine.begin() as conn:
            conn.execute(text("UPDATE experiments SET content_logging = 'hashed' WHERE name = 'ex-hashed'"))


def test_a_long_answer_is_cut_at_the_text_limit_with_its_full_length(
    service: str, data: dict[str, Seeded], ex_engine: Engine
) -> None:
    rid = data["full"].where(variant="baseline")[0].request_id
    with ex_engine.begin() as conn:
        conn.execute(text("UPDATE interactions SET response = repeat('y', :n) WHERE request_id = :r"),
                     {"n": TEXT_MAX + 10, "r": rid})  # fmt: skip
    items = every_page(service, "ex-full", variant="baseline", limit=MAX_LIMIT)
    (it,) = [i for i in items if i["request_id"] == rid]
    assert it["response"] == {
        "state": "full",
        "text": "y" * TEXT_MAX,
        "length": TEXT_MAX + 10,
        "truncated": True,
    }


def test_a_metric_lists_the_requests_behind_it(service: str, data: dict[str, Seeded]) -> None:
    cand = data["full"].where(variant="candidate")
    down = every_page(service, "ex-full", variant="candidate", metric="thumbs_down_rate", limit=MAX_LIMIT)
    assert set(ids(down)) == {r.request_id for r in cand if "thumbs_down" in r.feedback}
    failed = every_page(service, "ex-full", variant="candidate", metric="error_rate", limit=MAX_LIMIT)
    assert set(ids(failed)) == {r.request_id for r in cand if r.failed}
    doc = examples(service, "ex-full", variant="candidate", metric="latency_p95")
    assert doc["metric"]["name"] == "latency_p95" and "uniform sample" in doc["metric"]["note"]
    assert doc["filter"] == {"variant": "candidate"}
    doc = examples(service, "ex-full", variant="candidate", metric="thumbs_down_rate")
    assert doc["filter"] == {"variant": "candidate", "feedback": "thumbs_down"}


def test_shadow_pairs_show_both_answers_and_both_judge_scores(service: str, data: dict[str, Seeded]) -> None:
    shadow = data["shadow"]
    pairs = every_page(service, "ex-shadow", path="shadow-pairs", key="pairs", limit=13)
    by_id = {r.request_id: r for r in shadow.requests}
    shadows = shadow.where(role="shadow")
    assert sorted(p["shadow"]["request_id"] for p in pairs) == sorted(r.request_id for r in shadows)
    for p in pairs:
        s = by_id[p["shadow"]["request_id"]]
        prim = by_id[s.pair_id or ""]
        assert p["pair_id"] == prim.request_id == p["primary"]["request_id"]
        assert p["primary"]["response"]["text"] == prim.response and p["primary"]["variant"] == "baseline"
        assert p["shadow"]["response"]["text"] == s.response and p["shadow"]["role"] == "shadow"
        assert {j["judge"]: j["score"] for j in p["primary"]["judgements"]} == prim.scores
        assert {j["judge"]: j["score"] for j in p["shadow"]["judgements"]} == s.scores
        assert p["same_response"] == (s.response == prim.response)


def test_shadow_pair_filters_apply_to_the_shadow_call(service: str, data: dict[str, Seeded]) -> None:
    shadows = data["shadow"].where(role="shadow")
    failed = every_page(service, "ex-shadow", path="shadow-pairs", key="pairs", error="true", limit=MAX_LIMIT)
    assert {p["shadow"]["request_id"] for p in failed} == {r.request_id for r in shadows if r.failed}
    low = every_page(service, "ex-shadow", path="shadow-pairs", key="pairs", score_max=0.3, limit=MAX_LIMIT)
    assert {p["shadow"]["request_id"] for p in low} == {
        r.request_id for r in shadows if r.scores.get("judge-a", 2) <= 0.3
    }


def test_an_experiment_without_shadow_calls_has_no_pairs(service: str, data: dict[str, Seeded]) -> None:
    status, doc = call(service, "/api/experiments/ex-full/shadow-pairs")
    assert status == 200 and doc["pairs"] == [] and doc["next_cursor"] is None


@pytest.mark.parametrize(
    ("path", "params", "reason"),
    [
        ("examples", {"limit": 0}, "limit"),
        ("examples", {"limit": MAX_LIMIT + 1}, "limit"),
        ("examples", {"cursor": "not-a-cursor"}, "cursor"),
        ("examples", {"cursor": "MTIzOm5vdC1hLXV1aWQ"}, "cursor"),
        ("examples", {"variant": "nope"}, "no variant 'nope'"),
        ("examples", {"score_min": 0.9, "score_max": 0.1}, "score_min"),
        ("examples", {"score_min": "nan"}, "finite"),
        ("examples", {"score_max": "inf"}, "finite"),
        ("examples", {"since": "2026-12-01T08:00:00"}, "time zone"),
        ("examples", {"since": "yesterday"}, "since"),
        ("examples", {"since": "2026-12-01T08:00:00Z", "until": "2026-12-01T07:00:00Z"}, "before until"),
        ("examples", {"segment": "no-equals-sign"}, "tag=value"),
        ("examples", {"error": "maybe"}, "error"),
        ("examples", {"metric": "no_such_metric"}, "unknown metric"),
        ("examples", {"variant": "x" * 300}, "variant"),
        ("examples", {"category": "math\x00"}, "category must be printable"),
        ("examples", {"segment": "task=a\x00b"}, "segment must be printable"),
        ("examples", {"feedback": "thumbs\ndown"}, "feedback must be printable"),
        ("shadow-pairs", {"judge": "j\x00"}, "judge must be printable"),
        ("examples", {"metric": "rate\x00"}, "metric must be printable"),
        ("shadow-pairs", {"limit": 1000}, "limit"),
    ],
)
def test_bad_parameters_are_refused_with_a_reason(
    service: str, data: dict[str, Seeded], path: str, params: dict[str, Any], reason: str
) -> None:
    status, doc = call(service, f"/api/experiments/ex-full/{path}", **params)
    assert status == 422, doc
    assert reason in doc["detail"]


def test_an_unknown_experiment_is_404_and_reads_need_a_credential(
    service: str, data: dict[str, Seeded]
) -> None:
    status, doc = call(service, "/api/experiments/no-such-experiment/examples")
    assert status == 404 and "not found" in doc["detail"]
    status, _ = call(service, "/api/experiments/ex-full/examples", token=None)
    assert status == 401
    status, _ = call(service, "/api/experiments/ex-full/shadow-pairs", token="wrong-token-value")
    assert status == 403


def _user_token(service: str, role: str) -> str:
    name = f"ex-{role}"
    auth = {"Authorization": f"Bearer {ADMIN}"}
    body = {"name": name, "role": role, "password": secret(f"pw-{role}")}
    assert http("POST", f"{service}/admin/users", auth, 30, body)[0] == 201
    status, raw = http("POST", f"{service}/admin/users/{name}/tokens", auth, 30, {"label": "cli"})
    assert status == 201, raw
    return str(json.loads(raw)["token"])


def test_stored_prompts_and_answers_are_for_operators_and_admins_not_the_read_token_or_viewers(
    service: str, data: dict[str, Seeded]
) -> None:
    """Examples are raw user content: a report reader (read token, viewer) is refused them."""
    viewer, operator = _user_token(service, "viewer"), _user_token(service, "operator")
    for path in ("/api/experiments/ex-full/examples", "/api/experiments/ex-shadow/shadow-pairs"):
        for token in (READ_TOKEN, viewer):
            status, doc = call(service, path, token=token)
            assert status == 403 and "needs operator" in doc["detail"], (path, doc)
        for token in (operator, ADMIN):
            status, doc = call(service, path, token=token)
            assert status == 200 and doc["pairs" if "shadow" in path else "items"], (path, doc)
    # The report stays a viewer's read.
    assert call(service, "/api/experiments/ex-full/report", token=READ_TOKEN)[0] == 200


def test_the_index_serves_a_variant_page_as_a_range_scan(ex_engine: Engine, data: dict[str, Seeded]) -> None:
    with ex_engine.connect() as conn:
        conn.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                text(
                    "EXPLAIN SELECT event_id FROM interactions i WHERE i.experiment_id = :e AND i.variant = 'candidate'"
                    " ORDER BY hashtextextended(i.request_id, 0), i.event_id LIMIT 20"
                ),
                {"e": data["full"].eid},
            )
        )
    assert "ix_interactions_examples" in plan and "Sort" not in plan.split("Index")[0], plan


def test_score_and_time_values_are_echoed_in_the_applied_filter(
    service: str, data: dict[str, Seeded]
) -> None:
    since = datetime.now(UTC) - timedelta(hours=1)
    doc = examples(service, "ex-full", variant="baseline", score_min=0.5, since=since.isoformat())
    assert doc["filter"]["score_min"] == 0.5
    assert datetime.fromisoformat(doc["filter"]["since"]) == since
    assert not math.isnan(doc["filter"]["score_min"])


def test_a_page_that_cannot_be_read_within_its_budget_is_refused_with_503_and_a_reason(
    service: str, data: dict[str, Seeded], ex_engine: Engine
) -> None:
    # Another transaction holds the table: the page waits past its budget and is cancelled
    # (a filter walking a huge variant's whole index range ends the same way).
    with ex_engine.connect() as locker:
        locker.execute(text("LOCK TABLE interactions IN ACCESS EXCLUSIVE MODE"))
        status, doc = call(service, "/api/experiments/ex-full/examples", variant="candidate")
        locker.rollback()
    assert status == 503, doc
    assert doc["detail"].startswith("sampling took longer than 5 s") and "since/until" in doc["detail"]
    assert examples(service, "ex-full", variant="candidate")["items"]
