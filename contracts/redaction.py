"""Secrets never reach a log: a process-wide scrub of every log record.

Each service's entry point (the gateway, the analytics service, the consumer, ``liftgate
up``) calls :func:`install` with the secrets it holds — admin and read tokens, the
database URL (its password) — and the gateway adds upstream API keys as it loads them
(:func:`remember`). From then on every log record, whichever logger or handler emits it
(uvicorn's included), is rendered once when it is created and scrubbed:

- every remembered secret is replaced by ``***`` (secrets shorter than
  ``MIN_SECRET_LENGTH`` are not remembered: they would mask ordinary words);
- database errors lose what quotes data: SQLAlchemy's ``[parameters: …]``, PostgreSQL's
  ``Failing row contains (…)``, the values of ``Key (…)=(…)`` and of a COPY line;
- credentials in URLs (``scheme://user:password@``) and bearer tokens are masked
  whether remembered or not.

Uncaught exceptions (main thread and other threads) are logged through the same path
instead of being printed raw. The scrub lives in ``contracts`` because every service
imports it and none may import another; it is logging configuration, process-wide like
``logging`` itself.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
import urllib.parse
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Final

MIN_SECRET_LENGTH: Final = 6
MASK: Final = "***"

_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # SQLAlchemy appends the statement's bound values to its errors.
    (re.compile(r"\[parameters: [^\n]*"), "[parameters: (redacted)]"),
    # PostgreSQL quotes the whole failing row in a constraint error's DETAIL (to the end of
    # the DETAIL: the next SQLAlchemy or PostgreSQL section, or the end of the text).
    (
        re.compile(
            r"(Failing row contains ).*?(?=\n\[|\n(?:HINT|CONTEXT|STATEMENT):|\n\(Background|\Z)", re.S
        ),
        r"\1(redacted).",
    ),
    (
        re.compile(
            r"(Key \([^)\n]*\)=\().*?(\) (?:already exists|is not present|is still referenced|conflicts))"
        ),
        r"\1" + MASK + r"\2",
    ),
    (re.compile(r"(COPY [^,\n]+, line \d+(?:, column [^:\n]+)?: )[^\n]*"), r"\1" + MASK),
    # Credentials in any URL, bearer tokens in any header or message.
    (re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^@\s/]+@"), r"\1" + MASK + "@"),
    (re.compile(r"(?i)\b(bearer\s+)[^\s,;'\"]+"), r"\1" + MASK),
)


class Redactor:
    """The remembered secrets and the scrub (thread-safe: secrets arrive from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def add(self, secrets: Iterable[str | None]) -> None:
        new = {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH} - self._secrets
        if not new:
            return
        with self._lock:
            self._secrets |= new
            # Longest first, so a secret containing another is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(s) for s in ordered))

    def redact(self, text: str) -> str:
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        secrets = self._pattern
        return text if secrets is None else secrets.sub(MASK, text)

    def secrets(self) -> frozenset[str]:
        return frozenset(self._secrets)


_active = Redactor()
_installed = False
_install_lock = threading.Lock()


def redact(text: str) -> str:
    """``text`` with every remembered secret and every quoted database value masked."""
    return _active.redact(text)


def remember(*secrets: str | None) -> None:
    """Mask these secrets in every later log record (e.g. an upstream API key just loaded)."""
    _active.add(secrets)


def url_secrets(url: str | None) -> list[str]:
    """The password of a database (or any) URL, as written and percent-decoded."""
    if not url:
        return []
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        return []
    return [password, urllib.parse.unquote(password)] if password else []


def scrub_record(record: logging.LogRecord) -> None:
    """Render the record's message and traceback now, scrubbed (later formatting reuses them)."""
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: keep what can be shown, never the raw args
        message = f"{record.msg} (log arguments could not be formatted)"
    record.msg, record.args = _active.redact(message), ()
    if record.exc_info and record.exc_info[0] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = _active.redact(text)
    if record.stack_info:
        record.stack_info = _active.redact(record.stack_info)


def install(*secrets: str | None, database_url: str | None = None) -> Redactor:
    """Remember ``secrets`` (and the password of ``database_url``) and scrub every log record
    of this process from now on; idempotent (a second call only adds secrets)."""
    global _installed
    _active.add([*secrets, *url_secrets(database_url)])
    with _install_lock:
        if _installed:
            return _active
        _installed = True
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            scrub_record(record)
            return record

        logging.setLogRecordFactory(factory)
        sys.excepthook = _log_uncaught
        threading.excepthook = _log_uncaught_in_thread
    return _active


_uncaught = logging.getLogger("uncaught")


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    _uncaught.critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "?"
    _uncaught.critical("uncaught exception in thread %s", name, exc_info=args.exc_value)
