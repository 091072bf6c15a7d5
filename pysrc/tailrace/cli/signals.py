"""The stop signals of ``tailrace run``: the first SIGINT or SIGTERM stops gracefully, a
second forces; a forked container takes its parent's death as a graceful stop.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("tailrace.cli")


class _StopSignals:
    """SIGINT/SIGTERM of ``tailrace run``, handled from the start of ``main`` until exit.

    The first signal asks for a graceful stop: of the running container, or, when it
    arrives while the job starts, of the container as soon as it exists; after the
    run (summary printed) it changes nothing, so the exit status is the graceful
    path's. A second signal before the end forces an immediate exit (128 + N).
    While a live display owns the terminal, the notice is handed to it (printing from
    a signal handler could interleave with a redraw).
    """

    def __init__(self) -> None:
        self.received = 0
        self.signum: int | None = None  # the first stop signal
        self.finished = False
        self.notices: list[str] = []
        self.live = False  # a live display shows self.notices
        self._stop: Callable[[], None] | None = None
        self._force: Callable[[], None] | None = None

    def reset(self) -> None:
        """As if no signal had come yet (a container forked by its parent starts afresh)."""
        self.__init__()  # type: ignore[misc]

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, self._handle)

    def install_parent_death(self, signum: int) -> None:
        """``signum`` means "the parent process died" (a container's PR_SET_PDEATHSIG): a
        graceful stop, however often it comes. The kernel sends it each time a thread of the
        parent that was the container's parent ends, and a killed parent's threads end one by
        one, so one death can bring it several times; as SIGTERM, the second would force."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, self._parent_died)

    def _parent_died(self, signum: int, frame: FrameType | None) -> None:
        if self.finished or self.received:
            return  # already stopping (or over): the parent's death changes nothing
        self.received += 1
        self._graceful("tailrace: the parent process died: stopping gracefully")

    def attach(self, stop: Callable[[], None], force: Callable[[], None] | None = None) -> None:
        """From now on a signal calls ``stop`` (a second one ``force``, then exits); calls
        ``stop`` now when a signal already came."""
        self._stop = stop
        self._force = force
        if self.received:
            stop()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.finished:
            return  # the job is over: nothing to stop, the status stays the graceful one
        self.received += 1
        if self.received > 1:
            os.write(2, f"\ntailrace: {name} again: forced stop, no final checkpoint\n".encode())
            if self._force is not None:
                self._force()
            os._exit(128 + signum)
        self.signum = signum
        notice = (
            f"tailrace: {name}: stopping gracefully (finishing in-flight work, writing a checkpoint); "
            + ("Ctrl-C again to force" if signum == signal.SIGINT else f"a second {name} forces")
        )
        self._graceful(notice)

    def _graceful(self, notice: str) -> None:
        """The first stop request: say so, then stop gracefully."""
        if self.live:
            self.notices.append(notice)
        else:
            try:  # on a terminal, on a line of its own (not after the ^C echoed)
                os.write(2, f"{chr(10) if os.isatty(2) else ''}{notice}\n".encode())
            except OSError:  # stderr closed (a container whose parent died): stop all the same
                pass
        if self._stop is not None:
            self._stop()


_SIGNALS = _StopSignals()


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for a SIGHUP when the parent dies (Linux only): a graceful stop
    (see _StopSignals.install_parent_death). A parent gone before the request is seen
    by its pid changing."""
    if not sys.platform.startswith("linux"):
        return
    _SIGNALS.install_parent_death(signal.SIGHUP)
    try:
        _libc().prctl(1, int(signal.SIGHUP), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable", exc_info=True)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGHUP)


@functools.cache
def _libc() -> Any:
    """The C library through ctypes (loaded once, by the parent before it forks)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)
