"""A watch on sync ``process`` calls made on the loop thread (rules 3, 16).

On the loop thread nothing else can time a call out while it runs: the loop is
the thread running it. Both engines therefore (1) check each call's duration when
it returns and fail the container with ``CallbackTimeoutError`` when it took longer
than ``task.callback.timeout.ms``, and (2) keep this watch, a daemon thread that
logs a warning once per call while a call is still running past the limit, naming
the task, partition and offset, with the stack of the stuck call.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Any

log = logging.getLogger("tailrace.engine")


class StuckCallWatch:
    """Warns while a process call on one thread runs past ``timeout_ms``.

    ``begin`` and ``end`` are called by the loop thread around each call (two
    attribute writes); the watch thread only reads them. ``close`` stops the watch.
    """

    def __init__(self, timeout_ms: int, thread_ident: int) -> None:
        self.timeout_s = timeout_ms / 1000
        self.timeout_ms = timeout_ms
        self._ident = thread_ident
        # (task name, ssp, offset, monotonic start); replaced as a whole, read as a whole
        self._current: tuple[str, Any, Any, float] | None = None
        self._warned: tuple[str, Any, Any, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="tailrace-stuck-call-watch", daemon=True)
        self._thread.start()

    def begin(self, task: str, ssp: Any, offset: Any, started: float) -> None:
        """The loop thread starts a process call (``started``: time.monotonic())."""
        self._current = (task, ssp, offset, started)

    def end(self) -> None:
        """The call returned (or raised)."""
        self._current = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _main(self) -> None:
        period = max(0.005, self.timeout_s / 4)
        while not self._stop.wait(period):
            cur = self._current
            if cur is None or cur is self._warned:
                continue
            task, ssp, offset, started = cur
            late = time.monotonic() - started
            if late <= self.timeout_s:
                continue
            self._warned = cur
            frame = sys._current_frames().get(self._ident)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)\n"
            log.warning(
                "task %r: process at %s offset %r has been running for %.0f ms, past "
                "task.callback.timeout.ms=%d; the container fails when it returns. Its stack:\n%s",
                task,
                ssp,
                offset,
                late * 1000,
                self.timeout_ms,
                stack.rstrip(),
            )
