"""Snapshot refresh and ``/readyz`` tell the truth (real PostgreSQL, real server, real upstreams).

Reproduces issue 13: an upstream API key with a non-Latin-1 character broke the client of
every later upstream (502) while ``/readyz`` said ready, the refresh logged "keeping the last
snapshot" although routing had changed, and it was never retried; ``/readyz`` answered 503
when one *unused* upstream was unreachable although every route could serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from gateway.config_source import DatabaseConfigSource
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import (
    ADMIN_TOKEN,
    MemorySink,
    dead_url,
    experiment,
    get,
    http,
    post,
    start_gateway,
    static_source,
)

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MSG = [{"role": "user", "content": "hi"}]
BAD_KEY = "sk-€uro-key-0123456789"  # cannot be sent in an HTTP header


def _until(predicate: Any, limit: float = 3.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _route(url: str, name: str, simulator: str, model: str = "base", key: str | None = None) -> None:
    body: dict[str, Any] = {"name": name, "base_url": simulator, **({"api_key": key} if key else {})}
    assert http("POST", url + "/admin/upstreams", body, headers=AUTH).status_code == 201
    exp = {
        "name": name,
        "route": name,
        "mode": "ab",
        "variants": [
            {"name": "control", "upstream": name, "model": model, "weight": 1, "is_control": True},
            {"name": "cand", "upstream": name, "model": "cand", "weight": 0},
        ],
    }
    assert http("POST", url + "/admin/experiments", exp, headers=AUTH).status_code == 201
    assert http("POST", url + f"/admin/experiments/{name}/start", headers=AUTH).status_code == 200


def _chat(url: str, route: str) -> Any:
    return post(url + "/v1/chat/completions", {"model": route, "messages": MSG, "user": "u1"})


@pytest.fixture(scope="module")
def gw(module_database_url: str) -> Iterator[tuple[str, str]]:
    with start_gateway(
        MemorySink(),
        DatabaseConfigSource(module_database_url),
        database_url=module_database_url,
        refresh_interval_s=0.2,
    ) as g:
        yield g.url, module_database_url


def test_an_unusable_upstream_config_breaks_nothing_else_and_is_retried_until_it_applies(
    gw: tuple[str, str], simulator: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, database_url = gw
    caplog.set_level(logging.INFO, logger="gateway.config_source")
    _route(url, "alpha", simulator)
    _route(url, "bravo", simulator, key="sk-good-key-0123456789")
    _until(lambda: _chat(url, "alpha").status_code == 200 and _chat(url, "bravo").status_code == 200)
    engine = create_engine(database_url)
    try:
        # Another writer (not the admin API, which refuses it) stores a key that cannot be a
        # header, and in the same transaction ramps alpha and adds charlie, a new route.
        with engine.begin() as conn:
            conn.execute(text("UPDATE upstreams SET api_key = :k WHERE name = 'bravo'"), {"k": BAD_KEY})
            conn.execute(
                text(
                    "UPDATE variants SET weight = CASE WHEN is_control THEN 0 ELSE 100 END "
                    "WHERE experiment_id = (SELECT id FROM experiments WHERE name = 'alpha')"
                )
            )
        _route(url, "charlie", simulator)
        # Routing changed completely: alpha serves its candidate, charlie (created after the
        # bad row) serves, and bravo keeps its last good client instead of failing.
        _until(lambda: _chat(url, "alpha").headers.get("x-liftgate-variant") == "cand")
        _until(lambda: _chat(url, "charlie").status_code == 200)
        assert _chat(url, "bravo").status_code == 200
        ready = get(url + "/readyz")
        assert ready.status_code == 200, ready.text
        assert "not Latin-1" in ready.json()["config_errors"]["bravo"]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("bravo" in w and "retrying" in w and "not Latin-1" in w for w in warnings), warnings
        assert not any("keeping the last snapshot" in w for w in warnings)
        assert BAD_KEY not in caplog.text
        # Fixed in the database: applied on a later tick without any other change.
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE upstreams SET api_key = 'sk-fixed-key-0123456789' WHERE name = 'bravo'")
            )
        _until(lambda: get(url + "/readyz").json()["config_errors"] == {})
        assert any("applied" in r.getMessage() for r in caplog.records)
    finally:
        engine.dispose()


def test_a_route_whose_new_upstream_cannot_be_built_makes_readyz_say_why(
    gw: tuple[str, str], simulator: str
) -> None:
    url, database_url = gw
    _route(url, "delta", simulator)
    _until(lambda: _chat(url, "delta").status_code == 200)
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO upstreams (name, base_url, api_key) VALUES ('echo', :u, :k)"),
                {"u": simulator, "k": BAD_KEY},
            )
            conn.execute(
                text(
                    "UPDATE variants SET upstream_id = (SELECT id FROM upstreams WHERE name = 'echo') "
                    "WHERE experiment_id = (SELECT id FROM experiments WHERE name = 'delta')"
                )
            )
        _until(lambda: _chat(url, "delta").status_code == 502)
        ready = get(url + "/readyz")
        assert ready.status_code == 503
        (reason,) = ready.json()["reasons"]
        assert "route 'delta'" in reason and "'echo'" in reason and "not Latin-1" in reason
        assert _chat(url, "alpha").status_code == 200  # the others serve on
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE experiments SET status = 'stopped' WHERE name = 'delta'"))
        engine.dispose()
    _until(lambda: get(url + "/readyz").status_code == 200)


def test_an_unused_unreachable_upstream_does_not_make_the_gateway_unready(simulator: str) -> None:
    ups = [UpstreamConfig("sim", simulator), UpstreamConfig("spare", dead_url(), connect_timeout_s=0.5)]
    exps = [
        experiment(
            "main", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 1)]
        )
    ]
    with start_gateway(MemorySink(), static_source(exps, ups)) as g:
        ready = get(g.url + "/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["routes"] == {"main": {"ok": True}} and "spare" not in ready.json()["upstreams"]


@pytest.mark.parametrize(
    ("candidate_weight", "fallback", "mode", "ready"),
    [
        (1, False, "ab", False),  # half the users would get errors
        (1, True, "ab", True),  # a failed candidate call is served by the control
        (0, False, "ab", True),  # the candidate gets no traffic
        (1, False, "shadow", True),  # shadow candidates never answer a user
    ],
)
def test_readyz_counts_an_unreachable_candidate_only_when_users_depend_on_it(
    simulator: str, candidate_weight: int, fallback: bool, mode: str, ready: bool
) -> None:
    ups = [UpstreamConfig("sim", simulator), UpstreamConfig("down", dead_url(), connect_timeout_s=0.5)]
    variants = [
        VariantConfig("control", "sim", "base", 1, True),
        VariantConfig("c", "down", "cand", candidate_weight),
    ]
    exps = [experiment("main", variants, mode=mode, fallback_to_control=fallback)]
    with start_gateway(MemorySink(), static_source(exps, ups)) as g:
        r = get(g.url + "/readyz")
        assert (r.status_code == 200) is ready, r.text
        if not ready:
            assert r.json()["reasons"] == ["route 'main': upstream 'down' is unreachable"]


def test_readyz_is_503_with_the_reason_when_a_control_is_unreachable(simulator: str) -> None:
    ups = [UpstreamConfig("sim", simulator), UpstreamConfig("down", dead_url(), connect_timeout_s=0.5)]
    exps = [
        experiment(
            "ok", [VariantConfig("control", "sim", "base", 1, True), VariantConfig("c", "sim", "cand", 0)]
        ),
        experiment(
            "broken",
            [VariantConfig("control", "down", "base", 1, True), VariantConfig("c", "sim", "cand", 0)],
            exp_id=2,
        ),
    ]
    with start_gateway(MemorySink(), static_source(exps, ups)) as g:
        r = get(g.url + "/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["routes"]["ok"] == {"ok": True}
        assert body["routes"]["broken"] == {"ok": False, "reason": "upstream 'down' is unreachable"}
