"""Feedback data quality end to end: the real gateway (Direct sink into real PostgreSQL, config
from the database), a real simulator upstream, the real ``openai`` client, the real analytics
service (``python -m analytics``) and the real ``liftgate feedback import``.

Decisions under test (docs/concepts.md "Feedback"): a kind nothing declares is refused with
an OpenAI-shaped 400; a request id the gateway has not served recently is accepted with a
warning (it may be served by another replica, or not stored yet), never credited to a
variant unless its interaction is stored, and counted as unjoined once its window passed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, create_engine, text

from analytics.ingest.write import ingest
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.telemetry import GatewayMetrics
from liftgate.direct_sink import DirectSink
from liftgate.simulator_model import SimulatorModel
from liftgate.simulator_process import SimulatorProcess
from tests.analytics.ingest_helpers import interaction
from tests.gateway.conftest import GatewayThread, http
from tests.known_secrets import secret
from tests.liftgate.frontdoor import ADMIN_TOKEN, liftgate
from tests.services import READ_TOKEN, analytics_service

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SERVICE_TOKEN = secret("fq-admin")
ROUTE = "fq-assistant"


def until(predicate: Callable[[], Any], limit_s: float = 10.0) -> Any:
    """Poll ``predicate`` until it returns something truthy (bounded in time)."""
    deadline = time.monotonic() + limit_s
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def engine(module_database_url: str) -> Iterator[Engine]:
    eng = create_engine(module_database_url)
    yield eng
    eng.dispose()


@pytest.fixture(scope="module")
def gateway(module_database_url: str) -> Iterator[str]:
    model = SimulatorModel("good", latency_ms=2, latency_sd=0, ttft_ms=1, ttft_sd=0, tokens=8, tokens_sd=0)
    settings = GatewaySettings(
        admin_token=ADMIN_TOKEN,
        database_url=module_database_url,
        refresh_interval_s=0.2,
        client_keys="off",
        feedback_kinds="",  # only what metric definitions declare
    )
    sink = DirectSink(module_database_url, interval_s=0.02)
    with (
        SimulatorProcess([model]) as sim,
        GatewayThread(create_app(settings, sink, metrics=GatewayMetrics())) as gw,
    ):
        up = {"name": "fq-up", "base_url": sim.url + "/v1"}
        assert http("POST", gw.url + "/admin/upstreams", up, headers=AUTH).status_code == 201
        exp = {
            "name": "fq",
            "route": ROUTE,
            "mode": "ab",
            "variants": [
                {"name": "control", "upstream": "fq-up", "model": "good", "weight": 1, "is_control": True},
                {"name": "cand", "upstream": "fq-up", "model": "good", "weight": 1},
            ],
        }
        assert http("POST", gw.url + "/admin/experiments", exp, headers=AUTH).status_code == 201
        assert http("POST", gw.url + "/admin/experiments/fq/start", headers=AUTH).status_code == 200
        until(lambda: ROUTE in http("GET", gw.url + "/v1/models").text)
        yield gw.url


@pytest.fixture(scope="module")
def service(module_database_url: str, gateway: str) -> Iterator[str]:
    with analytics_service(module_database_url, SERVICE_TOKEN, snapshot_interval_s="0",
                           rollout_controller="false") as url:  # fmt: skip
        yield url


def chat(gateway: str, user: str) -> str:
    """One completion through the real openai client; its request id."""
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=ROUTE, messages=[{"role": "user", "content": "hi"}], user=user
    )
    raw.parse()
    return str(raw.headers["x-request-id"])


def send(gateway: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = http("POST", gateway + "/v1/feedback", body)
    return r.status_code, r.json()


def stored(engine: Engine, request_id: str) -> list[tuple[str, int | None, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT kind, experiment_id, variant FROM feedback WHERE request_id = :r"), {"r": request_id}
        )
        return [(str(k), e, v) for k, e, v in rows]


def counted(engine: Engine, column: str) -> float:
    with engine.connect() as conn:
        value = conn.execute(
            text(
                f"SELECT coalesce(sum({column}), 0) FROM unit_rollups u JOIN experiments e "
                "ON e.id = u.experiment_id WHERE e.name = 'fq'"
            )
        ).scalar_one()
        return float(value)


def quality(service: str, token: str | None = READ_TOKEN, **params: Any) -> tuple[int, Any]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    headers = {"Authorization": f"Bearer {token}"} if token else None
    r = http("GET", f"{service}/api/data-quality?{query}", headers=headers)
    return r.status_code, r.json()


def test_a_kind_nothing_declares_is_refused_until_a_metric_definition_reads_it(
    gateway: str, engine: Engine, service: str
) -> None:
    rid = chat(gateway, "ana")
    for typo in ("thumbs-up", "thumb_up", "code_ran"):
        status, body = send(gateway, {"request_id": rid, "kind": typo})
        assert status == 400, body
        err = body["error"]
        assert (err["type"], err["code"], err["param"]) == (
            "invalid_request_error",
            "unknown_feedback_kind",
            "kind",
        )
        assert repr(typo) in err["message"] and "thumbs_up" in err["message"]
    status, body = send(gateway, {"request_id": rid, "kind": "rating"})
    assert status == 400 and "required" in body["error"]["message"]

    metric = {"name": "code_ran_per_unit", "kind": "mean", "numerator": "counters['code_ran:n']"}
    admin = {"Authorization": f"Bearer {SERVICE_TOKEN}"}
    assert http("POST", service + "/admin/metrics", metric, headers=admin).status_code == 201
    # The snapshot refreshes every 0.2 s; the metric's kind is accepted from then on.
    until(lambda: send(gateway, {"request_id": rid, "kind": "code_ran", "value": 2})[0] == 202)
    until(lambda: ("code_ran", _exp_id(engine), _variant_of(engine, rid)) in stored(engine, rid))
    assert [k for k, _, _ in stored(engine, rid)] == ["code_ran"]  # nothing refused was stored

    assert http("DELETE", service + "/admin/metrics/code_ran_per_unit", headers=admin).status_code in (
        200,
        204,
    )
    until(lambda: send(gateway, {"request_id": rid, "kind": "code_ran"})[0] == 400)


def test_an_unknown_request_id_is_accepted_with_a_warning_and_never_credited_to_a_variant(
    gateway: str, engine: Engine, service: str
) -> None:
    known = chat(gateway, "bo")
    status, body = send(gateway, {"request_id": known, "kind": "thumbs_up"})
    assert status == 202 and body["warnings"] == []

    stray = "req-never-served-" + secret("x")[:8]
    status, body = send(gateway, {"request_id": stray, "kind": "thumbs_up"})
    assert status == 202, body
    assert [w["code"] for w in body["warnings"]] == ["unknown_request_id"]
    assert "data-quality" in body["warnings"][0]["message"]

    until(lambda: stored(engine, known) and stored(engine, stray))
    assert stored(engine, known) == [("thumbs_up", _exp_id(engine), _variant_of(engine, known))]
    assert stored(engine, stray) == [("thumbs_up", None, None)]  # kept as sent, credited to nobody
    assert counted(engine, "thumbs_up") == 1.0

    # Within its window the stray one is pending; once the window passed, unjoined.
    status, doc = quality(service, window_s=3600)
    assert status == 200, doc
    assert doc["feedback"]["pending"] >= 1 and stray not in {
        e["request_id"] for e in doc["feedback"]["examples"]
    }
    status, doc = quality(service, window_s=0)
    fb = doc["feedback"]
    assert stray in {e["request_id"] for e in fb["examples"]}
    assert known not in {e["request_id"] for e in fb["examples"]}
    thumbs = next(k for k in fb["by_kind"] if k["kind"] == "thumbs_up")
    assert thumbs["unjoined"] == fb["unjoined"] >= 1
    assert quality(service, token=None)[0] == 401  # read access, like the report

    metrics = http("GET", service + "/metrics").text
    pending = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith('liftgate_analytics_feedback_unjoined{state="pending"}')
    ]
    assert pending and float(pending[0].split()[-1]) >= 1.0


def test_feedback_before_its_interaction_is_credited_once_the_interaction_is_stored(
    gateway: str, engine: Engine, service: str
) -> None:
    """Another replica served the call: this gateway warns, ingest still joins it later."""
    exp = _exp_id(engine)
    later = interaction(exp, "cand", "cy")
    status, body = send(gateway, {"request_id": later.request_id, "kind": "thumbs_down"})
    assert status == 202 and [w["code"] for w in body["warnings"]] == ["unknown_request_id"]
    until(lambda: stored(engine, later.request_id))
    before = counted(engine, "thumbs_down")
    with engine.connect() as conn:
        ingest(conn, [later])
        conn.commit()
    assert stored(engine, later.request_id) == [("thumbs_down", exp, "cand")]
    assert counted(engine, "thumbs_down") == before + 1
    examples = {e["request_id"] for e in quality(service, window_s=0)[1]["feedback"]["examples"]}
    assert later.request_id not in examples


def test_feedback_import_reports_refused_and_warned_lines_with_their_numbers(
    gateway: str, engine: Engine, tmp_path: Path
) -> None:
    known = chat(gateway, "dee")
    path = tmp_path / "feedback.jsonl"
    lines = [
        {"request_id": known, "kind": "thumbs_up"},
        {"request_id": "req-import-unknown", "kind": "thumbs_down"},
        {"request_id": known, "kind": "thumbs-down"},
        {"request_id": known, "kind": "rating"},
        {"request_id": known, "kind": "rating", "value": 8},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = liftgate("feedback", "import", str(path), "--gateway", gateway)
    assert res.returncode == 1, res.stderr
    assert "line 2: warning: unknown_request_id" in res.stderr
    assert "line 3: rejected: HTTP 400: kind 'thumbs-down' is not defined" in res.stderr
    assert "line 4: rejected: 'value' is required for kind 'rating'" in res.stderr
    assert "line 1:" not in res.stderr and "line 5:" not in res.stderr
    assert "3 accepted (1 with warnings), 2 rejected" in res.stderr

    only_warned = tmp_path / "warned.jsonl"
    only_warned.write_text(json.dumps({"request_id": "req-import-unknown-2", "kind": "copy"}) + "\n")
    res = liftgate("feedback", "import", str(only_warned), "--gateway", gateway)
    assert res.returncode == 0 and "1 accepted (1 with warnings), 0 rejected" in res.stderr
    strict = liftgate("feedback", "import", str(only_warned), "--gateway", gateway, "--strict")
    assert strict.returncode == 1 and "line 1: warning: unknown_request_id" in strict.stderr


def _exp_id(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM experiments WHERE name = 'fq'")).scalar_one())


def _variant_of(engine: Engine, request_id: str) -> str:
    def find() -> str | None:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT variant FROM interactions WHERE request_id = :r AND role = 'primary'"),
                {"r": request_id},
            ).first()
            return None if row is None else str(row[0])

    found: str = until(find)
    return found
