"""Webhook notifications end to end: the real analytics service (its admin API and delivery
worker), real PostgreSQL, a real HTTP receiver on 127.0.0.1 that verifies signatures."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, create_engine, text

from analytics.rollout.controller import Controller
from analytics.rollout.telemetry import for_registry
from control import notifications
from control.notify_settings import NotifySettings
from tests.analytics.report_data import insert_units, simulate_units
from tests.analytics.rollout.synthetic import create_rollout
from tests.control.conftest import TOKEN, AdminService, start_admin_service
from tests.control.webhook_receiver import running
from tests.known_secrets import secret

SECRET = secret("webhook-signing")
PLAN: dict[str, Any] = {
    "stages": [5, 50, 100],
    "min_duration_s": 0,
    "min_units": 0,
    "interval_s": 0,
    "guardrails": [],
    "planned_units": 1000,
}
FAST_RETRIES = {
    "LIFTGATE_NOTIFY_POLL_S": "0.1",
    "LIFTGATE_NOTIFY_BACKOFF_BASE_S": "0.3",
    "LIFTGATE_NOTIFY_MAX_ATTEMPTS": "4",
    "LIFTGATE_NOTIFY_TIMEOUT_S": "3",
}


@pytest.fixture(scope="module")
def service(module_database_url: str) -> Iterator[AdminService]:
    with start_admin_service(module_database_url, FAST_RETRIES) as svc:
        yield svc


@pytest.fixture(scope="module")
def db_engine(module_database_url: str) -> Iterator[Engine]:
    eng = create_engine(module_database_url)
    yield eng
    eng.dispose()


@pytest.fixture(autouse=True)
def _no_webhooks_left(db_engine: Engine) -> Iterator[None]:
    yield
    with db_engine.begin() as conn:
        for name in conn.execute(text("SELECT name FROM webhooks")).scalars().all():
            notifications.remove_webhook(conn, str(name), "test-cleanup")


def _add(service: AdminService, name: str, url: str, **extra: Any) -> dict[str, Any]:
    status, body = service.call("POST", "/admin/webhooks", {"name": name, "url": url, **extra}, actor="ops")
    assert status == 201, body
    return dict(body)


def _started_rollout(engine: Engine) -> tuple[int, str]:
    eid, name, _ = create_rollout(engine, PLAN)
    return eid, name


def _deliveries(service: AdminService, webhook: str) -> list[dict[str, Any]]:
    status, body = service.call("GET", f"/admin/webhooks/{webhook}/deliveries")
    assert status == 200, body
    return list(body)


def _wait_delivery(
    service: AdminService, webhook: str, pred: Any, timeout_s: float = 15.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = _deliveries(service, webhook)
        if pred(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"delivery log never matched: {rows}")
        time.sleep(0.05)


def _of_type(kind: str) -> Any:
    return lambda reqs: any(r.json.get("type") == kind for r in reqs)


def test_a_webhook_secret_and_url_path_never_come_back_from_the_api_or_the_audit_log(
    service: AdminService, db_engine: Engine
) -> None:
    out = _add(service, "quiet", "http://127.0.0.1:9/hooks/T000/B000/abcdef", secret=SECRET)
    assert out["signed"] is True and out["url"] == "http://127.0.0.1:9/***"
    assert SECRET not in str(service.call("GET", "/admin/webhooks")[1])
    with db_engine.connect() as conn:
        after = conn.execute(
            text("SELECT after FROM audit_log WHERE entity = 'webhook' AND entity_id = 'quiet'")
        ).scalar_one()
    assert SECRET not in str(after) and "abcdef" not in str(after)


@pytest.mark.parametrize(
    ("url", "extra", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data", {"secret": SECRET}, "link-local"),
        ("http://[::ffff:169.254.169.254]/", {"secret": SECRET}, "link-local"),
        ("http://[fd00:ec2::254]/", {"secret": SECRET}, "metadata"),
        ("http://0.0.0.0:80/", {"secret": SECRET}, "unicast"),
        ("file:///etc/passwd", {"secret": SECRET}, "http"),
        ("http://user:pw@example.com/", {"secret": SECRET}, "user or password"),
        ("http://127.0.0.1:9/", {}, "needs a secret"),
        ("http://127.0.0.1:9/", {"secret": "short"}, "16 to 512"),
        ("http://127.0.0.1:9/", {"secret": SECRET, "events": ["rollout.explode"]}, "unknown event kind"),
        ("http://127.0.0.1:9/", {"secret": SECRET, "events": []}, "at least 1"),
    ],
)
def test_a_webhook_that_cannot_be_stored_is_refused_with_the_reason(
    service: AdminService, url: str, extra: dict[str, Any], reason: str
) -> None:
    status, body = service.call("POST", "/admin/webhooks", {"name": "bad", "url": url, **extra})
    assert status == 422 and reason in body["detail"], body


def test_the_test_button_sends_a_signed_notification_the_receiver_verifies_and_logs_it(
    service: AdminService,
) -> None:
    with running(SECRET) as receiver:
        _add(service, "signed", receiver.url, secret=SECRET, events=["rollout.rollback"])
        status, delivery = service.call("POST", "/admin/webhooks/signed/test", actor="alice")
        assert status == 200, delivery
        assert (
            delivery["status"] == "delivered" and delivery["attempts"] == 1 and delivery["last_status"] == 200
        )
        assert delivery["latency_ms"] > 0
        (req,) = receiver.requests
        assert req.verdict is None  # the signature verified with the shared secret
        assert req.json["type"] == "test" and req.json["data"]["actor"] == "admin:alice"
        assert req.headers["X-Liftgate-Delivery"] == req.json["id"] == delivery["event_id"]
        # The same bytes with a forged signature, or replayed much later, do not verify.
        from control import webhook_signature as sig

        header = req.headers[sig.HEADER]
        assert (
            sig.verify("another-secret-of-16+", header, req.body, time.time()) == "signature does not match"
        )
        assert "tolerance" in str(sig.verify(SECRET, header, req.body, time.time() + 3600))
        assert sig.verify(SECRET, header, req.body + b" ", time.time()) == "signature does not match"


def test_the_test_button_reports_a_receiver_that_refuses_and_does_not_retry_it(service: AdminService) -> None:
    with running("a-different-secret-value") as receiver:  # verifies with the wrong secret: 401
        _add(service, "wrong", receiver.url, secret=SECRET)
        status, delivery = service.call("POST", "/admin/webhooks/wrong/test")
        assert status == 200
        assert delivery["status"] == "failed" and delivery["last_error"] == "HTTP 401"
        assert len(receiver.requests) == 1


def test_a_receiver_failing_twice_then_succeeding_gets_the_decision_through_retries(
    service: AdminService, db_engine: Engine
) -> None:
    with running(SECRET, fail_first=[503, 503]) as receiver:
        _add(service, "flaky", receiver.url, secret=SECRET, events=["rollout.pause"])
        eid, name = _started_rollout(db_engine)
        status, body = service.call("POST", f"/admin/experiments/{eid}/rollout/advance", actor="bob")
        assert status == 200, body  # start: not subscribed
        status, body = service.call("POST", f"/admin/experiments/{eid}/rollout/pause", actor="bob")
        assert status == 200, body
        reqs = receiver.wait_for(lambda rs: len(rs) >= 3, timeout_s=15)
        assert all(r.verdict is None for r in reqs)
        assert {r.headers["X-Liftgate-Delivery"] for r in reqs} == {reqs[0].json["id"]}  # one event, retried
        assert reqs[-1].json["type"] == "rollout.pause"
        assert reqs[-1].json["experiment"]["name"] == name
        assert reqs[-1].json["data"]["actor"] == "admin:bob"
        gaps = [b.at - a.at for a, b in itertools.pairwise(reqs)]
        assert gaps[0] >= 0.15 and gaps[1] >= 0.3  # backoff: base 0.3 s, half jittered, doubling
        rows = _wait_delivery(service, "flaky", lambda rs: rs and rs[0]["status"] == "delivered")
        assert (
            rows[0]["attempts"] == 3 and rows[0]["last_status"] == 200 and rows[0]["type"] == "rollout.pause"
        )


def test_a_receiver_that_never_recovers_is_given_up_after_the_bounded_attempts(
    service: AdminService, db_engine: Engine
) -> None:
    with running(SECRET, fail_first=[500] * 10) as receiver:
        _add(service, "down", receiver.url, secret=SECRET, events=["rollout.start"])
        eid, _ = _started_rollout(db_engine)
        assert service.call("POST", f"/admin/experiments/{eid}/rollout/advance")[0] == 200
        rows = _wait_delivery(service, "down", lambda rs: rs and rs[0]["status"] == "failed", timeout_s=20)
        assert rows[0]["attempts"] == 4 and rows[0]["last_error"] == "HTTP 500"
        assert len(receiver.requests) == 4


def test_a_rollback_notification_arrives_within_five_seconds_of_the_decision_in_both_formats(
    service: AdminService, db_engine: Engine
) -> None:
    with running(SECRET) as generic, running(None) as slack:
        _add(service, "generic", generic.url, secret=SECRET, events=["rollout.rollback"])
        _add(service, "chat", slack.url, format="slack", events=["rollout.rollback"])
        eid, name = _started_rollout(db_engine)
        assert service.call("POST", f"/admin/experiments/{eid}/rollout/advance")[0] == 200
        status, body = service.call("POST", f"/admin/experiments/{eid}/rollout/rollback", actor="carol")
        assert status == 200, body
        decided = datetime.fromisoformat(body["decision"]["created_at"]).timestamp()
        (req,) = generic.wait_for(_of_type("rollout.rollback"), timeout_s=10)
        assert req.verdict is None
        assert req.at - decided < 5.0, f"rollback notified {req.at - decided:.2f}s after the decision"
        data = req.json["data"]
        assert data["decision"] == "rollback" and data["decision_id"] == body["decision"]["id"]
        assert (
            data["weights_after"] == {"control": 100.0, "candidate": 0.0} and data["status"] == "rolled_back"
        )
        (chat,) = slack.wait_for(lambda rs: len(rs) == 1, timeout_s=10)
        assert chat.at - decided < 5.0
        text_line = chat.json["text"]
        assert "rollback" in text_line and name in text_line and "rolled back by admin:carol" in text_line
        assert chat.json["blocks"][0]["text"]["type"] == "mrkdwn"


def test_a_controller_rollback_on_a_guardrail_notifies_the_rollback_and_the_guardrail(
    service: AdminService, db_engine: Engine
) -> None:
    plan = {
        **PLAN,
        "guardrails": [{"metric": "error_rate", "margin": 0.01}],
        "guardrail_window": "cumulative",
    }
    controller = Controller(db_engine, for_registry(__import__("prometheus_client").CollectorRegistry()))
    eid, name, _ = create_rollout(db_engine, plan)
    assert (d := controller.evaluate(eid, force=True)) is not None and d.decision == "start"
    rng = np.random.default_rng(7)
    with db_engine.begin() as conn:
        insert_units(
            conn, eid, "control", simulate_units(rng, 300, thumbs_p=0.5, tokens=10, error_p=0.05), prefix="c"
        )
        insert_units(
            conn, eid, "candidate", simulate_units(rng, 300, thumbs_p=0.5, tokens=10, error_p=0.5), prefix="k"
        )
    with running(SECRET) as receiver:
        _add(service, "pager", receiver.url, secret=SECRET, events=["rollout.rollback", "guardrail.failed"])
        decision = controller.evaluate(eid, force=True)
        assert decision is not None and decision.decision == "rollback" and decision.code == "guardrail", (
            decision
        )
        decided = time.time()
        reqs = receiver.wait_for(lambda rs: len(rs) == 2, timeout_s=10)
    assert max(r.at for r in reqs) - decided < 5.0
    by_type = {r.json["type"]: r.json for r in reqs}
    assert set(by_type) == {"rollout.rollback", "guardrail.failed"}
    assert by_type["rollout.rollback"]["data"]["actor"] == "controller"
    assert [g["metric"] for g in by_type["guardrail.failed"]["data"]["guardrails"]] == ["error_rate"]
    assert by_type["guardrail.failed"]["experiment"]["name"] == name


def test_a_decision_rolled_back_with_its_transaction_queues_nothing(db_engine: Engine) -> None:
    with db_engine.begin() as conn:
        notifications.add_webhook(
            conn, name="tx", url="http://127.0.0.1:9/", secret=SECRET, fmt="json", events=["*"], actor="t",
            policy=NotifySettings().policy(),
        )  # fmt: skip
    with pytest.raises(RuntimeError), db_engine.begin() as conn:
        assert notifications.emit(conn, "rl_risk.alarm", {"detector": "verbosity"}) is not None
        raise RuntimeError("the decision failed after queuing")
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id"
                                 " WHERE w.name = 'tx'")).scalar_one() == 0  # fmt: skip


def _cli(service: AdminService, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTGATE_")}
    env |= {"LIFTGATE_ADMIN_URL": service.url, "LIFTGATE_ADMIN_TOKEN": TOKEN, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "liftgate", "webhooks", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_the_cli_adds_lists_tests_reads_the_log_of_and_removes_a_webhook(service: AdminService) -> None:
    with running(SECRET) as receiver:
        added = _cli(service, "add", receiver.url, "--secret", SECRET, "--events", "rollout.rollback,srm")
        assert added.returncode == 0, added.stderr
        assert "added webhook 127.0.0.1-" in added.stdout and "rollout.rollback, srm" in added.stdout
        name = added.stdout.split("added webhook ", 1)[1].split()[0]
        listed = _cli(service, "list", "--json")
        assert [h["name"] for h in json.loads(listed.stdout)] == [name]
        assert SECRET not in listed.stdout and "/hook" not in listed.stdout
        tested = _cli(service, "test", name, "--actor", "dana")
        assert tested.returncode == 0 and "delivered evt_" in tested.stdout, tested.stderr
        assert receiver.requests[0].verdict is None
        log = _cli(service, "deliveries", name, "--json")
        (row,) = json.loads(log.stdout)
        assert row["type"] == "test" and row["status"] == "delivered"
        refused = _cli(service, "add", "http://169.254.169.254/", "--secret", SECRET, "--name", "meta")
        assert refused.returncode == 1 and "link-local" in refused.stderr
        assert _cli(service, "remove", name).returncode == 0
        assert json.loads(_cli(service, "list", "--json").stdout) == []
    dead = _cli(service, "add", "http://127.0.0.1:9/", "--format", "slack", "--name", "nobody")
    assert dead.returncode == 0, dead.stderr
    failed = _cli(service, "test", "nobody")
    assert failed.returncode == 1 and "not delivered" in failed.stderr
