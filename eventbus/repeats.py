"""A log line repeated over and over, let through once per interval with a count.

librdkafka logs a refused connection on every attempt, and during a broker outage a consumer
attempts every ~50 ms: the analytics consumer logged 418 ERROR lines in a 12 s outage
(librdkafka 2.16, its re-bootstrap sequence when every broker is down). An operator needs the
first line, to know the broker went away, and then how often it went on.

Lines are the same when they differ only in their numbers ("after 0ms" / "after 3ms", a
client's or a thread's number). The first passes; the same line within ``interval_s`` of the
last one let through is held back and counted; the next one after the interval passes with
"(and N more like it in the last S s)". A count still held when the lines stop (the broker
came back) is not reported: the first line said the broker went away, and the client's own
lines say it is back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Final

_NUMBERS: Final = re.compile(r"\d+")


class RepeatedLines:
    """One per client (its lines only: no state shared between clients or tests)."""

    def __init__(
        self, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic, max_lines: int = 1024
    ) -> None:
        if interval_s <= 0 or max_lines < 1:
            raise ValueError("interval_s must be > 0 and max_lines >= 1")
        self.interval_s = interval_s
        self._clock = clock
        self._max = max_lines
        self._lock = threading.Lock()  # librdkafka's lines come from every thread that polls a client
        # line shape -> [when it was last let through, how many were held back since]
        self._seen: dict[tuple[int, str], list[float]] = {}

    def admit(self, level: int, line: str) -> str | None:
        """The line to log now (with the count held back since the same line last passed), or None."""
        shape = (level, _NUMBERS.sub("#", line))
        now = self._clock()
        with self._lock:
            seen = self._seen.get(shape)
            if seen is not None and now - seen[0] < self.interval_s:
                seen[1] += 1
                return None
            if seen is None and len(self._seen) >= self._max:
                self._seen.clear()  # bounded: many different lines only cost an extra line each
            self._seen[shape] = [now, 0]
        if seen is not None and seen[1]:
            return f"{line} (and {seen[1]:.0f} more like it in the last {now - seen[0]:.0f} s)"
        return line


class RepeatsAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger for one client's library lines: ``logger``, through a :class:`RepeatedLines`."""

    def __init__(self, logger: logging.Logger, repeats: RepeatedLines | None = None) -> None:
        super().__init__(logger, {})
        self.repeats = repeats if repeats is not None else RepeatedLines()

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if not self.logger.isEnabledFor(level):
            return
        line = self.repeats.admit(level, str(msg) % args if args else str(msg))
        if line is not None:
            self.logger.log(level, "%s", line, **kwargs)
