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
