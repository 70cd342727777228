"""Gateway settings come from LIFTGATE_* variables and refuse missing or weak admin tokens."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFTGATE_ADMIN_TOKEN", "k3y-Of-Sufficient-Length-42")
    monkeypatch.setenv("LIFTGATE_REFRESH_INTERVAL_S", "0.25")
    monkeypatch.setenv("LIFTGATE_WORKERS", "3")
    s = GatewaySettings()
    assert (s.refresh_interval_s, s.workers, s.port) == (0.25, 3, 8080)


@pytest.mark.parametrize("token", [None, "short", "aaaaaaaaaaaaaaaaaaaa", "abababababababababab"])
def test_missing_short_or_trivial_admin_tokens_are_refused(
    monkeypatch: pytest.MonkeyPatch, token: str | None
) -> None:
    monkeypatch.delenv("LIFTGATE_ADMIN_TOKEN", raising=False)
    if token is not None:
        monkeypatch.setenv("LIFTGATE_ADMIN_TOKEN", token)
    with pytest.raises(ValidationError):
        GatewaySettings()


def test_refresh_interval_cannot_exceed_one_second() -> None:
    with pytest.raises(ValidationError):
        GatewaySettings(admin_token="k3y-Of-Sufficient-Length-42", refresh_interval_s=2.0)


def test_client_keys_are_an_explicit_choice_of_two_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFTGATE_ADMIN_TOKEN", "k3y-Of-Sufficient-Length-42")
    monkeypatch.delenv("LIFTGATE_CLIENT_KEYS", raising=False)
    assert GatewaySettings().client_keys == "required"
    monkeypatch.setenv("LIFTGATE_CLIENT_KEYS", "off")
    assert GatewaySettings().client_keys == "off"
    for wrong in ("", "auto", "false", "0"):
        monkeypatch.setenv("LIFTGATE_CLIENT_KEYS", wrong)
        with pytest.raises(ValidationError):
            GatewaySettings()


def test_limits_refuse_values_that_would_disable_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFTGATE_ADMIN_TOKEN", "k3y-Of-Sufficient-Length-42")
    for name, value in (
        ("LIFTGATE_MAX_BODY_BYTES", "0"),
        ("LIFTGATE_HEADER_TIMEOUT_S", "0"),
        ("LIFTGATE_BODY_TIMEOUT_S", "-1"),
        ("LIFTGATE_SHADOW_QUEUE_BYTES", "10"),
        ("LIFTGATE_FEEDBACK_RATE", "nan"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValidationError):
            GatewaySettings()
        monkeypatch.delenv(name)
