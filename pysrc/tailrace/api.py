"""The task API users write against (SEMANTICS.md), shared by both engines.

``Envelope`` and ``Coordinator`` live in the compiled core for speed (one is made
per message) and are re-exported from here; everything else is plain Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ._core import Coordinator, Envelope
from .types import Scope, SystemStreamPartition

if TYPE_CHECKING:
    from .config import Config
    from .metrics import TaskMetrics

__all__ = [
    "AsyncStreamTask",
    "Callback",
    "Collector",
    "Coordinator",
    "Envelope",
    "Scope",
    "StreamTask",
    "TaskContext",
    "TimerService",
    "task_kind",
]


class Callback(Protocol):
    """Completion handle for one envelope of an async task (rules 12, 17, 22).

    Safe to call from any thread, including threads tailrace did not create and
    asyncio event-loop threads. Exactly one of ``complete``/``fail`` may be called,
    once; a second resolution stops the container with CallbackError.
    """

    def complete(self) -> None: ...

    def fail(self, exc: BaseException) -> None: ...


class Collector(Protocol):
    """Sends output messages (rule 24: ``send`` waits while the output is full)."""

    def send(self, stream: str, message: Any, key: Any = None, partition: int | None = None) -> None: ...


class TimerService(Protocol):
    """Engine side of ``TaskContext.schedule`` / ``cancel`` (rule 23)."""

    def schedule(self, key: Any, when: float, fn: Callable[[Any, Collector, Coordinator], Any]) -> None: ...

    def cancel(self, key: Any) -> bool: ...

    def now(self) -> float: ...


class TaskContext:
    """What a task learns about itself in ``init(context)``.

    ``task_name``, ``partitions`` (the SystemStreamPartitions it owns), ``config``,
    ``metrics`` (a live :class:`~tailrace.metrics.TaskMetrics` snapshot on each
    access), and per-task one-shot timers: ``schedule(key, when, fn)`` runs
    ``fn(key, collector, coordinator)`` at ``when`` (seconds since the epoch, as
    ``time.time()``) like a window: only with nothing outstanding, exclusive with
    process/window/commit (rule 23). Re-scheduling a key replaces its timer;
    ``cancel(key)`` removes it. ``loop`` is the container's asyncio loop for
    ``async def`` tasks (None otherwise).
    """

    def __init__(
        self,
        task_name: str,
        partitions: Sequence[SystemStreamPartition],
        config: Config,
        timers: TimerService,
        metrics: Callable[[], TaskMetrics],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.task_name = task_name
        self.partitions: tuple[SystemStreamPartition, ...] = tuple(partitions)
        self.config = config
        self.loop = loop
        self._timers = timers
        self._metrics = metrics

    @property
    def metrics(self) -> TaskMetrics:
        return self._metrics()

    def schedule(self, key: Any, when: float, fn: Callable[[Any, Collector, Coordinator], Any]) -> None:
        """Run ``fn(key, collector, coordinator)`` once at ``when`` (time.time() seconds)."""
        if not callable(fn):
            raise TypeError(f"timer callback for key {key!r} is not callable: {fn!r}")
        self._timers.schedule(key, float(when), fn)

    def cancel(self, key: Any) -> bool:
        """Remove the timer registered under ``key``; True if there was one."""
        return self._timers.cancel(key)

    def now(self) -> float:
        """The run's clock in epoch seconds: ``time.time()``, or the virtual time of a test
        driver. Compute ``schedule`` times from it (``context.now() + 5``)."""
        return self._timers.now()

    def __repr__(self) -> str:
        return f"TaskContext(task_name={self.task_name!r}, partitions={list(map(str, self.partitions))})"


class StreamTask:
    """A synchronous task: ``process`` completes when it returns (rule 3).

    Optional hooks: ``init(context)``, ``window(collector, coordinator)``,
    ``end_of_stream(collector, coordinator)``, ``close()``.
    """

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define process()")


class AsyncStreamTask:
    """An asynchronous task: ``process_async`` resolves ``callback`` later, from any thread.

    Up to ``task.max.concurrency`` envelopes are outstanding at once; invocation
    stays in offset order (rule 1) while completions may arrive out of order
    (rule 12). Optional hooks as for :class:`StreamTask`.
    """

    def process_async(
        self,
        envelope: Envelope,
        collector: Collector,
        coordinator: Coordinator,
        callback: Callback,
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define process_async()")


def task_kind(task: object) -> str:
    """``"sync"``, ``"async"`` (callback style) or ``"asyncio"`` (``async def process``).

    Raises TypeError naming the class when it is none of these.
    """
    cls = type(task)
    if isinstance(task, AsyncStreamTask):
        proc = getattr(cls, "process", None)
        if proc is not None and asyncio.iscoroutinefunction(proc):
            return "asyncio"
        if getattr(cls, "process_async", None) is AsyncStreamTask.process_async:
            raise TypeError(f"{cls.__qualname__} must define process_async() or async def process()")
        return "async"
    proc = getattr(cls, "process", None)
    if isinstance(task, StreamTask):
        if proc is StreamTask.process:
            raise TypeError(f"{cls.__qualname__} must define process()")
        return "sync"
    if hasattr(task, "process_async"):
        return "async"
    if proc is not None:
        return "asyncio" if asyncio.iscoroutinefunction(proc) else "sync"
    raise TypeError(f"{cls.__qualname__} is not a task: define process() or process_async()")


def hook(task: object, name: str) -> Callable[..., Any] | None:
    """The task's optional hook ``name`` (init/window/end_of_stream/close) or None."""
    fn = getattr(task, name, None)
    return fn if callable(fn) else None


MetricsMapping = Mapping[str, Any]
