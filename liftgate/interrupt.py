"""Stop signals of ``liftgate up``: a KeyboardInterrupt raised only in liftgate's own code.

A Python signal handler runs at the next bytecode of whatever the main thread executes. One
that raises KeyboardInterrupt there can land inside a library, and two such landings broke a
stop that ``liftgate up`` had otherwise handled cleanly (seen as a SIGTERM answered with exit
-2 or 1 when it arrived just after start-up, while lazy imports ran):

* in code that a library built with ``exec`` of a string (dataclasses, namedtuple and pydantic
  generate functions so), CPython marks the interrupt "unhandled" as it leaves that code, and
  the process ends by SIGINT (exit -2, or 130) after ``up`` caught it and stopped everything;
* inside pydantic-core's schema building it came out wrapped in a ``SchemaError``, which is
  not a KeyboardInterrupt.

So the first signal raises at once only when the interrupted frame is liftgate's own code (its
sleeps and polling loops); anywhere else it is recorded, and the next :meth:`checkpoint`
between steps raises it. A second signal raises wherever it lands: a stop that hangs in a
library can still be forced.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from types import FrameType

_OWN_CODE = os.path.dirname(os.path.abspath(__file__)) + os.sep


class StopSignals:
    """Counts stop signals; :meth:`handler` is the signal handler to install."""

    def __init__(self, own_code: str = _OWN_CODE) -> None:
        self.received = 0
        self._own_code = own_code

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.received > 1 or (frame is not None and frame.f_code.co_filename.startswith(self._own_code)):
            raise KeyboardInterrupt

    def install(self, signals: Iterable[int]) -> None:
        for sig in signals:
            signal.signal(sig, self.handler)

    def checkpoint(self) -> None:
        """Raise KeyboardInterrupt if a stop signal arrived (call between steps and in loops)."""
        if self.received:
            raise KeyboardInterrupt


def no_checkpoint() -> None:
    """The checkpoint of code that runs without ``liftgate up``'s signal handling."""
