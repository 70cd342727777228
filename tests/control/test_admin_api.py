"""The one admin base URL: the analytics service's /admin, against real PostgreSQL over HTTP."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

from tests.control.conftest import AdminService
from tests.known_secrets import secret


def _audit(engine: Engine, entity: str, entity_id: str) -> list[tuple[str, str, object, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT action, actor, before, after FROM audit_log WHERE entity = :t AND entity_id = :i ORDER BY id"
            ),
            {"t": entity, "i": entity_id},
        )
        return [(str(a), str(b), c, d) for a, b, c, d in rows]


def _ab_experiment(admin_service: AdminService, name: str) -> dict[str, Any]:
    """A new upstream ``name`` and the body of an A/B experiment ``name`` on it (not created)."""
    assert (
        admin_service.call("POST", "/admin/upstreams", {"name": name, "base_url": "http://127.0.0.1:9"})[0]
        == 201
    )
    return {
        "name": name, "route": f"r-{name}", "mode": "ab",
        "variants": [{"name": "a", "upstream": name, "model": "m1", "weight": 50, "is_control": True},
                     {"name": "b", "upstream": name, "model": "m2", "weight": 50}],
    }  # fmt: skip


def test_every_admin_route_needs_the_admin_token(admin_service: AdminService) -> None:
    for method, path in [
        ("GET", "/admin/experiments"),
        ("GET", "/admin/upstreams"),
        ("POST", "/admin/api-keys"),
        ("POST", "/admin/metrics"),
        ("POST", "/admin/experiments/x/rollout/advance"),
    ]:
        assert admin_service.call(method, path, {}, token=None)[0] == 401, path
        assert admin_service.call(method, path, {}, token="")[0] == 401, path
        assert admin_service.call(method, path, {}, token="wrong-token-of-some-length")[0] == 403, path


def test_configuration_changes_are_audited_with_the_named_actor_and_no_secret(
    admin_service: AdminService, engine: Engine, unique_name: str
) -> None:
    key = secret("sk-upstream")
    status, up = admin_service.call(
        "POST", "/admin/upstreams", {"name": unique_name, "base_url": "http://127.0.0.1:9", "api_key": key},
        actor="alice",
    )  # fmt: skip
    assert status == 201 and key not in str(up)
    status, _ = admin_service.call(
        "PATCH", f"/admin/upstreams/{unique_name}", {"api_key": secret("sk-rotated")}, actor="alice"
    )
    assert status == 200
    rows = _audit(engine, "upstream", unique_name)
    assert [(a, who) for a, who, _, _ in rows] == [("create", "admin:alice"), ("update", "admin:alice")]
    assert "sk-" not in str(rows)


def test_metric_definitions_are_written_through_the_control_plane_on_both_paths(
    admin_service: AdminService, engine: Engine, unique_name: str
) -> None:
    name = unique_name.replace("-", "_")[:60]
    spec = {"name": name, "kind": "ratio", "numerator": "thumbs_up", "denominator": "requests"}
    status, body = admin_service.call("POST", "/admin/metrics", spec, actor="bob")
    assert status == 201, body
    assert admin_service.call("POST", "/api/metrics", spec, actor="bob")[0] == 409
    assert admin_service.call("DELETE", f"/api/metrics/{name}", actor="carol")[0] == 204
    assert admin_service.call("DELETE", f"/admin/metrics/{name}")[0] == 404
    assert admin_service.call("PUT", "/admin/metrics/error_rate", spec)[0] == 422  # a built-in
    rows = _audit(engine, "metric", name)
    assert [(a, who) for a, who, _, _ in rows] == [("create", "admin:bob"), ("delete", "admin:carol")]


def test_a_rollout_action_on_an_unknown_experiment_is_404_and_an_unknown_action_too(
    admin_service: AdminService,
) -> None:
    assert admin_service.call("POST", "/admin/experiments/no-such-exp/rollout/advance")[0] == 404
    status, body = admin_service.call("POST", "/admin/experiments/no-such-exp/rollout/explode")
    assert status == 404 and "advance" in body["detail"]


def test_an_experiments_blinding_is_stored_validated_and_reaches_the_gateway_snapshot(
    admin_service: AdminService, database_url: str, unique_name: str
) -> None:
    from gateway.config_source import DatabaseConfigSource

    body = _ab_experiment(admin_service, unique_name)
    status, out = admin_service.call("POST", "/admin/experiments", body)
    assert status == 201 and out["blinding"] == {"echo_model": True, "variant_header": "on_request"}
    status, out = admin_service.call("POST", "/admin/experiments", {**body, "name": unique_name + "-x",
                                     "blinding": {"variant_header": "sometimes"}})  # fmt: skip
    assert status == 422 and "variant_header" in out["detail"]
    patch = {"blinding": {"echo_model": False, "variant_header": "always"}}
    status, out = admin_service.call("PATCH", f"/admin/experiments/{unique_name}", patch)
    assert status == 200 and out["blinding"] == patch["blinding"]
    assert admin_service.call("PATCH", f"/admin/experiments/{unique_name}", {"blinding": None})[0] == 422
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/start")[0] == 200
    source = DatabaseConfigSource(database_url)
    try:
        exp = source.load().routes[f"r-{unique_name}"].experiment
    finally:
        source.dispose()
    assert (exp.echo_model, exp.variant_header) == (False, "always")


def test_segment_tags_are_declared_validated_audited_and_backfilled_through_the_control_plane(
    admin_service: AdminService, engine: Engine, database_url: str, unique_name: str
) -> None:
    from analytics.ingest.write import ingest
    from tests.analytics.ingest_helpers import connect, interaction

    body = _ab_experiment(admin_service, unique_name)
    status, out = admin_service.call("POST", "/admin/experiments", body)
    assert status == 201 and out["segment_tags"] == []
    exp = out["id"]
    path = f"/admin/experiments/{unique_name}"
    for bad, why in [
        (["task", "task"], "distinct"),
        (["a=b"], "'='"),
        ([f"k{i}" for i in range(9)], "8"),
        (["tab\there"], "control"),
        ([""], "at least 1"),
        ("task", "list"),
    ]:
        status, out = admin_service.call("PATCH", path, {"segment_tags": bad})
        assert status == 422 and why in str(out), (bad, out)
    assert admin_service.call("PATCH", path, {"segment_tags": None})[0] == 422

    # Traffic before "task" is declared: rolled up per unit, no task segment.
    events = [interaction(exp, v, f"u{i}", tags={"task": t}) for i, (v, t) in enumerate(
        [("a", "code"), ("b", "code"), ("a", "math"), ("b", "math"), ("a", "code")])]  # fmt: skip
    with connect(database_url) as conn:
        ingest(conn, events)
    status, out = admin_service.call("POST", f"{path}/segments/backfill", {})
    assert status == 422 and "declares none" in out["detail"]

    status, out = admin_service.call("PATCH", path, {"segment_tags": ["task"]}, actor="dora")
    assert status == 200 and out["segment_tags"] == ["task"]
    status, out = admin_service.call("POST", f"{path}/segments/backfill", {"keys": ["lang"]})
    assert status == 422 and "'lang'" in out["detail"]
    status, out = admin_service.call("POST", f"{path}/segments/backfill", {"keys": ["rollout_stage"]})
    assert status == 422 and "always" in out["detail"]
    status, out = admin_service.call("POST", f"{path}/segments/backfill", {}, token=None)
    assert status == 401

    def task_segments() -> dict[str, float]:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT segment, sum(requests) FROM segment_rollups WHERE experiment_id = :e GROUP BY 1"
                ),
                {"e": exp},
            )
            return {str(s): float(n) for s, n in rows}

    assert task_segments() == {}
    status, out = admin_service.call("POST", f"{path}/segments/backfill", None, actor="dora")
    assert status == 200 and out == {"experiment_id": exp, "keys": ["task"], "segment_rows": 5}, out
    assert task_segments() == {"task=code": 3.0, "task=math": 2.0}
    # Again: recomputed, not added twice.
    assert admin_service.call("POST", f"{path}/segments/backfill", {"keys": ["task"]}, actor="dora")[0] == 200
    assert task_segments() == {"task=code": 3.0, "task=math": 2.0}
    actions = [(a, who) for a, who, _, _ in _audit(engine, "experiment", str(exp))]
    assert actions[-3:] == [
        ("update", "admin:dora"),
        ("backfill_segments", "admin:dora"),
        ("backfill_segments", "admin:dora"),
    ]


def test_a_started_ab_experiments_arms_weights_mode_and_unit_key_cannot_change(
    admin_service: AdminService, engine: Engine, unique_name: str
) -> None:
    """Its data is recorded under its arms' names, each name stands for one upstream and
    model, its units were assigned by one unit key, mode and split, and its report tests
    every unit against that split (SRM): a rename, a repointed or swapped arm, an added or
    dropped arm, a new control, mode, unit key or split after the start would mix two
    treatments under one name, drop recorded arms from the report or move units between
    arms. So each is refused (409, naming each change) once the experiment has started —
    running, paused or stopped — and the experiment is unchanged; coverage and the other
    settings stay editable, and a draft takes any edit."""
    body = _ab_experiment(admin_service, unique_name)
    variants = body["variants"]
    assert admin_service.call("POST", "/admin/experiments", body)[0] == 201
    renamed = [{**variants[0], "name": "a2"}, variants[1]]
    status, draft = admin_service.call("PATCH", f"/admin/experiments/{unique_name}", {"variants": renamed})
    assert status == 200 and sorted(v["name"] for v in draft["variants"]) == ["a2", "b"], draft
    assert admin_service.call("PATCH", f"/admin/experiments/{unique_name}", {"variants": variants})[0] == 200
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/start")[0] == 200
    _, before = admin_service.call("GET", f"/admin/experiments/{unique_name}")
    third = {"name": "c", "upstream": unique_name, "model": "m3", "weight": 10}
    refused = {
        "renamed arm": ({"variants": renamed}, "'a2'"),
        "repointed model": ({"variants": [variants[0], {**variants[1], "model": "m2-v2"}]}, "'m2-v2'"),
        "new control": (
            {"variants": [{**variants[0], "is_control": False}, {**variants[1], "is_control": True}]},
            "is_control",
        ),
        "added arm": ({"variants": [*variants, third]}, "'c'"),
        "dropped arm": ({"variants": [variants[0]]}, "'b'"),
        "ramp": (
            {"variants": [{**variants[0], "weight": 10}, {**variants[1], "weight": 90}]},
            "weight 50.0 -> 90",
        ),
        "mode": ({"mode": "shadow"}, "mode"),
        "unit key": ({"unit_key": "user"}, "unit_key"),
    }
    for what, (patch, named) in refused.items():
        status, out = admin_service.call("PATCH", f"/admin/experiments/{unique_name}", patch)
        assert status == 409, (what, status, out)
        assert named in out["detail"] and "has started" in out["detail"], (what, out)
        assert admin_service.call("GET", f"/admin/experiments/{unique_name}")[1] == before, what
    same = {"variants": variants, "coverage": 0.5, "mode": "ab", "unit_key": before["unit_key"]}
    status, out = admin_service.call("PATCH", f"/admin/experiments/{unique_name}", same)
    assert status == 200 and out["coverage"] == 0.5, out
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/stop")[0] == 200
    status, out = admin_service.call("PATCH", f"/admin/experiments/{unique_name}", {"variants": renamed})
    assert status == 409 and "stopped" in out["detail"], out
    actions = [a for a, _, _, _ in _audit(engine, "experiment", str(before["id"]))]
    assert actions == ["create", "update", "update", "start", "update", "stop"]


def test_a_rollout_action_on_an_ab_experiment_is_409_saying_it_is_not_a_rollout(
    admin_service: AdminService, unique_name: str
) -> None:
    assert (
        admin_service.call("POST", "/admin/experiments", _ab_experiment(admin_service, unique_name))[0] == 201
    )
    for action in ("advance", "pause", "resume", "rollback"):
        status, body = admin_service.call("POST", f"/admin/experiments/{unique_name}/rollout/{action}")
        assert (
            status == 409 and body["detail"] == f"experiment {unique_name!r} is not a rollout (mode 'ab')"
        ), body


def test_start_pause_and_stop_set_status_reason_and_times_once_each_and_a_second_running_test_is_422(
    admin_service: AdminService, engine: Engine, unique_name: str
) -> None:
    """Every status change goes through ``control.rollout.set_status``: the first start sets
    ``started_at`` and a restart after a pause keeps it; a stop sets ``stopped_at``; the
    reason names the action and the actor; a start on a route another running experiment
    holds is a 422 that changes nothing."""
    assert (
        admin_service.call("POST", "/admin/experiments", _ab_experiment(admin_service, unique_name))[0] == 201
    )
    other = _ab_experiment(admin_service, unique_name + "-2")
    other["route"] = f"r-{unique_name}"  # the same route
    assert admin_service.call("POST", "/admin/experiments", other)[0] == 201

    def row(name: str) -> tuple[Any, ...]:
        with engine.connect() as conn:
            return tuple(
                conn.execute(
                    text(
                        "SELECT status, status_reason, started_at, stopped_at FROM experiments WHERE name = :n"
                    ),
                    {"n": name},
                ).one()
            )

    assert row(unique_name)[2:] == (None, None)
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/start", actor="alice")[0] == 200
    status, reason, started, stopped = row(unique_name)
    assert (status, reason, stopped) == ("running", "start by admin:alice", None) and started is not None
    status_code, out = admin_service.call("POST", f"/admin/experiments/{unique_name}-2/start")
    assert status_code == 422 and "already running" in out["detail"], out
    assert row(unique_name + "-2")[:3] == ("draft", None, None)
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/pause", actor="bob")[0] == 200
    assert row(unique_name) == ("paused", "pause by admin:bob", started, None)
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/start", actor="bob")[0] == 200
    assert row(unique_name) == ("running", "start by admin:bob", started, None)  # the first start's time kept
    assert admin_service.call("POST", f"/admin/experiments/{unique_name}/stop", actor="carol")[0] == 200
    status, reason, again, stopped = row(unique_name)
    assert (status, reason, again) == ("stopped", "stop by admin:carol", started) and stopped >= started
    actions = [(a, actor) for a, actor, _, _ in _audit(engine, "experiment", str(_id(engine, unique_name)))]
    assert actions[1:] == [
        ("start", "admin:alice"),
        ("pause", "admin:bob"),
        ("start", "admin:bob"),
        ("stop", "admin:carol"),
    ]


def _id(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM experiments WHERE name = :n"), {"n": name}).scalar_one())
