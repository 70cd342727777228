"""The analytics service as a real subprocess: API, auth, audit, snapshotter, metrics, CLI."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, text

from analytics.report.schema import Report
from tests.analytics.report_data import create_experiment, insert_units, simulate_units
from tests.known_secrets import secret
from tests.services import analytics_service

ROOT = Path(__file__).resolve().parents[3]
TOKEN = secret("test")
READ_TOKEN = secret("read")
DEADLINE_S = 30.0


@dataclass
class Service:
    url: str

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = READ_TOKEN
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                ctype = resp.headers.get("content-type", "")
                return resp.status, json.loads(raw) if raw and "json" in ctype else raw.decode()
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def seeded(engine: Engine) -> dict[str, Any]:
    """A running experiment with data, committed so the service process sees it."""
    rng = np.random.default_rng(4)
    with engine.begin() as conn:
        eid, name = create_experiment(conn, [("control", 1), ("candidate", 1)],
                                      metrics=["thumbs_up_rate", "error_rate"])  # fmt: skip
        insert_units(conn, eid, "control", simulate_units(rng, 400, thumbs_p=0.2, tokens=100, error_p=0.05))
        insert_units(conn, eid, "candidate", simulate_units(rng, 400, thumbs_p=0.3, tokens=100, error_p=0.05))
        draft, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status="draft")
    return {"id": eid, "name": name, "draft": draft}


@pytest.fixture(scope="module")
def service(database_url: str, seeded: dict[str, Any]) -> Iterator[Service]:
    with analytics_service(
        database_url, TOKEN, read_token=READ_TOKEN, snapshot_interval_s="0.3", report_max_age_s="60"
    ) as url:
        yield Service(url)


def test_service_refuses_to_start_without_a_strong_admin_token(database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTGATE_")}
    env |= {"LIFTGATE_DATABASE_URL": database_url, "LIFTGATE_ADMIN_TOKEN": "changeme"}
    res = subprocess.run(
        [sys.executable, "-m", "analytics"], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert res.returncode == 2
    assert b"admin_token" in res.stderr


def test_health_and_prometheus_metrics(service: Service) -> None:
    status, body = service.call("GET", "/healthz")
    assert status == 200 and body["status"] == "ok"
    assert body["workers"]["snapshotter"] is True and body["workers"]["rollout"] is True
    status, text_body = service.call("GET", "/metrics")
    assert status == 200
    assert "liftgate_analytics_snapshots_total" in text_body
    assert 'liftgate_analytics_worker_up{worker="snapshotter"} 1.0' in text_body


def test_dashboard_is_mounted(service: Service) -> None:
    status, page = service.call("GET", "/dashboard")
    assert status == 200 and "<html" in page.lower()


def test_experiment_list_shows_units_and_headline_verdict(service: Service, seeded: dict[str, Any]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        status, rows = service.call("GET", "/api/experiments")
        mine = next(r for r in rows if r["id"] == seeded["id"])
        if mine["report_at"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200
    assert mine["units"] == 800 and mine["status"] == "running" and mine["mode"] == "ab"
    assert mine["verdict"] in {"ship", "no_difference_yet"}
    draft = next(r for r in rows if r["id"] == seeded["draft"])
    assert draft["units"] == 0 and draft["verdict"] is None and draft["report_at"] is None


def test_report_by_name_and_id_and_fresh(service: Service, seeded: dict[str, Any]) -> None:
    status, body = service.call("GET", f"/api/experiments/{seeded['name']}/report")
    assert status == 200
    report = Report.model_validate(body)
    assert report.experiment_id == seeded["id"] and report.units == 800
    status, fresh = service.call("GET", f"/api/experiments/{seeded['id']}/report?fresh=1", token=TOKEN)
    assert status == 200 and Report.model_validate(fresh).generated_at >= report.generated_at
    status, missing = service.call("GET", "/api/experiments/no-such-experiment/report")
    assert status == 404 and "not found" in missing["detail"]


def test_snapshot_needs_an_operator_credential_and_is_audited(
    service: Service, seeded: dict[str, Any], engine: Engine
) -> None:
    path = f"/api/experiments/{seeded['id']}/snapshot"
    assert service.call("POST", path, token=None)[0] == 401
    status, body = service.call("POST", path, token="wrong-token-" + secrets.token_hex(8))
    assert status == 403 and body == {"detail": "invalid token"}
    status, body = service.call("POST", path, token=TOKEN)
    assert status == 201 and Report.model_validate(body).experiment_id == seeded["id"]
    with engine.connect() as conn:
        audit = conn.execute(
            text("SELECT actor, after FROM audit_log WHERE action = 'snapshot' AND entity_id = :e"),
            {"e": str(seeded["id"])},
        ).all()
    assert audit and audit[-1][0] == "admin" and "snapshot_id" in audit[-1][1]


def test_snapshotter_accumulates_a_time_series(
    service: Service, seeded: dict[str, Any], engine: Engine
) -> None:
    deadline = time.monotonic() + DEADLINE_S
    count = 0
    while count < 3 and time.monotonic() < deadline:
        with engine.connect() as conn:
            count = conn.execute(
                text("SELECT count(*) FROM analysis_snapshots WHERE experiment_id = :e"), {"e": seeded["id"]}
            ).scalar_one()
        time.sleep(0.1)
    assert count >= 3
    _, body = service.call("GET", f"/api/experiments/{seeded['id']}/report")
    series = {(s["metric"], s["variant"]): s["points"] for s in body["timeseries"]}
    assert len(series[("thumbs_up_rate", "candidate")]) >= 3
    with engine.connect() as conn:
        drafts = conn.execute(
            text("SELECT count(*) FROM analysis_snapshots WHERE experiment_id = :e"), {"e": seeded["draft"]}
        ).scalar_one()
    assert drafts == 0  # only running experiments are snapshotted


def test_metric_definitions_are_validated_and_audited(service: Service, engine: Engine) -> None:
    name = f"edits_per_response_{secrets.token_hex(3)}"
    spec = {"name": name, "kind": "ratio", "numerator": "edits", "denominator": "requests",
            "direction": "lower_is_better"}  # fmt: skip
    assert service.call("POST", "/api/metrics", spec, token=None)[0] == 401
    assert service.call("POST", "/api/metrics", spec)[0] == 403  # the read token reads only
    status, err = service.call("POST", "/api/metrics", [spec], token=TOKEN)
    assert status == 422 and err["detail"] == "a metric definition must be a JSON object"
    status, err = service.call("POST", "/api/metrics", spec | {"numerator": "drop_table"}, token=TOKEN)
    assert status == 422 and "unknown column" in err["detail"]
    status, err = service.call("POST", "/api/metrics", spec | {"name": "error_rate"}, token=TOKEN)
    assert status == 422 and "built-in" in err["detail"]
    status, created = service.call("POST", "/api/metrics", spec, token=TOKEN)
    assert status == 201 and created["name"] == name and created["builtin"] is False
    assert service.call("POST", "/api/metrics", spec, token=TOKEN)[0] == 409
    status, updated = service.call(
        "PUT", f"/api/metrics/{name}", spec | {"guardrail": True, "margin": 0.1}, token=TOKEN
    )
    assert status == 200 and updated["guardrail"] is True
    status, listed = service.call("GET", "/api/metrics")
    names = {m["name"]: m["builtin"] for m in listed}
    assert names[name] is False and names["thumbs_up_rate"] is True
    assert service.call("DELETE", "/api/metrics/error_rate", token=TOKEN)[0] == 422
    assert service.call("DELETE", f"/api/metrics/{name}", token=TOKEN)[0] == 204
    assert service.call("DELETE", f"/api/metrics/{name}", token=TOKEN)[0] == 404
    with engine.connect() as conn:
        actions = conn.execute(
            text("SELECT action FROM audit_log WHERE entity = 'metric' AND entity_id = :n ORDER BY id"), {"n": name}
        ).scalars().all()  # fmt: skip
    assert actions == ["create", "update", "delete"]


def test_cli_prints_the_table_and_json(service: Service, seeded: dict[str, Any]) -> None:
    cli = [str(Path(sys.executable).parent / "liftgate")]
    env = {**os.environ, "LIFTGATE_READ_TOKEN": READ_TOKEN}
    res = subprocess.run([*cli, "report", seeded["name"], "--url", service.url], capture_output=True, text=True,
                         timeout=60, env={**env, "COLUMNS": "200"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "SRM: ok" in out and "thumbs_up_rate" in out and "candidate" in out and "verdict candidate" in out
    assert "p (Holm, seq)" in out
    res = subprocess.run([*cli, "report", str(seeded["id"]), "--json", "--url", service.url],
                         capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert Report.model_validate_json(res.stdout).experiment_id == seeded["id"]
    res = subprocess.run(
        [*cli, "report", "nope", "--url", service.url], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 1 and "404" in res.stderr
    # Without any credential the CLI says what the service wants.
    bare = {k: v for k, v in os.environ.items() if not k.startswith("LIFTGATE_")}
    res = subprocess.run(
        [*cli, "report", seeded["name"], "--url", service.url, "--state-dir", "/nonexistent"],
        capture_output=True, text=True, timeout=60, env=bare,
    )  # fmt: skip
    assert res.returncode == 1 and "401" in res.stderr and "read token" in res.stderr
