"""Machine-readable reasons a statistic could not be computed, and the finite-number guard.

Every result dataclass carries ``error`` (one of :class:`ErrorCode`, or ``None``) and a
human ``message``; numbers are finite floats or ``None`` so results serialise to JSON
as they are (``dataclasses.asdict`` + orjson) and never carry NaN or infinity.
"""

from __future__ import annotations

import math
from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable codes, shared with the report schema's ``ErrorInfo.code``."""

    EMPTY_VARIANT = "empty_variant"  # a variant has no unit at all
    TOO_FEW_UNITS = "too_few_units"  # n < 2: no variance estimate
    ZERO_VARIANCE = "zero_variance"  # the estimate's variance is 0: no test is possible
    ZERO_CONTROL_MEAN = "zero_control_mean"  # relative lift undefined
    ZERO_DENOMINATOR = "zero_denominator"  # ratio metric with Σy = 0
    NO_DATA = "no_data"  # nothing observed (histogram, SRM counts, pairs)
    INVALID_INPUT = "invalid_input"  # a parameter outside its domain (alpha, weights, ...)


class Direction(StrEnum):
    """Which way a metric is good. Same words as the report schema."""

    INCREASE = "increase"  # thumbs-up rate, task success
    DECREASE = "decrease"  # error rate, latency, thumbs-down rate


def finite(value: float | None) -> float | None:
    """``value`` as a float when it is finite, else ``None`` (never NaN/inf in a result)."""
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def check_alpha(alpha: float) -> str | None:
    """A message when ``alpha`` is not in (0, 1), else ``None``."""
    if not (0.0 < alpha < 1.0):
        return f"alpha must lie in (0, 1), got {alpha!r}"
    return None


#: What float arithmetic can raise (overflow in ``**``/``exp``, division by an exact 0,
#: math domain errors). Public functions catch these and return an ``invalid_input``
#: result, so extreme sums (1e300) never escape as an exception.
NUMERIC_ERRORS = (ArithmeticError, ValueError)


def numeric_message(exc: BaseException) -> str:
    return f"numeric failure on extreme input values ({type(exc).__name__}: {exc})"


def check_finite(**named: float | None) -> str | None:
    """A message naming the first input that is NaN or infinite, else ``None``.

    Inputs are checked before any ranking or arithmetic: a NaN compares false with
    everything, so it would silently sort anywhere and a test would answer for data it
    never saw.
    """
    for name, value in named.items():
        if value is not None and not math.isfinite(float(value)):
            return f"{name} is not a finite number ({value!r})"
    return None
