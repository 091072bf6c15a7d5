"""The event-time watermark of one task (SEMANTICS rules 33, 37), for the reference engine:
the same computation as the C loop's ``csrc/src/event_time.c`` (tailrace/event_time.h says
it in full), which tests/c_api checks against this class operation by operation.

Values are ms since the epoch; ``NONE`` (-2**63) stands for -infinity (no watermark yet),
``END`` (2**63 - 1) for +infinity (every input ended).
"""

from __future__ import annotations

import math

NONE = -(1 << 63)
END = (1 << 63) - 1


def watermark_value(raw: int) -> int | float:
    """A watermark as tasks and metrics see it: an int of ms, ``-math.inf`` for ``NONE``,
    ``math.inf`` for ``END``."""
    return -math.inf if raw == NONE else math.inf if raw == END else raw


def watermark_lag_ms(raw: int, wall_ms: int) -> float:
    """How far a watermark is behind the wall clock, in ms: ``math.inf`` while there is none,
    0 once every input ended."""
    return math.inf if raw == NONE else 0.0 if raw == END else float(wall_ms - raw)


class _Part:
    __slots__ = ("done_n", "empty", "empty_since", "ended", "max_ts", "read_n", "seen")

    def __init__(self, start_ns: int) -> None:
        self.max_ts = NONE  # the largest timestamp read
        self.seen = NONE  # tracking: the largest handed to the task
        self.done_n = self.read_n = 0  # tracking: messages whose call returned, read
        self.empty_since = start_ns  # never read: idle counted from the task's start
        self.empty = True  # its last poll found nothing (or it was never read)
        self.ended = False


class EventTime:
    """Per partition the largest timestamp read minus ``lag_ms``; per task the minimum over
    partitions not at end and not idle (``idle_ns`` of empty polls; <= 0: never idle), the
    largest of the idle ones when every partition not at end is idle, ``END`` when all
    ended; never backwards. Loop thread only."""

    __slots__ = ("idle_ns", "lag_ms", "parts", "track", "value")

    def __init__(
        self, npartitions: int, lag_ms: int, idle_ns: int, start_ns: int, track: bool = False
    ) -> None:
        if lag_ms < 0:
            raise ValueError("lag_ms must be >= 0")
        self.lag_ms = lag_ms
        self.idle_ns = idle_ns
        self.value = NONE
        self.parts = [_Part(start_ns) for _ in range(npartitions)]
        # tracking (tr_event_time_track): a partition's watermark follows the messages handed
        # to the task (seen), not those read; its end and idleness count once it is drained
        self.track = track

    def _ended(self, p: _Part) -> bool:
        return p.ended and (not self.track or p.done_n >= p.read_n)

    def _mark(self, p: _Part) -> int:
        if self._ended(p):
            return END
        m = p.seen if self.track else p.max_ts
        if m == NONE:
            return NONE
        return max(m - self.lag_ms, NONE + 1)

    def seen(self, partition: int, ts: int | None, now_ns: int) -> int:
        """A message of ``partition`` with timestamp ``ts`` (None: none) is handed to the task,
        before its call (tracking); the task's watermark."""
        p = self.parts[partition]
        if ts is not None and ts > p.seen:
            p.seen = ts
        return self.update(now_ns)

    def done(self, partition: int, now_ns: int) -> int:
        """The task's call with a message of ``partition`` returned (tracking: a partition at
        its end counts once drained); the task's watermark."""
        self.parts[partition].done_n += 1
        return self.update(now_ns)

    def update(self, now_ns: int) -> int:
        """Recompute at ``now_ns`` (monotonic clock); the task's watermark."""
        min_active, max_idle = END, NONE
        any_open = any_active = False
        for p in self.parts:
            if self._ended(p):
                continue
            any_open = True
            m = self._mark(p)
            if (
                self.idle_ns > 0
                and p.empty
                and now_ns - p.empty_since >= self.idle_ns
                and (not self.track or p.done_n >= p.read_n)
            ):
                max_idle = max(max_idle, m)
            else:
                any_active = True
                min_active = min(min_active, m)
        v = END if not any_open else min_active if any_active else max_idle
        if v > self.value:
            self.value = v
        return self.value

    def read(self, partition: int, max_ts: int, now_ns: int, count: int = 0) -> None:
        """``count`` messages were read from ``partition``; ``max_ts`` the largest timestamp
        (NONE: none)."""
        p = self.parts[partition]
        p.max_ts = max(p.max_ts, max_ts)
        p.read_n += count
        p.empty = False
        self.update(now_ns)

    def empty(self, partition: int, now_ns: int) -> None:
        """A poll of ``partition`` found nothing to read."""
        p = self.parts[partition]
        if not p.empty:
            p.empty = True
            p.empty_since = now_ns
        self.update(now_ns)

    def ended(self, partition: int, now_ns: int) -> None:
        """``partition`` reached its end of stream."""
        self.parts[partition].ended = True
        self.update(now_ns)

    def floor(self, value: int) -> None:
        """The watermark is at least ``value`` from now on (its committed value, rule 33)."""
        self.value = max(self.value, value)

    def partition(self, partition: int) -> int:
        """The partition's own watermark."""
        return self._mark(self.parts[partition])


__all__ = ["END", "NONE", "EventTime", "watermark_lag_ms", "watermark_value"]
