"""``async def`` tasks under the test driver: their asyncio loop on the driver's virtual time.

A container runs ``async def process`` on an asyncio loop of its own thread
(:class:`~tailrace.aio.AsyncioRunner`). Under the driver that loop reads the driver's
:class:`~tailrace.clock.ManualClock` (``loop.time()`` is the clock's ``monotonic()``), so
``asyncio.sleep``, ``asyncio.timeout`` and ``call_later`` fall due only when the test advances
past them, and it never waits for real time: with no callback ready it blocks until it is woken
(the clock moved, a new invocation, I/O). The clock sees it as one more engine
(:meth:`~tailrace.clock.ManualClock.attach`): settled while it blocks with nothing ready, so a
driver call returns only once every coroutine has run as far as the virtual time lets it.

Real I/O (a socket, a subprocess) completes on real time: the driver does not wait for it.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

from ..aio import AsyncioRunner, _OwnedSelector
from ..clock import ManualClock


class _VirtualSelector(_OwnedSelector):
    """The runner's selector, blocking without a timeout whenever the loop would wait for a
    timer: on virtual time a timer falls due only when the clock moves, which wakes the loop."""

    def __init__(self, stepper: Any) -> None:
        super().__init__(stepper)
        self.waiting = False  # blocked with nothing ready (read by the driver's thread)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return super().select(0)
        self.waiting = True
        try:
            return super().select(None)
        finally:
            self.waiting = False


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop whose ``time()`` is the manual clock's ``monotonic()``."""

    def __init__(self, selector: selectors.BaseSelector, clock: ManualClock) -> None:
        self._tr_clock = clock
        super().__init__(selector)

    def time(self) -> float:
        return self._tr_clock.monotonic()


def _nothing() -> None:
    """Scheduled to wake the loop: it then runs the timers the clock's move made due."""


class VirtualTimeRunner(AsyncioRunner):
    """The asyncio runner of a driven container: asyncio's loop (never uvloop: its clock
    cannot be replaced) on the driver's clock, attached to it as an engine."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(use_uvloop=False, name="tailrace-test-asyncio")
        self._clock = clock
        self._selector: _VirtualSelector | None = None
        clock.attach(self.idle, self.moved)

    def _new_loop(self) -> tuple[asyncio.AbstractEventLoop, bool]:
        self._selector = _VirtualSelector(self._stepper)
        return _VirtualTimeLoop(self._selector, self._clock), True

    def idle(self) -> bool:
        """True while the loop blocks with nothing ready and nothing queued for it (or is
        not running): what remains waits for the clock or for real I/O."""
        loop, selector, thread = self._loop, self._selector, self._thread
        if loop is None or selector is None or thread is None or not thread.is_alive():
            return True
        # an invocation queued by the engine, or a Task an inline step created, is ready work
        ready: Any = getattr(loop, "_ready", ())
        return selector.waiting and not self._pending and not ready

    def moved(self, ns: int) -> None:
        """The clock moved: wake the loop so that it runs the timers now due."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(_nothing)
        except RuntimeError:  # closed: nothing left to wake
            pass

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._clock.detach(self.idle)
