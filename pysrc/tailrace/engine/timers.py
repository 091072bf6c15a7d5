"""The per-task one-shot timer heap behind ``TaskContext.schedule`` / ``cancel`` (rule 23).

Both engines keep one :class:`TimerHeap` per task and wrap it with their own
locking and wake-up policy (the C engine tells the loop the earliest due time;
the reference engine notifies its condition variable).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

from ..clock import Clock, ManualClock

# on real time, a context.schedule timer due less than this before a window (seconds) is due
# with it, and the window runs first: epoch seconds are ~0.24 us apart, so the two clocks'
# readings cannot order instants closer than that (virtual time compares exactly)
_SAME_INSTANT = 1e-6


def before_window(clock: Clock, window_ns: int, window_time: float) -> float:
    """The latest timer time (epoch seconds, as ``clock.time()``) that runs before a window
    that fell due when the clock's ``monotonic()`` read ``window_ns`` (rules 8, 23: in the
    order they fell due, the window first at one instant). ``window_time`` is ``time()`` at
    that instant as the engine estimates it, used on real time only; on virtual time the
    clock gives it exactly, so a timer at ``now + 0.05`` is at a 50 ms window's instant."""
    if isinstance(clock, ManualClock):
        return math.nextafter(clock.time_at(window_ns), -math.inf)
    return window_time - _SAME_INSTANT


class _EarlyCommit:
    """The key of the timer an exactly-once task's full output buffer schedules: no task's
    own key equals it (rule 41: an early commit, see ``early_commit``)."""

    def __repr__(self) -> str:
        return "<early commit>"


EARLY_COMMIT = _EarlyCommit()


def _request_commit(key: Any, collector: Any, coordinator: Any) -> None:
    coordinator.commit()


def early_commit(schedule: Callable[[Any, float, Callable[..., Any]], None]) -> Callable[[], None]:
    """What a task's held producers call when full (rule 41): a timer due at once (rule 23:
    it runs with nothing outstanding, so every message that sent has completed) whose
    commit request takes effect at once, as every timer's does."""
    return lambda: schedule(EARLY_COMMIT, 0.0, _request_commit)


class TimerHeap:
    """Timers keyed by the user's key; re-scheduling a key replaces its timer.

    Not thread-safe: callers hold their own lock. Entries replaced or cancelled
    stay in the heap until they reach its top (lazy deletion), so every
    operation is O(log n) amortised.
    """

    __slots__ = ("_counter", "_entries", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._entries: dict[Any, tuple[float, int, Callable[..., Any]]] = {}
        self._counter = itertools.count()

    def push(self, key: Any, when: float, fn: Callable[..., Any]) -> None:
        n = next(self._counter)
        self._entries[key] = (when, n, fn)
        heapq.heappush(self._heap, (when, n, key))

    def remove(self, key: Any) -> bool:
        """Cancel ``key``'s timer; False when none was registered."""
        return self._entries.pop(key, None) is not None

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            _, n, key = heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry[1] == n:
                return
            heapq.heappop(heap)

    def earliest(self) -> float | None:
        """The earliest registered time (``time.time()`` seconds), or None."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[Any, Callable[..., Any]]]:
        """Remove and return the timers due at ``now``, in time order."""
        due: list[tuple[Any, Callable[..., Any]]] = []
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                return due
            _, _, key = heapq.heappop(self._heap)
            _, _, fn = self._entries.pop(key)
            due.append((key, fn))
