"""Admin API typing against real PostgreSQL: every invalid field is a 422 with a reason, never a
500, never a database round trip, never a secret in the log.

Reproduces issue 13: explicit ``null``s in a PATCH answered 500 and logged the upstream's API
key (the database's "failing row"); NUL in names, a 20-digit experiment id and ``%C2%B2`` were
500s; ``{"max_connections": true}`` and an API key that cannot be an HTTP header were accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from contracts.tables import AuditLog
from gateway.config_source import DatabaseConfigSource
from tests.gateway.conftest import ADMIN_TOKEN, MemorySink, http, start_gateway

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "sk-upstream-very-secret-0123456789"


@pytest.fixture(scope="module")
def gw(database_url: str) -> Iterator[str]:
    with start_gateway(MemorySink(), DatabaseConfigSource(database_url), database_url=database_url) as g:
        yield g.url


@pytest.fixture
def upstream(gw: str, simulator: str, unique_name: str) -> str:
    r = http(
        "POST",
        gw + "/admin/upstreams",
        {"name": unique_name, "base_url": simulator, "api_key": SECRET},
        headers=AUTH,
    )
    assert r.status_code == 201, r.text
    return unique_name


@pytest.fixture
def exp(gw: str, upstream: str, unique_name: str) -> str:
    body = {
        "name": f"e-{unique_name}",
        "route": f"r-{unique_name}",
        "mode": "ab",
        "variants": [
            {"name": "control", "upstream": upstream, "model": "base", "weight": 1, "is_control": True},
            {"name": "cand", "upstream": upstream, "model": "cand", "weight": 1},
        ],
    }
    r = http("POST", gw + "/admin/experiments", body, headers=AUTH)
    assert r.status_code == 201, r.text
    return f"e-{unique_name}"


def _deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _call(url: str, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
    headers = {**AUTH, "content-type": "application/json"} if raw is not None else AUTH
    return http(method, url + "/admin" + path, body, content=raw, headers=headers)


def _audit_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(AuditLog)).scalar_one())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"api_key": "sk-€-not-latin-1"}, "not Latin-1"),
        ({"api_key": "sk-abc\r\nX-Injected: 1"}, "control characters"),
        ({"api_key": " sk-padded "}, "whitespace"),
        ({"base_url": "http://127.0.0.1:99999/v1"}, "invalid port"),
        ({"base_url": "ftp://example.com"}, "http:// or https://"),
        ({"base_url": "http://user:pw@example.com/v1"}, "credentials"),
        ({"base_url": "http://exämple.com/v1"}, "ASCII"),
        ({"max_connections": True}, "valid integer"),
        ({"max_connections": 1.5}, "valid integer"),
        ({"max_connections": 0}, "greater than or equal to 1"),
        ({"timeout_s": "5"}, "valid number"),
        ({"timeout_s": 10**400}, "valid number"),
        ({"name": "a\x00b"}, "pattern"),
    ],
)
def test_invalid_upstream_fields_are_422_and_nothing_is_stored(
    gw: str, simulator: str, unique_name: str, engine: Engine, change: dict[str, Any], reason: str
) -> None:
    audits = _audit_rows(engine)
    body = {"name": unique_name, "base_url": simulator, **change}
    r = _call(gw, "POST", "/upstreams", body)
    assert r.status_code == 422 and reason in r.json()["detail"], r.text
    assert _call(gw, "GET", f"/upstreams/{unique_name}").status_code == 404
    assert _audit_rows(engine) == audits
    assert "sk-€" not in r.text and "X-Injected" not in r.text  # the key is never echoed


@pytest.mark.parametrize("field", ["base_url", "timeout_s", "connect_timeout_s", "max_connections"])
def test_explicit_nulls_in_an_upstream_patch_are_422_and_the_key_never_reaches_the_log(
    gw: str, upstream: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    r = _call(gw, "PATCH", f"/upstreams/{upstream}", {field: None})
    assert r.status_code == 422 and f"{field} cannot be null" in r.json()["detail"], r.text
    assert SECRET not in caplog.text and SECRET not in r.text
    assert _call(gw, "GET", f"/upstreams/{upstream}").json()["api_key"] == "***" + SECRET[-4:]


def test_a_null_api_key_removes_the_key(gw: str, upstream: str) -> None:
    r = _call(gw, "PATCH", f"/upstreams/{upstream}", {"api_key": None})
    assert r.status_code == 200 and r.json()["api_key"] is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"name": "nul\x00name"}, "control characters"),
        ({"route": "r\x00"}, "control characters"),
        ({"description": "a\x00b"}, "control characters"),
        ({"salt": "s\x1b"}, "control characters"),
        ({"forced": {"unit\x00": "control"}}, "control characters"),
        ({"targeting": [{"attribute": "tag:x", "op": "in", "values": ["a\x00"]}]}, "NUL"),
        ({"metrics": [{"name": "m\x00"}]}, "NUL"),
        ({"rollout_plan": {"note": "\x00"}}, "NUL"),
        ({"rollout_plan": {"deep": _deep(70)}}, "nested"),
        ({"metrics": [{"big": 10**30}]}, "64-bit"),
        ({"coverage": True}, "valid number"),
        ({"coverage": 1.5}, "less than or equal to 1"),
        ({"fallback_to_control": 1}, "valid boolean"),
        ({"mode": "ab\x00"}, "control characters"),
    ],
)
def test_invalid_experiment_fields_are_422_and_nothing_is_stored(
    gw: str, upstream: str, unique_name: str, engine: Engine, change: dict[str, Any], reason: str
) -> None:
    audits = _audit_rows(engine)
    body = {
        "name": f"x-{unique_name}",
        "route": f"x-{unique_name}",
        "mode": "ab",
        "variants": [
            {"name": "control", "upstream": upstream, "model": "base", "weight": 1, "is_control": True},
            {"name": "cand", "upstream": upstream, "model": "cand", "weight": 1},
        ],
        **change,
    }
    r = _call(gw, "POST", "/experiments", body)
    assert r.status_code == 422 and reason in r.json()["detail"], r.text
    assert _audit_rows(engine) == audits


def test_nan_and_infinity_in_free_form_json_are_422(gw: str, exp: str) -> None:
    # Python's JSON reader (FastAPI's) accepts these non-standard literals: they must not reach JSONB.
    for raw in (b'{"rollout_plan": {"x": NaN}}', b'{"metrics": [Infinity]}', b'{"coverage": NaN}'):
        r = _call(gw, "PATCH", f"/experiments/{exp}", raw=raw)
        assert r.status_code == 422, (raw, r.text)


@pytest.mark.parametrize("field", ["route", "mode", "coverage", "targeting", "forced", "variants", "metrics"])
def test_explicit_nulls_in_an_experiment_patch_are_422(gw: str, exp: str, field: str) -> None:
    r = _call(gw, "PATCH", f"/experiments/{exp}", {field: None})
    assert r.status_code == 422 and f"{field} cannot be null" in r.json()["detail"], r.text


def test_nullable_experiment_fields_may_be_cleared(gw: str, exp: str) -> None:
    r = _call(
        gw, "PATCH", f"/experiments/{exp}", {"description": None, "rollout_plan": None, "rollout_stage": None}
    )
    assert r.status_code == 200, r.text
    r = _call(gw, "PATCH", f"/experiments/{exp}", {"rollout_stage": 10**20})
    assert r.status_code == 422


@pytest.mark.parametrize(
    "path",
    [
        "/experiments/12345678901234567890",
        "/experiments/2147483648",
        "/experiments/%C2%B2",
        "/experiments/%00",
        "/experiments/a%00b/start",
        "/upstreams/%00",
        "/upstreams/" + "u" * 300,
    ],
)
def test_names_and_ids_that_cannot_exist_are_404_not_500(gw: str, path: str) -> None:
    method = "POST" if path.endswith("/start") else "GET"
    assert _call(gw, method, path).status_code == 404
    assert _call(gw, "DELETE", "/api-keys/%00").status_code == 404


def test_an_api_key_name_with_control_characters_is_422(gw: str) -> None:
    r = _call(gw, "POST", "/api-keys", {"name": "k\x00"})
    assert r.status_code == 422 and "control characters" in r.json()["detail"]


def test_a_database_error_is_answered_without_its_text_in_the_log(
    gw: str, upstream: str, caplog: pytest.LogCaptureFixture, engine: Engine
) -> None:
    """The backstop: whatever still fails in the database is logged by class and SQLSTATE only."""
    caplog.set_level(logging.DEBUG)
    with engine.begin() as conn:  # a constraint the API does not know about makes the next write fail
        conn.exec_driver_sql(
            "ALTER TABLE upstreams ADD CONSTRAINT test_no_big_pools CHECK (max_connections < 50000) NOT VALID"
        )
    try:
        r = _call(gw, "PATCH", f"/upstreams/{upstream}", {"max_connections": 60000})
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE upstreams DROP CONSTRAINT test_no_big_pools")
    assert r.status_code == 409, r.text
    assert SECRET not in caplog.text and SECRET not in r.text
    assert "SQLSTATE 23514" in caplog.text
