"""A graceful stop's time limit (``task.shutdown.ms``), shared by the members of
distributed jobs (:mod:`tailrace.redis.membership`, :mod:`tailrace.kafka.membership`).

A member's ``stop()`` arms its :class:`StopDeadline`; whatever the stop still waits
for (in-flight work, the producer's flush, the final commit, leaving the group)
gives up at the deadline, and the member's ``run()`` raises an error saying what was
not committed (what a restart processes again). Should the stop itself still hang,
:func:`arm_backstop` exits the process :data:`GRACE_S` after the deadline.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .config import Config
from .metrics import TaskMetrics

log = logging.getLogger("tailrace.stopping")


class StopDeadline:
    """How long a graceful stop may still wait for an outside service (``task.shutdown.ms``).

    ``arm(seconds)`` (any thread, signal handlers) starts the clock once; at the
    deadline ``due()`` turns true, so every ``retrying`` loop given ``stop=due``
    gives up instead of starting another attempt, and the registered ``on_due``
    callbacks run (on a timer thread): they shut down the sockets of calls blocked
    on a paused or vanished Redis, so those fail at once instead of after their
    socket timeout. ``reason`` says why (for the error message).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: float | None = None
        self._due = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self.seconds = 0.0

    def arm(self, seconds: float) -> None:
        """Start the countdown (the first call wins)."""
        with self._lock:
            if self._at is not None:
                return
            self.seconds = seconds
            self._at = time.monotonic() + seconds
        timer = threading.Timer(seconds, self._fire)
        timer.daemon = True
        timer.name = "tailrace-stop-deadline"
        timer.start()

    def armed(self) -> bool:
        return self._at is not None

    def due(self) -> bool:
        """True once the deadline passed: stop waiting."""
        return self._due.is_set()

    def on_due(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` at the deadline (at once if it passed); it must not block."""
        with self._lock:
            run_now = self._due.is_set()
            if not run_now:
                self._callbacks.append(fn)
        if run_now:
            _call_quietly(fn)

    def _fire(self) -> None:
        with self._lock:
            self._due.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _call_quietly(fn)


def _call_quietly(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a best-effort abort must not stop the others
        log.exception("aborting blocked calls at the stop deadline failed")


GRACE_S = 5.0
"""How long past a stop's deadline :func:`arm_backstop` waits before exiting the process."""


class Stoppable(Protocol):
    """A member whose stop is bounded by its ``deadline``."""

    deadline: StopDeadline

    def gave_up_message(self, cause: str) -> str: ...


def arm_backstop(member: Stoppable, finished: threading.Event) -> None:
    """Once ``member``'s stop deadline is due, give the stop :data:`GRACE_S` more to
    finish (``finished`` set); past that, print what was not committed and exit the
    process with status 1 (a stop blocked on an unreachable service must not hang it)."""

    def backstop() -> None:
        if not finished.wait(GRACE_S):
            msg = member.gave_up_message("the stop itself did not finish")
            print(f"tailrace: error: {msg}", file=sys.stderr, flush=True)
            os._exit(1)

    member.deadline.on_due(lambda: threading.Thread(target=backstop, daemon=True).start())


def uncommitted(t: TaskMetrics) -> list[str]:
    """Each partition of ``t`` processed past its committed offset: what a restart
    processes again."""
    out = []
    for ssp, low in sorted(t.low_watermark.items()):
        committed = t.committed.get(ssp)
        if low != committed:
            since = "nothing committed" if committed is None else f"committed {committed}"
            out.append(f"{ssp} processed through {low} ({since})")
    return out


class _HasMetrics(Protocol):
    def metrics(self) -> tuple[dict[str, TaskMetrics], object] | None: ...


def not_committed(container: _HasMetrics | None, unacknowledged: str | None) -> list[str]:
    """What ``container`` processed and did not commit, per partition, then
    ``unacknowledged`` (a line about output the service has not acknowledged), if any."""
    snap = container.metrics() if container is not None else None
    out = [line for t in snap[0].values() for line in uncommitted(t)] if snap is not None else []
    if unacknowledged:
        out.append(unacknowledged)
    return out


def processed(container: _HasMetrics) -> int:
    """What ``container`` processed, by its metrics (a run that raised has no result)."""
    snap = container.metrics()
    return sum(t.processed for t in snap[0].values()) if snap is not None else 0


def member_config(config: Config) -> Config:
    """``config`` for a member's container: its graceful stop keeps part of
    ``task.shutdown.ms`` (a quarter, at most 2 s) for the final commit (and the producer's
    flush, leaving the group), and its drain awaits outstanding callbacks for the rest, so
    that a callback still running at the end of the drain does not use up the whole stop
    and leave the final commit no time (rule 19)."""
    return dataclasses.replace(config, stop_reserve_ms=min(config.shutdown_ms // 4, 2000))


def gave_up_message(who: str, shutdown_ms: int, cause: str, lost: list[str]) -> str:
    """The error of a member's stop that ran out of ``task.shutdown.ms``."""
    what = "; ".join(lost) if lost else "nothing (every processed message was committed)"
    return (
        f"{who}: stop gave up after task.shutdown.ms = {shutdown_ms} ms ({cause}); "
        f"not committed, processed again after a restart: {what}"
    )


__all__ = [
    "GRACE_S",
    "StopDeadline",
    "Stoppable",
    "arm_backstop",
    "gave_up_message",
    "not_committed",
    "processed",
    "uncommitted",
]
