"""Admin API against real PostgreSQL, and config changes reaching the request path within 1 s."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select

from contracts.tables import ApiKey, AuditLog
from gateway.config_source import DatabaseConfigSource
from gateway.routing import key_hash
from tests.gateway.conftest import ADMIN_TOKEN, MemorySink, http, post, start_gateway

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gw(database_url: str) -> Iterator[tuple[str, MemorySink]]:
    sink = MemorySink()
    with start_gateway(
        sink, DatabaseConfigSource(database_url), database_url=database_url, refresh_interval_s=0.2
    ) as g:
        yield g.url, sink


def admin(url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    return http(method, url + "/admin" + path, body, headers=AUTH if headers is None else headers)


def _setup(url: str, name: str, simulator: str, **extra: Any) -> dict[str, Any]:
    r = admin(
        url,
        "POST",
        "/upstreams",
        {"name": f"up-{name}", "base_url": simulator, "api_key": "sk-upstream-secret-123"},
    )
    assert r.status_code == 201, r.text
    body = {
        "name": name,
        "route": f"route-{name}",
        "mode": "ab",
        "variants": [
            {"name": "control", "upstream": f"up-{name}", "model": "base", "weight": 100, "is_control": True},
            {"name": "cand", "upstream": f"up-{name}", "model": "cand", "weight": 0},
        ],
        **extra,
    }
    r = admin(url, "POST", "/experiments", body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _variant_within(url: str, route: str, want: str, limit: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit + 1.0:
        r = post(url + "/v1/chat/completions", {"model": route, "messages": MSG, "user": "steady"})
        if r.status_code == 200 and r.headers.get("x-liftgate-variant") == want:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"{route} never served {want}")


def test_admin_requires_a_bearer_token(gw: tuple[str, MemorySink]) -> None:
    url, _ = gw
    assert admin(url, "GET", "/experiments", headers={}).status_code == 401
    assert admin(url, "GET", "/experiments", headers={"Authorization": "Basic abc"}).status_code == 401
    r = admin(url, "GET", "/experiments", headers={"Authorization": "Bearer wrong-token-of-some-length"})
    assert r.status_code == 403 and r.json() == {"detail": "invalid admin token"}


def test_the_gateway_points_metric_and_rollout_writes_to_the_control_plane(
    gw: tuple[str, MemorySink],
) -> None:
    url, _ = gw
    for method, path, body in [
        ("POST", "/metrics", {"name": "m", "kind": "mean", "column": "latency_ms"}),
        ("DELETE", "/metrics/m", None),
        ("POST", "/experiments/anything/rollout/advance", None),
    ]:
        r = admin(url, method, path, body)
        assert r.status_code == 404 and "analytics service's /admin" in r.json()["detail"], (path, r.text)


def test_the_gateway_records_the_actor_header_as_the_control_plane_does(
    gw: tuple[str, MemorySink], simulator: str, unique_name: str, engine: Engine
) -> None:
    url, _ = gw
    headers = {**AUTH, "X-Liftgate-Actor": "dana"}
    assert (
        admin(url, "POST", "/upstreams", {"name": unique_name, "base_url": simulator}, headers).status_code
        == 201
    )
    with engine.connect() as conn:
        actor = conn.execute(
            select(AuditLog.actor).where(AuditLog.entity == "upstream", AuditLog.entity_id == unique_name)
        ).scalar_one()
    assert actor == "admin:dana"


def test_experiment_lifecycle_applies_within_one_second(
    gw: tuple[str, MemorySink], simulator: str, unique_name: str, engine: Engine
) -> None:
    url, _ = gw
    exp = _setup(url, unique_name, simulator)
    route = exp["route"]
    assert exp["salt"] and exp["status"] == "draft"
    assert post(url + "/v1/chat/completions", {"model": route, "messages": MSG}).status_code == 404
    # A draft takes any edit: every covered unit to the candidate, no unit covered yet.
    variants = [
        {
            "name": "control",
            "upstream": f"up-{unique_name}",
            "model": "base",
            "weight": 0,
            "is_control": True,
        },
        {"name": "cand", "upstream": f"up-{unique_name}", "model": "cand", "weight": 100},
    ]
    r = admin(url, "PATCH", f"/experiments/{unique_name}", {"variants": variants, "coverage": 0.0})
    assert r.status_code == 200, r.text
    assert admin(url, "POST", f"/experiments/{unique_name}/start").status_code == 200
    _variant_within(url, route, "control", 1.0)
    # cover every unit (a running A/B's split is fixed; its coverage is not): the next
    # requests must see the candidate within 1 s
    assert admin(url, "PATCH", f"/experiments/{unique_name}", {"coverage": 1.0}).status_code == 200
    assert _variant_within(url, route, "cand", 1.0) <= 1.0
    assert admin(url, "POST", f"/experiments/{unique_name}/pause").status_code == 200
    assert _variant_within(url, route, "control", 1.0) <= 1.0
    r = post(url + "/v1/chat/completions", {"model": route, "messages": MSG})
    assert "x-liftgate-experiment" not in r.headers
    assert admin(url, "POST", f"/experiments/{unique_name}/stop").status_code == 200
    deadline = time.monotonic() + 1.5
    while post(url + "/v1/chat/completions", {"model": route, "messages": MSG}).status_code != 404:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with engine.connect() as conn:
        rows = conn.execute(
            select(AuditLog.action, AuditLog.before, AuditLog.after).where(
                AuditLog.entity_id == str(exp["id"])
            )
        ).all()
        ups = conn.execute(select(AuditLog.after).where(AuditLog.entity_id == f"up-{unique_name}")).all()
    assert [a for a, _, _ in rows] == ["create", "update", "start", "update", "pause", "stop"]
    draft_edit, cover = rows[1], rows[3]
    assert draft_edit[1]["variants"][1]["weight"] == 0 and draft_edit[2]["variants"][1]["weight"] == 100
    assert cover[1]["coverage"] == 0.0 and cover[2]["coverage"] == 1.0
    assert "sk-upstream-secret-123" not in str(ups)
    listed = admin(url, "GET", f"/upstreams/up-{unique_name}").json()
    assert listed["api_key"] == "***-123"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"mode": "canary"}, "unknown mode"),
        ({"coverage": 1.5}, "coverage"),
        (
            {
                "variants": [
                    {"name": "a", "upstream": "U", "model": "m", "weight": -1, "is_control": True},
                    {"name": "b", "upstream": "U", "model": "m", "weight": 1},
                ]
            },
            "weight: Input should be greater than or equal to 0",
        ),
        (
            {
                "variants": [
                    {"name": "a", "upstream": "U", "model": "m", "weight": 1},
                    {"name": "b", "upstream": "U", "model": "m", "weight": 1},
                ]
            },
            "control",
        ),
        (
            {
                "variants": [
                    {"name": "a", "upstream": "U", "model": "m", "is_control": True},
                    {"name": "b", "upstream": "U", "model": "m", "is_control": True},
                ]
            },
            "control",
        ),
        (
            {
                "variants": [
                    {"name": "a", "upstream": "U", "model": "m", "is_control": True},
                    {"name": "a", "upstream": "U", "model": "m"},
                ]
            },
            "duplicate",
        ),
        (
            {
                "variants": [
                    {"name": "a", "upstream": "U", "model": "m", "is_control": True},
                    {"name": "b", "upstream": "nowhere", "model": "m"},
                ]
            },
            "unknown upstream",
        ),
        ({"mode": "rollout", "rollout_plan": {"stages": [5, 1]}}, "increasing"),
        ({"targeting": [{"attribute": "ip", "op": "in", "values": []}]}, "attribute"),
        ({"shadow_sample_rate": -0.1}, "shadow_sample_rate"),
    ],
)
def test_invalid_experiments_get_422_with_a_reason(
    gw: tuple[str, MemorySink], simulator: str, unique_name: str, change: dict[str, Any], reason: str
) -> None:
    url, _ = gw
    up = f"up-{unique_name}"
    assert admin(url, "POST", "/upstreams", {"name": up, "base_url": simulator}).status_code == 201
    body: dict[str, Any] = {
        "name": unique_name,
        "route": f"r-{unique_name}",
        "mode": "ab",
        "variants": [
            {"name": "control", "upstream": up, "model": "base", "is_control": True, "weight": 1},
            {"name": "c", "upstream": up, "model": "cand", "weight": 1},
        ],
    }
    body.update(change)
    for v in body["variants"]:
        v["upstream"] = up if v["upstream"] == "U" else v["upstream"]
    r = admin(url, "POST", "/experiments", body)
    assert r.status_code == 422, r.text
    assert reason in r.json()["detail"]


def test_second_running_experiment_on_a_route_is_refused(
    gw: tuple[str, MemorySink], simulator: str, unique_name: str
) -> None:
    url, _ = gw
    first = _setup(url, unique_name, simulator)
    second = dict(first)
    body = {"name": unique_name + "-2", "route": first["route"], "mode": "ab", "variants": first["variants"]}
    assert admin(url, "POST", "/experiments", body).status_code == 201
    assert admin(url, "POST", f"/experiments/{first['id']}/start").status_code == 200
    r = admin(url, "POST", f"/experiments/{second['name']}-2/start")
    assert r.status_code == 422 and "already running" in r.json()["detail"]


def test_client_api_keys_are_returned_once_and_stored_hashed(
    gw: tuple[str, MemorySink], unique_name: str, engine: Engine
) -> None:
    url, _ = gw
    created = admin(url, "POST", "/api-keys", {"name": unique_name})
    assert created.status_code == 201
    key = created.json()["key"]
    assert all("key" not in k for k in admin(url, "GET", "/api-keys").json())
    with engine.connect() as conn:
        (stored,) = conn.execute(select(ApiKey.key_hash).where(ApiKey.name == unique_name)).one()
    assert stored == key_hash(key) and key not in stored
    assert admin(url, "DELETE", f"/api-keys/{unique_name}").json()["revoked"] is True


GATE_DECLARATION = {"suites": ["demo"]}
GATE_PARAMS = {"temperature": 0}


def _declare_gate(engine: Engine, experiment_id: int) -> None:
    import orjson
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO offline_gates (experiment_id, declaration, updated_by) VALUES (:e, CAST(:d AS jsonb), 't')"),
            {"e": experiment_id, "d": orjson.dumps(GATE_DECLARATION).decode()},
        )  # fmt: skip


def _gate_passed(engine: Engine, experiment_id: int, upstream: str, base_url: str) -> None:
    """A passing decision for variant ``cand`` (model ``cand``) against ``control`` (``base``),
    both on ``upstream`` at ``base_url``: what the gate vouches for."""
    import orjson
    from sqlalchemy import text

    from contracts.offline_gate import candidate_fingerprint

    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO gate_decisions (experiment_id, variant, baseline_variant, candidate_fingerprint,"
                " baseline_fingerprint, upstream, model, params, passed, verdict, declaration, actor)"
                " VALUES (:e, 'cand', 'control', :fc, :fb, :u, 'cand', CAST(:p AS jsonb), true, 'pass',"
                " CAST(:d AS jsonb), 't')"
            ),
            {
                "e": experiment_id, "u": upstream,
                "fc": candidate_fingerprint(upstream, base_url, "cand", GATE_PARAMS),
                "fb": candidate_fingerprint(upstream, base_url, "base", GATE_PARAMS),
                "p": orjson.dumps(GATE_PARAMS).decode(), "d": orjson.dumps(GATE_DECLARATION).decode(),
            },
        )  # fmt: skip


def _both_arms(name: str) -> list[dict[str, Any]]:
    return [
        {"name": "control", "upstream": f"up-{name}", "model": "base", "weight": 50, "is_control": True},
        {"name": "cand", "upstream": f"up-{name}", "model": "cand", "weight": 50},
    ]


def test_an_ab_experiment_with_a_declared_offline_gate_starts_only_once_the_gate_passed(
    gw: tuple[str, MemorySink], simulator: str, engine: Engine
) -> None:
    """Users see an A/B candidate: with a declared gate and no passing decision for the
    candidate as configured now, start (and an edit of a running experiment) answers 409."""
    url, _ = gw
    exp = _setup(url, "gated-ab", simulator)
    r = admin(url, "PATCH", "/experiments/gated-ab", {"variants": _both_arms("gated-ab")})
    assert r.status_code == 200, r.text
    _declare_gate(engine, exp["id"])
    r = admin(url, "POST", "/experiments/gated-ab/start")
    assert r.status_code == 409 and "offline gate" in r.json()["detail"], r.text
    assert admin(url, "GET", "/experiments/gated-ab").json()["status"] == "draft"
    _gate_passed(engine, exp["id"], "up-gated-ab", simulator)
    r = admin(url, "POST", "/experiments/gated-ab/start")
    assert r.status_code == 200, r.text
    # Repointing the running candidate at a model the gate never saw is refused, unchanged.
    arms = _both_arms("gated-ab")
    r = admin(url, "PATCH", "/experiments/gated-ab", {"variants": [arms[0], {**arms[1], "model": "cand-v2"}]})
    assert r.status_code == 409 and "'cand-v2'" in r.json()["detail"], r.text
    after = admin(url, "GET", "/experiments/gated-ab").json()
    assert [v["model"] for v in after["variants"]] == ["base", "cand"]
    assert admin(url, "POST", "/experiments/gated-ab/stop").status_code == 200


def test_moving_a_gated_running_candidates_upstream_to_another_url_is_refused_until_paused(
    gw: tuple[str, MemorySink], simulator: str, engine: Engine
) -> None:
    """A gate decision vouches for the candidate's fingerprint, which includes its upstream's
    URL: pointing that upstream at another server while the A/B test runs would show users a
    model the gate never saw, as repointing the variant would (refused above). So an upstream
    edit that changes a running gated candidate's (or its baseline's) fingerprint answers 409
    and changes nothing; paused, the experiment serves the control only, the edit goes
    through, and starting again asks the gate about the new fingerprint."""
    url, _ = gw
    name = "gated-move"
    exp = _setup(url, name, simulator)
    assert admin(url, "PATCH", f"/experiments/{name}", {"variants": _both_arms(name)}).status_code == 200
    _declare_gate(engine, exp["id"])
    _gate_passed(engine, exp["id"], f"up-{name}", simulator)
    assert admin(url, "POST", f"/experiments/{name}/start").status_code == 200
    elsewhere = simulator.rstrip("/") + "/elsewhere"
    r = admin(url, "PATCH", f"/upstreams/up-{name}", {"base_url": elsewhere})
    assert r.status_code == 409, r.text
    assert f"'{name}'" in r.json()["detail"] and "offline gate" in r.json()["detail"], r.text
    assert admin(url, "GET", f"/upstreams/up-{name}").json()["base_url"] == simulator
    # A change that keeps the fingerprints (the timeout) is not held.
    assert admin(url, "PATCH", f"/upstreams/up-{name}", {"timeout_s": 30}).status_code == 200
    assert admin(url, "POST", f"/experiments/{name}/pause").status_code == 200
    r = admin(url, "PATCH", f"/upstreams/up-{name}", {"base_url": elsewhere})
    assert r.status_code == 200, r.text
    r = admin(url, "POST", f"/experiments/{name}/start")
    assert r.status_code == 409 and "offline gate" in r.json()["detail"], r.text
    assert admin(url, "PATCH", f"/upstreams/up-{name}", {"base_url": simulator}).status_code == 200
    assert admin(url, "POST", f"/experiments/{name}/start").status_code == 200
    assert admin(url, "POST", f"/experiments/{name}/stop").status_code == 200


def test_huge_numbers_in_an_experiments_json_fields_are_stored_and_audited_not_a_500(
    gw: tuple[str, MemorySink], simulator: str, unique_name: str, engine: Engine
) -> None:
    """jsonb writes 1.6e234 back as a 235-digit integer; the audit row of the next change
    must still be written (found by the fuzz suite: orjson refuses ints beyond 64 bits)."""
    from sqlalchemy import text

    url, _ = gw
    _setup(url, unique_name, simulator)
    huge = [[-1.1901420280466835e-92, None, -1.6769594528544297e234], None]
    r = admin(url, "PATCH", f"/experiments/{unique_name}", {"metrics": huge})
    assert r.status_code == 200, r.text
    r = admin(url, "PATCH", f"/experiments/{unique_name}", {"description": "after"})
    assert r.status_code == 200, r.text
    with engine.connect() as conn:
        after = conn.execute(
            text(
                "SELECT after FROM audit_log WHERE entity = 'experiment' AND after->>'name' = :n ORDER BY id DESC"
            ),
            {"n": unique_name},
        ).scalar()
    from decimal import Decimal

    assert after["description"] == "after"
    assert after["metrics"][0][2] == int(Decimal("-1.6769594528544297e234"))
