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


# The store holding a task's durable event-time timers (rule 38): a name no job can declare
# (a user's store name has no dot); key: the timer's key, value: its time (ms).
EVENT_TIMERS_STORE = "tailrace.event-timers"
# +inf as an event-time timer's time: never due before the end of the input... which is +inf
_NEVER = math.inf


class EventTimers:
    """A task's event-time timers (rule 38): one-shot, keyed, fired in time order as a
    barrier when the task's watermark reaches their time (ms since the epoch).

    A timer given a callback is the caller's to re-arm after a restart (windows re-arm
    theirs from their stores); one without a callback runs the task's ``on_event_time``
    method and is kept in the task's store ``tailrace.event-timers``, committed with the
    offsets, so it survives restarts. Not thread-safe: the engines hold a lock around it.
    """

    __slots__ = ("_heap", "_method", "_store")

    def __init__(self, store: Any = None, method: Callable[..., Any] | None = None) -> None:
        self._heap = TimerHeap()
        self._store = store  # the task's tailrace.event-timers store, or None
        self._method = method  # the task's bound on_event_time, or None

    def restore(self) -> None:
        """Load the durable timers committed before (a restart)."""
        if self._store is None:
            return
        for key, when in self._store.items():
            key = tuple(key) if isinstance(key, list) else key
            self._heap.push(key, when, self._durable)

    def _durable(self, key: Any, when: int, collector: Any, coordinator: Any) -> Any:
        self._store.delete(key)
        return self._method(key, when, collector, coordinator)  # type: ignore[misc]

    def schedule(self, key: Any, when_ms: int | float, fn: Callable[..., Any] | None) -> None:
        if fn is None:
            if self._method is None or self._store is None:
                raise TypeError(
                    f"event-time timer {key!r} has no callback, and the task defines no "
                    "on_event_time(self, key, when, collector, coordinator) method to run"
                )
            self._store.put(key, when_ms)
            self._heap.push(key, when_ms, self._durable)
            return
        if self._store is not None and self._store.get(key) is not None:
            self._store.delete(key)  # replaced by one that is not durable
        self._heap.push(key, when_ms, lambda k, w, c, co: fn(k, c, co))

    def cancel(self, key: Any) -> bool:
        if self._store is not None and self._store.get(key) is not None:
            self._store.delete(key)
        return self._heap.remove(key)

    def earliest(self) -> int:
        """The earliest time as the C loop takes it (INT64_MAX: none or +inf)."""
        at = self._heap.earliest()
        if at is None or at >= 2**63 - 1:
            return 2**63 - 1
        if at <= -(2**63):
            return -(2**63)
        return math.ceil(at)

    def pop_due(self, watermark: int | float) -> list[tuple[Any, float, Callable[..., Any]]]:
        """Remove and return the timers due at ``watermark`` (their time <= it), in time
        order, each as (key, time, call(key, time, collector, coordinator))."""
        due: list[tuple[Any, float, Callable[..., Any]]] = []
        heap = self._heap
        while True:
            at = heap.earliest()
            if at is None or at > watermark:
                return due
            for key, fn in heap.pop_due(at):
                due.append((key, at, fn))


def check_event_time(key: Any, when_ms: Any) -> int | float:
    """``when_ms`` as an event-time timer's time: an int (ms) or +-inf; ValueError else."""
    if isinstance(when_ms, bool) or not isinstance(when_ms, (int, float)):
        raise TypeError(
            f"event-time timer {key!r}: when_ms must be an int of ms since the epoch, got {when_ms!r}"
        )
    if isinstance(when_ms, float):
        if when_ms != when_ms:
            raise ValueError(f"event-time timer {key!r}: when_ms is NaN")
        if not math.isinf(when_ms):
            when_ms = math.ceil(when_ms)
    return when_ms
