"""The life of one member of a distributed job, shared by the Redis and Kafka backends.

A member is one container process of a job whose partitions several processes share
(:mod:`tailrace.redis.membership`, :mod:`tailrace.kafka.membership`). Whatever
coordinates the members, each one lives the same way (:meth:`MemberLifecycle.run`):

1. it joins;
2. it plans: which partitions it owns now;
3. it runs one :class:`~tailrace.container.Container` over them, counting what it
   processed, until the container ends or is stopped because something asks for a
   re-plan (a membership change, a rebalance, a lost lease);
4. a commit refused by a fence (a lease or a group generation another member holds
   now) re-plans instead of failing the member;
5. it goes back to 2 until stopped, done, or the task asks to shut down, then leaves.

``stop()`` bounds all of that by ``task.shutdown.ms`` (:class:`~tailrace._stopping.StopDeadline`);
:func:`run_with_signals` turns SIGINT and SIGTERM into ``stop()``.

A backend supplies how partitions are assigned and how a lease or generation is
fenced, as these hooks (each called on the thread that runs ``run()``):

- ``_join()`` / ``_leave()``: enter the membership, and leave it (also after an error);
- ``_plan()``: the partitions to run now (sorted), ``[]`` after waiting for some, or
  ``None`` to leave;
- ``_prepare(owned)``: the inputs, systems and checkpoint store of a container over
  ``owned`` (``None``: plan again first), and ``_may_start()``, the last word before
  it runs;
- ``_fenced(store)``: forget what a fenced commit showed is lost;
- ``_ended(owned, reason)``: what a container's end means (end of stream, shutdown);
- ``_unreachable(e)`` and ``_unacknowledged()``: what the errors say about the service.

Threads: ``_cond`` (a condition over an RLock, so that a signal handler on a thread
already inside it may take it again) guards the running container, the partitions it
reads, the re-plan request and the backend's own shared state; a backend's threads
(a heartbeat, group callbacks) set ``_replan`` and stop the running container to make
the run loop plan again. ``_stopping`` is a plain flag: signal handlers set it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ._stopping import StopDeadline, arm_backstop, gave_up_message, member_config, not_committed, processed
from .config import Config
from .container import Container, EngineName
from .errors import CheckpointError, TailraceError, fenced_cause
from .interfaces import CheckpointStore, System
from .types import SystemStreamPartition


class MemberSpecFields(Protocol):
    """What every member spec says about the containers it runs."""

    task: Any
    engine: EngineName
    default_output_system: str | None


class MemberCounts(Protocol):
    """What every member result counts (the backends' results add their own)."""

    processed: int  # messages processed by this member's containers
    skipped: int  # bad input its containers skipped
    runs: int  # containers started
    fenced: int  # containers stopped because a commit was fenced
    reason: str  # why the member left


P = TypeVar("P")  # how a backend names a partition it plans (a number, a topic partition)
R = TypeVar("R", bound=MemberCounts)

ContainerParts = tuple[
    Sequence[SystemStreamPartition], Sequence[System] | Mapping[str, System], CheckpointStore
]


class MemberLifecycle(Generic[P, R]):
    """Plan, run, re-plan, leave: one member's loop (see the module docstring).

    ``run()`` blocks until ``stop()`` (any thread, signal handlers) or until the plan
    says to leave; a stop that runs out of ``task.shutdown.ms`` raises CheckpointError
    saying what was not committed. A subclass sets :attr:`log` and the hooks.
    """

    log: ClassVar[logging.Logger]
    spec: MemberSpecFields

    def __init__(self, config: Config, result: R, *, member_id: str | None = None) -> None:
        self.config = config
        self.job = config.job_name
        self.result = result
        # how log lines and errors name the member: by its id where it has one
        self.who = f"member {member_id}" if member_id else f"member of {self.job!r}"
        self._title = (
            f"member {member_id} of job {self.job!r}" if member_id else f"member of job {self.job!r}"
        )
        self.deadline = StopDeadline()  # armed by stop(): task.shutdown.ms
        self._cond = threading.Condition()
        self._stopping = False
        self._replan = False  # something asked the run loop to plan again
        self._running: set[P] = set()  # what the running container reads
        self._container: Container | None = None
        self._last_container: Container | None = None

    # -- the hooks ---------------------------------------------------------------------
    def _join(self) -> None:
        raise NotImplementedError

    def _plan(self) -> list[P] | None:
        raise NotImplementedError

    def _prepare(self, owned: list[P]) -> ContainerParts | None:
        raise NotImplementedError

    def _may_start(self) -> bool:
        """With ``_cond`` held, just before a built container runs: False to plan again."""
        return True

    def _describe(self, owned: list[P]) -> str:
        return str(owned)

    def _fenced(self, store: CheckpointStore) -> None:
        """A commit of the container over ``store`` was fenced (the run loop plans again)."""

    def _ended(self, owned: list[P], reason: str) -> None:
        """The container over ``owned`` returned; ``reason`` is its result's."""

    def _leave(self) -> None:
        raise NotImplementedError

    def _unreachable(self, e: Exception) -> Exception | None:
        """The error to raise instead of ``e`` when it says the service did not answer."""
        return None

    def _unacknowledged(self) -> str | None:
        """A line about output the service has not acknowledged, if any."""
        return None

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> R:
        """Join, run containers over the planned partitions until stopped or done, leave."""
        self._join()
        try:
            while (owned := self._plan()) is not None:
                if owned:
                    self._run_container(owned)
        except Exception as e:
            error = self._unreachable(e)
            if error is None:
                raise
            raise error from e
        finally:
            self._leave()
        return self.result

    def _run_container(self, owned: list[P]) -> None:
        parts = self._prepare(owned)
        if parts is None:
            return  # plan again first
        inputs, systems, store = parts
        container = Container(
            self.spec.task,
            inputs=inputs,
            systems=systems,
            config=member_config(self.config),
            checkpoints=store,
            engine=self.spec.engine,
            default_output_system=self.spec.default_output_system,
        )
        with self._cond:
            if not self._may_start():
                return  # plan again first
            self._container = container
            self._running = set(owned)
        self.result.runs += 1
        self.log.info("%s: running %s", self.who, self._describe(owned))
        if self._stopping or self._replan:
            container.stop()  # a stop or a re-plan that came while this container was being built
        try:
            result = container.run()
        except Exception as e:
            self.result.processed += processed(container)  # what it processed still counts
            if self.deadline.due():
                raise CheckpointError(self.gave_up_message(f"{type(e).__name__}: {e}")) from e
            if not isinstance(e, TailraceError) or fenced_cause(e) is None:
                raise
            self.result.fenced += 1
            self.log.warning("%s: %s; re-planning", self.who, e)
            self._fenced(store)
            with self._cond:
                self._replan = True
            return
        finally:
            self.result.skipped += sum(container.skipped().values())
            with self._cond:
                self._last_container = container
                self._container = None
                self._running = set()
                self._cond.notify_all()
        self.result.processed += result.processed
        self._ended(owned, result.reason)

    def _stop_container(self) -> None:
        c = self._container
        if c is not None:
            c.stop()

    def stop(self) -> None:
        """Leave gracefully: the running container finishes and commits, then the member
        leaves, all within ``task.shutdown.ms``. Safe from any thread and from signal
        handlers."""
        self._stopping = True
        self.deadline.arm(self.config.shutdown_ms / 1000)
        self._stop_container()
        with self._cond:  # an RLock: a signal handler on a thread inside _cond may take it again
            self._cond.notify_all()

    # -- what a stop that gave up says ---------------------------------------------------
    def not_committed(self) -> list[str]:
        """What the last (or running) container processed but did not commit, per
        partition, and output the service has not acknowledged (for a stop that gave up)."""
        return not_committed(self._container or self._last_container, self._unacknowledged())

    def gave_up_message(self, cause: str) -> str:
        """The error of a stop that ran out of ``task.shutdown.ms`` while a service did
        not answer."""
        return gave_up_message(self._title, self.config.shutdown_ms, cause, self.not_committed())


def run_with_signals(
    member: MemberLifecycle[Any, R],
    *,
    handle_signals: bool = True,
    on_signal: Callable[[int, Any], None] | None = None,
) -> R:
    """``member.run()``; on the main thread with ``handle_signals``, SIGINT and SIGTERM
    call ``on_signal`` (by default ``member.stop()``) meanwhile, and a stop that hangs
    past its deadline exits the process (:func:`tailrace._stopping.arm_backstop`)."""
    restore: list[tuple[signal.Signals, Any]] = []
    finished = threading.Event()
    if handle_signals and threading.current_thread() is threading.main_thread():
        arm_backstop(member, finished)
        handler = on_signal or (lambda _signum, _frame: member.stop())
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore.append((sig, signal.signal(sig, handler)))
    try:
        return member.run()
    finally:
        finished.set()
        for sig, old in restore:
            signal.signal(sig, old)


__all__ = ["MemberCounts", "MemberLifecycle", "MemberSpecFields", "run_with_signals"]
