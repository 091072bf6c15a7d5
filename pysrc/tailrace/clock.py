"""The one clock of a run: where an engine reads the time and how it blocks.

Every deadline of a run (commit and window periods, ``context.schedule`` timers, callback
timeouts, the shutdown wait) is read from one :class:`Clock`. :data:`SYSTEM_CLOCK` is real time;
:class:`ManualClock` is virtual time that only moves when a test calls :meth:`ManualClock.advance`
(``tailrace.testing.TestDriver`` uses it), so a window test never sleeps.

The Python engine creates its wake-up condition with :meth:`Clock.condition` and blocks with
:meth:`Clock.wait` (the C loop reads a C clock that the binding moves: ``tr_loop_config.clock_fn``,
:meth:`ManualClock.attach`). On real time that is a plain ``Condition.wait(timeout)``; on a manual clock the
engine waits until it is notified (a completion, new input, a stop) or the clock moves, and the
clock can tell whether the engine has reached that wait with nothing left to do
(:meth:`ManualClock.settled`): the test driver's "run until idle".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Clock:
    """Real time: ``monotonic()`` for periods and deadlines, ``time()`` (epoch seconds) for
    ``context.schedule`` timers. Thread-safe."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (``time.monotonic()``)."""
        return time.monotonic()

    def time(self) -> float:
        """Seconds since the epoch (``time.time()``): what ``context.schedule`` takes."""
        return time.time()

    def condition(self, lock: Any = None) -> threading.Condition:
        """The condition an engine waits on in :meth:`wait` (notify it to wake the engine)."""
        return threading.Condition(lock)

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """Block on ``cond`` (held by the caller) until notified or ``timeout`` seconds passed."""
        cond.wait(timeout)

    def forget(self, cond: threading.Condition) -> None:
        """The engine waiting on ``cond`` has stopped (a manual clock stops tracking it)."""

    @property
    def manual(self) -> bool:
        """True when time moves only by :meth:`ManualClock.advance`."""
        return False


SYSTEM_CLOCK = Clock()


class _WatchedCondition(threading.Condition):
    """A condition whose ``notify`` tells the manual clock that its waiter has work again."""

    def __init__(self, clock: ManualClock, lock: Any) -> None:
        super().__init__(lock)
        self.clock = clock
        self.idle = False  # the engine waits in ManualClock.wait and nobody notified it since
        self.kicked = False  # the clock moved while the engine was not waiting: skip the next wait

    def notify(self, n: int = 1) -> None:
        self.idle = False
        super().notify(n)

    def notify_all(self) -> None:
        self.idle = False
        super().notify_all()


class ManualClock(Clock):
    """Virtual time for tests: starts at ``start`` (epoch seconds, for ``time()``; ``monotonic()``
    starts at 0) and moves only by :meth:`advance`. Thread-safe.

    An engine waiting on this clock blocks until it is notified or the clock moves; it never
    waits for real time to pass, so periods, timers and timeouts fire exactly when the test
    advances past them. Callback timeouts and the shutdown wait are virtual too.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._elapsed_ns = 0  # an integer, as the C clock: ten 100 ms steps make exactly 1 s
        self._start = float(start)
        self._conditions: list[_WatchedCondition] = []
        self._went_idle = threading.Event()  # set whenever an engine starts waiting
        # engines that wait in C (the C loop): (is it idle?, the clock moved to ns) pairs
        self._probes: list[tuple[Callable[[], bool], Callable[[int], None]]] = []

    @property
    def manual(self) -> bool:
        return True

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed_ns / 1e9

    def time(self) -> float:
        with self._lock:
            return self.time_at(self._elapsed_ns)

    def time_at(self, ns: int) -> float:
        """What :meth:`time` returns when :meth:`monotonic` reads ``ns`` nanoseconds."""
        return self._start + ns / 1e9

    def reading_at(self, when: float) -> int:
        """The first reading (``monotonic()`` in ns) at which ``time() >= when``: where a
        ``context.schedule`` timer at ``when`` falls due. Exact for any ``when``: the epoch
        seconds that ``time()`` returns are ~240 ns apart, so ``when`` minus the start, in
        ns, can be off by that much; a timer due at the very time a test advances to would
        be a few ns late (the C loop compares nanoseconds)."""
        at = self.time_at
        lo = max(round((when - self._start) * 1e9) - 4096, 0)
        if at(lo) >= when:
            return lo  # (due at the start, or earlier)
        hi = lo + 8192
        while at(hi) < when:  # (not reached: a float's step is far below 4096 ns)
            hi += 8192
        while hi - lo > 1:  # at(lo) < when <= at(hi)
            mid = (lo + hi) // 2
            if at(mid) >= when:
                hi = mid
            else:
                lo = mid
        return hi

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake every engine waiting on this clock."""
        if seconds < 0:
            raise ValueError(f"a clock never goes back: advance({seconds!r})")
        with self._lock:
            self._elapsed_ns += round(seconds * 1e9)
            elapsed_ns = self._elapsed_ns
            conditions = list(self._conditions)
            probes = list(self._probes)
        for _, moved in probes:
            moved(elapsed_ns)
        for cond in conditions:
            with cond:
                cond.kicked = True
                cond.notify_all()

    def condition(self, lock: Any = None) -> threading.Condition:
        cond = _WatchedCondition(self, lock if lock is not None else threading.RLock())
        with self._lock:
            self._conditions.append(cond)
        return cond

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """Wait until notified or the clock moves (``timeout`` is virtual: only advance() ends it)."""
        if timeout <= 0:
            return
        if not isinstance(cond, _WatchedCondition):
            raise TypeError("ManualClock.wait needs a condition made by ManualClock.condition()")
        if cond.kicked:  # the clock moved since the caller computed ``timeout``
            cond.kicked = False
            return
        cond.idle = True
        self._went_idle.set()
        cond.wait()
        cond.idle = False
        cond.kicked = False

    def settled(self) -> bool:
        """True when an engine runs on this clock and every one waits with nothing to do (until
        notified or advanced)."""
        with self._lock:
            conditions = list(self._conditions)
            probes = list(self._probes)
        if not conditions and not probes:
            return False
        for cond in conditions:
            with cond:
                if not cond.idle:
                    return False
        return all(idle() for idle, _ in probes)

    def attach(self, idle: Callable[[], bool], moved: Callable[[int], None]) -> None:
        """An engine that waits outside Python (the C loop): ``idle()`` says it is parked with
        nothing to do; ``moved(ns)`` hands it the new time (``monotonic()`` in ns) and wakes it."""
        with self._lock:
            self._probes.append((idle, moved))

    def detach(self, idle: Callable[[], bool]) -> None:
        """Forget an engine given to :meth:`attach` (its run ended)."""
        with self._lock:
            self._probes = [p for p in self._probes if p[0] != idle]

    def wait_settled(self, timeout: float, running: Callable[[], bool]) -> bool:
        """Block (real time, at most ``timeout`` seconds) until :meth:`settled` or ``running()``
        is false; True unless the timeout expired."""
        deadline = time.monotonic() + timeout
        while running():
            self._went_idle.clear()
            if self.settled():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # an engine in C does not set the event: poll it briefly; the cap also sees a run end
            self._went_idle.wait(min(left, 0.001 if self._probes else 0.05))
        return True

    def forget(self, cond: threading.Condition) -> None:
        """Stop tracking an engine's condition (its run ended)."""
        with self._lock:
            if cond in self._conditions:
                self._conditions.remove(cond)
