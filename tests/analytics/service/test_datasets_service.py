"""Datasets in the analytics service (a real subprocess): the /api/datasets routes behind the
service's credentials and request guard, and the retention worker clearing expired text."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from tests.analytics.service.test_app import READ_TOKEN, TOKEN, Service
from tests.curation.data import Call, experiment, store_calls
from tests.curation.test_builder import _prompt
from tests.services import analytics_service


@pytest.fixture(scope="module")
def service(module_database_url: str) -> Iterator[Service]:
    with analytics_service(
        module_database_url,
        TOKEN,
        read_token=READ_TOKEN,
        snapshot_interval_s="0",
        retention_interval_s="0.2",
    ) as url:
        yield Service(url)


@pytest.fixture(scope="module")
def engine(module_database_url: str) -> Iterator[Engine]:
    from sqlalchemy import create_engine

    eng = create_engine(module_database_url)
    yield eng
    eng.dispose()


def test_datasets_are_created_and_read_through_the_service_with_its_credentials(
    service: Service, engine: Engine
) -> None:
    exp = experiment(engine)
    store_calls(engine, exp, [Call(_prompt(300 + i), feedback=("thumbs_down",), minutes=i) for i in range(8)])
    body = {"name": "svc-set", "spec": {"experiment": exp, "feedback": ["thumbs_down"]}}
    assert service.call("POST", "/api/datasets", body, token=None)[0] == 401  # the guard, before the body
    assert service.call("POST", "/api/datasets", body, token=READ_TOKEN)[0] == 403
    status, made = service.call("POST", "/api/datasets", body, token=TOKEN)
    assert status == 201 and made["items"] == 8
    status, shown = service.call("GET", "/api/datasets/svc-set")
    assert status == 200 and shown["versions"][0]["items"] == 8
    assert service.call("GET", "/api/datasets/svc-set/export?format=eval")[0] == 403  # exports need admin
    req = urllib.request.Request(service.url + "/api/datasets/svc-set/export?format=eval",
                                 headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        lines = resp.read().splitlines()
    assert len(lines) == 8
    with engine.connect() as conn:
        actors = {r[0] for r in conn.execute(text("SELECT actor FROM audit_log WHERE entity_id = 'svc-set'"))}
    assert actors == {"admin"}


def test_the_retention_worker_clears_text_past_its_ttl(service: Service, engine: Engine) -> None:
    exp = experiment(engine)
    old = Call(_prompt(400), response="an old answer")
    store_calls(engine, exp, [old], t0=datetime.now(UTC) - timedelta(days=10))
    status, _ = service.call("PUT", "/api/retention", {"experiment": exp, "ttl_days": 7}, token=TOKEN)
    assert status == 200
    deadline = time.monotonic() + 20
    while True:
        with engine.connect() as conn:
            prompt = conn.execute(text("SELECT prompt FROM interactions WHERE request_id = :r"),
                                  {"r": old.request_id}).scalar_one()  # fmt: skip
        if prompt is None:
            break
        assert time.monotonic() < deadline, "the retention worker did not clear the text in time"
        time.sleep(0.1)
