"""The log scrub: remembered secrets and quoted database values never reach a log line.

``install`` changes the process's logging for good, so it is exercised in a child process;
the scrub itself is tested in-process on real records and real database errors.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from contracts import redaction
from contracts.redaction import MASK, Redactor, scrub_record, url_secrets

ROOT = Path(__file__).resolve().parents[2]


def _record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("t", logging.ERROR, __file__, 1, msg, args, info)


def test_remembered_secrets_are_masked_in_messages_arguments_and_tracebacks() -> None:
    r = Redactor()
    token, key = "tok-" + secrets.token_hex(8), "sk-" + secrets.token_hex(8)
    r.add([token, key, "short", None])
    assert r.redact(f"a {token} b {key}") == f"a {MASK} b {MASK}"
    assert r.redact("short stays") == "short stays"  # too short to be remembered safely
    assert r.secrets() == {token, key}


def test_a_record_is_rendered_once_and_scrubbed_arguments_and_exception_included() -> None:
    token = "tok-" + secrets.token_hex(8)
    redaction.remember(token)
    try:
        raise RuntimeError(f"upstream refused key {token}")
    except RuntimeError as err:
        exc = err
    rec = _record("calling with %s", token, exc=exc)
    scrub_record(rec)
    out = logging.Formatter().format(rec)
    assert token not in out and MASK in out
    assert "RuntimeError: upstream refused key ***" in out
    assert rec.args == ()


@pytest.mark.parametrize(
    ("text_in", "gone"),
    [
        ("DETAIL:  Failing row contains (7, name, sk-abc, 60, 5, null).", "sk-abc"),
        ("DETAIL:  Key (name)=(sk-private-name) already exists.", "sk-private-name"),
        ('CONTEXT:  COPY interactions, line 3, column unit_id: "private-unit"', "private-unit"),
        ("[parameters: {'api_key': 'sk-live', 'name': 'up'}]", "sk-live"),
        ("connect to postgresql://app:pa55word@db:5432/x failed", "pa55word"),
        ("sent Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
    ],
)
def test_database_values_credentials_and_bearer_tokens_are_masked_unremembered(
    text_in: str, gone: str
) -> None:
    out = Redactor().redact(text_in)
    assert gone not in out


def test_a_real_failing_admin_update_logs_neither_its_parameters_nor_the_failing_row(
    database_url: str,
) -> None:
    """The gateway's PATCH that fails in the database: SQLAlchemy quotes the bound values,
    PostgreSQL the failing row; the upstream's key is in both."""
    key = "sk-" + secrets.token_hex(12)
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn, pytest.raises(IntegrityError) as err:
            conn.execute(
                text("INSERT INTO upstreams (name, base_url, api_key, timeout_s) VALUES (:n, :u, :k, NULL)"),
                {"n": "u-" + secrets.token_hex(4), "u": "http://x", "k": key},
            )
    finally:
        engine.dispose()
    raw = str(err.value)
    assert key in raw  # what would be logged without the scrub
    rec = _record("admin update failed", exc=err.value)
    scrub_record(rec)
    assert key not in logging.Formatter().format(rec)


def test_url_secrets_are_the_password_as_written_and_decoded() -> None:
    assert url_secrets("postgresql+psycopg://u:p%40ss@h/db") == ["p%40ss", "p@ss"]
    assert url_secrets("postgresql://u@h/db") == [] and url_secrets(None) == []


def test_install_scrubs_every_logger_handler_and_uncaught_exception_of_the_process(
    pg_admin_url: str, tmp_path: Path
) -> None:
    token = "tok-" + secrets.token_hex(8)
    password = "pw-" + secrets.token_hex(8)
    script = textwrap.dedent(
        f"""
        import logging, sys, threading
        from contracts import redaction
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        # A logger with its own handler (like uvicorn's), configured before install.
        own = logging.getLogger("own"); own.propagate = False
        own.addHandler(logging.StreamHandler(sys.stdout))
        redaction.install({token!r}, database_url="postgresql://app:{password}@db/x")
        logging.getLogger("a").info("token %s", {token!r})
        own.warning("password %s in %s", {password!r}, "postgresql://app:{password}@db/x")
        def boom(): raise RuntimeError("thread saw " + {token!r})
        t = threading.Thread(target=boom); t.start(); t.join()
        raise RuntimeError("main saw " + {password!r})
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "thread saw ***" in out and "main saw ***" in out and "token ***" in out
    assert token not in out and password not in out, out


def test_refused_events_keep_the_database_reason_without_the_row(database_url: str) -> None:
    from analytics.ingest.write import refusal_reason

    url = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    key = "sk-" + secrets.token_hex(8)
    with psycopg.connect(url) as conn, pytest.raises(psycopg.errors.NotNullViolation) as err:
        conn.execute(b"INSERT INTO upstreams (name, base_url, api_key) VALUES (NULL, 'http://x', %s)", (key,))
    assert key in str(err.value)
    reason = refusal_reason(err.value)
    assert "null value in column" in reason and "23502" in reason and key not in reason
