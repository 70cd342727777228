"""The retention job on real PostgreSQL: text past its TTL is cleared (the rest of the call
stays), per-experiment TTLs override the default, expired datasets are deleted, all audited."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from curation import retention, source, store
from curation.builder import create_version
from curation.spec import CurationError, CurationSpec
from tests.curation.data import Call, experiment, store_calls
from tests.curation.test_builder import _prompt

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def _text_of(engine: Engine, request_id: str) -> tuple[object, object, int]:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT prompt, response, response_chars FROM interactions WHERE request_id = :r"),
                           {"r": request_id}).one()  # fmt: skip
    return row[0], row[1], int(row[2])


def test_text_older_than_its_ttl_is_cleared_and_experiments_can_keep_it_longer(engine: Engine) -> None:
    short, long_kept = experiment(engine), experiment(engine)
    old = Call(_prompt(1), response="old answer")  # 2026-01-01: 59 days before NOW
    recent = Call(_prompt(2), response="recent answer")
    kept = Call(_prompt(3), response="kept answer")
    store_calls(engine, short, [old])
    store_calls(engine, short, [recent], t0=NOW - timedelta(days=3))
    store_calls(engine, long_kept, [kept])
    with engine.begin() as conn:
        retention.set_policy(conn, retention.DEFAULT_SCOPE, 30, "ops")
        retention.set_policy(conn, source.experiment(conn, long_kept).id, 365, "ops")
        with pytest.raises(CurationError):
            retention.set_policy(conn, 0, 0, "ops")
    run = retention.enforce(engine, NOW, batch=1)  # batch 1: the loop over batches is exercised
    assert run.cleared >= 1
    assert _text_of(engine, old.request_id) == (None, None, len("old answer"))  # metrics columns stay
    assert _text_of(engine, recent.request_id)[:2] == (recent.prompt, "recent answer")
    assert _text_of(engine, kept.request_id)[:2] == (kept.prompt, "kept answer")
    with engine.connect() as conn:
        actions = [
            r[0]
            for r in conn.execute(text("SELECT action FROM audit_log WHERE entity = 'content_retention'"))
        ]
    assert actions.count("set_content_retention") == 2 and "enforce_content_retention" in actions
    with engine.begin() as conn:
        retention.set_policy(conn, retention.DEFAULT_SCOPE, None, "ops")
        retention.set_policy(conn, source.experiment(conn, long_kept).id, None, "ops")
        assert retention.policies(conn) == {}


def test_expired_datasets_are_deleted_with_their_items(engine: Engine) -> None:
    exp = experiment(engine)
    store_calls(engine, exp, [Call(_prompt(20 + i), minutes=i) for i in range(3)])
    gone, stays = f"ds-{secrets.token_hex(4)}", f"ds-{secrets.token_hex(4)}"
    create_version(engine, gone, CurationSpec(experiment=exp), "t")
    create_version(engine, stays, CurationSpec(experiment=exp), "t")
    with engine.begin() as conn:
        store.set_expiry(conn, gone, NOW - timedelta(seconds=1), "t")
        store.set_expiry(conn, stays, NOW + timedelta(days=1), "t")
    run = retention.enforce(engine, NOW)
    assert gone in run.datasets_deleted and stays not in run.datasets_deleted
    with engine.connect() as conn:
        names = {d["name"] for d in store.datasets(conn)}
        actor = conn.execute(text("SELECT actor FROM audit_log WHERE action = 'delete_dataset' AND entity_id = :n"),
                             {"n": gone}).scalar_one()  # fmt: skip
    assert gone not in names and stays in names and actor == "retention"
