"""Event timestamps (SEMANTICS rule 32): where a task's envelopes get theirs.

In order: the message field ``task.timestamp.field`` (a number in ``task.timestamp.unit``, or
an ISO-8601 string with unit ``iso8601``); else the task's method ``timestamp(envelope) ->
int``; else the system's own record time (a Kafka record's timestamp, a Redis entry id's
milliseconds); else ingestion time, the wall clock (``context.now()``'s clock) when the
engine read the message. A timestamp that cannot be read (the field is missing or of the
wrong type, the method raises or returns no int) makes the message a bad message in its place
(rule 39): ``task.error.policy`` decides. Both engines stamp with the same compiled
:class:`tailrace._core.TimestampReader`; this module builds it and holds its slow paths.
"""

from __future__ import annotations

import math
import reprlib
from datetime import UTC, datetime
from typing import Any

from .errors import TaskError

UNITS = ("ms", "s", "us", "ns", "iso8601")
# ms per unit as (numerator, denominator): a value v in the unit is floor(v * num / den) ms
_SCALE = {"ms": (1, 1), "s": (1000, 1), "us": (1, 1000), "ns": (1, 1_000_000)}
_MIN, _MAX = -(1 << 63) + 1, (1 << 63) - 1  # -2**63 is the compiled envelope's "unset"


class TimestampUnreadable(ValueError):
    """Why a message's timestamp could not be read (the cause of its TaskError)."""


def number_ms(value: Any, unit: str) -> int:
    """``value`` (an int or a finite float, never a bool) in ``unit``, as whole ms (floor)."""
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TimestampUnreadable(f"expected a number of {unit}, got {reprlib.repr(value)}")
    num, den = _SCALE[unit]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TimestampUnreadable(f"expected a finite number of {unit}, got {value!r}")
        ms = math.floor(value * num / den) if den > 1 else math.floor(value * num)
    else:
        ms = value * num // den
    if not _MIN <= ms <= _MAX:
        raise TimestampUnreadable(f"{value!r} {unit} is out of range")
    return int(ms)


def iso8601_ms(value: Any) -> int:
    """An ISO-8601 date-time string as ms since the epoch (floor); without an offset: UTC."""
    if not isinstance(value, str):
        raise TimestampUnreadable(f"expected an ISO-8601 string, got {reprlib.repr(value)}")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise TimestampUnreadable(f"not an ISO-8601 date-time: {reprlib.repr(value)}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def timestamp_error(task: str, ssp: Any, offset: Any, source: str, error: BaseException) -> TaskError:
    """The error of a message whose timestamp cannot be read (rules 32, 39): ``source`` says
    where it was looked for, ``error`` why it failed."""
    detail = f"its timestamp cannot be read from {source}: {type(error).__name__}: {error}"
    return TaskError(task, ssp, offset, error, phase="timestamp", detail=detail)


def timestamp_reader(config: Any, task_name: str, task: Any) -> Any:
    """The task's :class:`tailrace._core.TimestampReader`, or None when its envelopes keep
    the system's time or ingestion time (no per-message work beyond storing an int)."""
    from ._core import TimestampReader

    field = config.timestamp_field
    if field:
        return TimestampReader(task_name, field, config.timestamp_unit, None)
    method = getattr(task, "timestamp", None)
    if callable(method):
        return TimestampReader(task_name, None, "ms", method)
    return None


__all__ = ["UNITS", "TimestampUnreadable", "iso8601_ms", "number_ms", "timestamp_error", "timestamp_reader"]
