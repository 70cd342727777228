"""The control plane's one credential check, actor naming and audit redaction (pure logic)."""

from __future__ import annotations

import pytest

from control import auth
from control.audit import MASK, redacted

TOKEN = "a-strong-admin-token-0123456789"


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("", 401),
        ("Basic abc", 401),
        ("Bearer ", 401),
        ("Bearer    ", 401),
        ("Bearer wrong-token-of-some-length", 403),
        (f"Bearer {TOKEN}x", 403),
        (f"Bearer {TOKEN[:-1]}", 403),
    ],
)
def test_a_missing_or_wrong_admin_token_is_denied(header: str | None, status: int) -> None:
    denial = auth.admin_denial(header, TOKEN)
    assert denial is not None and denial[0] == status


def test_the_admin_token_passes_as_text_or_bytes_whatever_the_scheme_case() -> None:
    assert auth.admin_denial(f"Bearer {TOKEN}", TOKEN) is None
    assert auth.admin_denial(f"bearer {TOKEN}".encode(), TOKEN) is None


def test_an_empty_configured_token_admits_nobody() -> None:
    assert auth.admin_denial("Bearer x", "") == (403, "invalid admin token")


@pytest.mark.parametrize(
    ("header", "actor"),
    [
        (None, "admin"),
        ("", "admin"),
        ("alice", "admin:alice"),
        ("ci-bot@example.org", "admin:ci-bot@example.org"),
        ("ev\x00il\nname; DROP", "admin:evilnameDROP"),
        ("é", "admin"),
        ("x" * 500, "admin:" + "x" * 64),
    ],
)
def test_the_actor_header_is_recorded_as_admin_colon_name(header: str | None, actor: str) -> None:
    assert auth.actor(header) == actor


def test_secrets_are_masked_at_any_depth_in_audit_values() -> None:
    value = {
        "name": "up",
        "api_key": "sk-live-abcdef",
        "nested": [{"admin_token": "t0ken-123456"}, {"password": "hunter2"}],
        "upstream": {"apiKey": "x" * 20, "key_hash": "ab" * 32},
        "max_tokens": 100,
        "key_metric": "thumbs_up_rate",
    }
    out = redacted(value)
    assert out["api_key"] == MASK and out["upstream"] == {"apiKey": MASK, "key_hash": MASK}
    assert out["nested"] == [{"admin_token": MASK}, {"password": MASK}]
    assert out["max_tokens"] == 100 and out["key_metric"] == "thumbs_up_rate" and out["name"] == "up"


def test_an_already_masked_preview_and_a_removed_key_stay_as_they_are() -> None:
    assert redacted({"api_key": "***wxyz"}) == {"api_key": "***wxyz"}
    assert redacted({"api_key": None}) == {"api_key": None}
    assert redacted({"api_key": "***-but-longer-than-a-preview"}) == {"api_key": MASK}
