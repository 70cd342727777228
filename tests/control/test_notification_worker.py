"""The delivery worker in this process, on a database no other worker reads: events queued
while no worker runs, and the SSRF guard at connection time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine

from control import notifications
from control.notify_settings import NotifySettings
from control.webhook_sender import Notifier
from tests.control.webhook_receiver import running
from tests.known_secrets import secret

SECRET = secret("webhook-signing")


@pytest.fixture(scope="module")
def db_engine(module_database_url: str) -> Iterator[Engine]:
    eng = create_engine(module_database_url)
    yield eng
    eng.dispose()


def test_an_event_queued_while_no_worker_runs_is_sent_when_one_starts(db_engine: Engine) -> None:
    with running(SECRET) as receiver:
        with db_engine.begin() as conn:
            notifications.add_webhook(
                conn, name="later", url=receiver.url, secret=SECRET, fmt="json", events=["rl_risk.alarm"],
                actor="t", policy=NotifySettings().policy(),
            )  # fmt: skip
            notifications.emit(conn, "rl_risk.alarm", {"detector": "verbosity", "message": "length drift"})
        stop = threading.Event()
        worker = threading.Thread(target=Notifier(db_engine, NotifySettings(poll_s=0.05)).run, args=(stop,))
        worker.start()
        try:
            (req,) = receiver.wait_for(lambda rs: len(rs) == 1, timeout_s=10)
        finally:
            stop.set()
            worker.join(10)
    assert req.verdict is None and req.json["data"]["detector"] == "verbosity"


def test_a_name_resolving_to_a_refused_address_is_not_called(db_engine: Engine) -> None:
    """``localhost`` resolves to loopback: refused when private addresses are denied, checked at
    connection time (so a name re-pointed after it was added is refused too)."""
    settings = NotifySettings(poll_s=0.05, deny_private=True)
    with running(SECRET) as receiver:
        url = receiver.url.replace("127.0.0.1", "localhost")
        with db_engine.begin() as conn:
            notifications.add_webhook(
                conn, name="rebound", url=url, secret=SECRET, fmt="json", events=["rl_risk.alarm"], actor="t",
                policy=settings.policy(),
            )  # fmt: skip
            notifications.emit(conn, "rl_risk.alarm", {"detector": "phrases"})
        stop = threading.Event()
        worker = threading.Thread(target=Notifier(db_engine, settings).run, args=(stop,))
        worker.start()
        try:
            deadline = time.monotonic() + 10
            while True:
                with db_engine.connect() as conn:
                    rows = notifications.deliveries(conn, webhook="rebound")
                if rows and rows[0]["status"] == "failed":
                    break
                assert time.monotonic() < deadline, rows
                time.sleep(0.05)
        finally:
            stop.set()
            worker.join(10)
        assert receiver.requests == []
    assert "refused address" in str(rows[0]["last_error"]) and rows[0]["attempts"] == 1
