"""The CLI's one admin base URL: flag, then environment, then `liftgate up`'s run file, then the default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from liftgate.admin_client import DEFAULT_ADMIN_URL, RUN_FILE, resolve_admin_url


def test_the_flag_wins_over_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFTGATE_ADMIN_URL", "http://env:1")
    (tmp_path / RUN_FILE).write_text(json.dumps({"admin": "http://up:2"}))
    assert resolve_admin_url("http://flag:3", tmp_path) == "http://flag:3"


def test_the_environment_wins_over_the_run_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFTGATE_ADMIN_URL", "http://env:1")
    (tmp_path / RUN_FILE).write_text(json.dumps({"admin": "http://up:2"}))
    assert resolve_admin_url(None, tmp_path) == "http://env:1"


def test_a_running_liftgate_up_is_found_through_its_run_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LIFTGATE_ADMIN_URL", raising=False)
    (tmp_path / RUN_FILE).write_text(json.dumps({"gateway": "http://g:1", "admin": "http://a:2"}))
    assert resolve_admin_url(None, tmp_path) == "http://a:2"
    (tmp_path / RUN_FILE).write_text(json.dumps({"gateway": "http://g:1", "analytics": "http://an:3"}))
    assert resolve_admin_url(None, tmp_path) == "http://an:3"


@pytest.mark.parametrize("content", [None, "", "not json", "[1, 2]", '{"admin": 5}', '{"admin": ""}'])
def test_no_usable_run_file_means_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None
) -> None:
    monkeypatch.delenv("LIFTGATE_ADMIN_URL", raising=False)
    if content is not None:
        (tmp_path / RUN_FILE).write_text(content)
    assert resolve_admin_url(None, tmp_path) == DEFAULT_ADMIN_URL
