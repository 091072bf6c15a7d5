"""The task API users write against, shared by both engines.

"Rule N" in docstrings is rule N of the behaviour contract, docs/SEMANTICS.md in the
repository (installed with the package as ``tailrace/SEMANTICS.md``; :data:`SEMANTICS`
is its path).

``Envelope`` and ``Coordinator`` live in the compiled core for speed (one is made
per message) and are re-exported from here; everything else is plain Python.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ._core import Coordinator, Envelope
from .errors import ConfigError
from .types import Scope, SystemStreamPartition

if TYPE_CHECKING:
    import asyncio

    from .config import Config
    from .metrics import TaskMetrics
    from .stores import KeyValueStore, TaskStores

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
    "check_task_class",
    "task_kind",
]

SEMANTICS = Path(__file__).with_name("SEMANTICS.md")
"""The behaviour contract (docs/SEMANTICS.md of the repository) as installed with the package."""

HOOKS = ("init", "window", "end_of_stream", "close")
"""Optional hooks engines call when a task defines them (see :func:`hook`)."""
ENTRY_POINTS = ("process", "process_async")


_ET_NONE = -(1 << 63)  # tailrace.engine.event_time.NONE / END: -infinity, +infinity
_ET_END = (1 << 63) - 1


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

    def schedule_event_time(self, key: Any, when_ms: int | float, fn: Callable[..., Any] | None) -> None: ...

    def cancel_event_time(self, key: Any) -> bool: ...


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
        stores: TaskStores | None = None,
        watermark: Callable[[], int] | None = None,
    ) -> None:
        self.task_name = task_name
        self.partitions: tuple[SystemStreamPartition, ...] = tuple(partitions)
        self.config = config
        self.loop = loop
        self._timers = timers
        self._metrics = metrics
        self._stores = stores
        self._watermark = watermark

    def store(self, name: str) -> KeyValueStore[Any, Any]:
        """The task's store ``name`` (declared with ``[stores.NAME]`` / ``stores.NAME.*``).

        Its writes become durable at the task's commit, atomically with its offsets
        (rule 26). ConfigError naming the declared stores when there is no such store.
        """
        if self._stores is None:
            from .errors import ConfigError

            raise ConfigError(
                f"task {self.task_name!r} has no store {name!r}",
                key=f"stores.{name}",
                allowed="no stores declared ([stores.NAME] in the job file, Container(stores=...))",
            )
        return self._stores.get(name)

    @property
    def metrics(self) -> TaskMetrics:
        return self._metrics()

    def schedule(self, key: Any, when: float, fn: Callable[[Any, Collector, Coordinator], Any]) -> None:
        """Run ``fn(key, collector, coordinator)`` once at ``when`` (time.time() seconds; a
        time already past fires at the next chance, ``inf`` never). ValueError for a NaN ``when``."""
        if not callable(fn):
            raise TypeError(f"timer callback for key {key!r} is not callable: {fn!r}")
        if self.loop is None and _is_coroutine_function(fn):
            raise TypeError(
                f"timer callback for key {key!r} is an async def, which only a task with async def "
                "process() runs (docs/asyncio.md); make it a plain function"
            )
        at = float(when)
        if at != at:  # NaN: neither past nor future (inf is: it never fires)
            raise ValueError(f"timer for key {key!r}: when is NaN; give a time.time() value")
        self._timers.schedule(key, at, fn)

    def cancel(self, key: Any) -> bool:
        """Remove the timer registered under ``key``; True if there was one."""
        return self._timers.cancel(key)

    def now(self) -> float:
        """The run's clock in epoch seconds: ``time.time()``, or the virtual time of a test
        driver. Compute ``schedule`` times from it (``context.now() + 5``)."""
        return self._timers.now()

    def schedule_event_time(
        self,
        key: Any,
        when_ms: int | float,
        fn: Callable[[Any, Collector, Coordinator], Any] | None = None,
    ) -> None:
        """An event-time timer (rule 38): once the task's watermark reaches ``when_ms`` (ms
        since the epoch; ``math.inf``: at the end of the input), as a barrier like
        ``schedule``'s timers, in time order, run ``fn(key, collector, coordinator)``; without
        ``fn``, the task's method ``on_event_time(self, key, when_ms, collector,
        coordinator)``. Re-scheduling a key replaces its timer.

        A timer without ``fn`` survives restarts: it is kept in the task's state and
        committed with its offsets (a task that defines ``on_event_time`` needs a checkpoint
        store that keeps state). One with ``fn`` lives as long as the run: set it again in
        ``init`` after a restart (windows re-arm theirs from their stores). At the end of
        every input the watermark is +infinity and every timer fires before
        ``end_of_stream`` (rule 37). docs/event-time.md."""
        if fn is not None and not callable(fn):
            raise TypeError(f"event-time timer callback for key {key!r} is not callable: {fn!r}")
        if fn is not None and self.loop is None and _is_coroutine_function(fn):
            raise TypeError(
                f"event-time timer callback for key {key!r} is an async def, which only a task with "
                "async def process() runs (docs/asyncio.md); make it a plain function"
            )
        schedule = getattr(self._timers, "schedule_event_time", None)
        if schedule is None:
            raise TypeError(f"task {self.task_name!r}: this engine has no event-time timers")
        schedule(key, when_ms, fn)

    def cancel_event_time(self, key: Any) -> bool:
        """Remove the event-time timer registered under ``key``; True if there was one."""
        cancel = getattr(self._timers, "cancel_event_time", None)
        return bool(cancel(key)) if cancel is not None else False

    def watermark(self) -> int | float:
        """The task's event-time watermark (rules 33, 37; docs/event-time.md): an int of ms
        since the epoch, ``-math.inf`` before there is one, ``math.inf`` once every input has
        ended. It never moves backwards. Any thread."""
        raw = _ET_NONE if self._watermark is None else self._watermark()
        return -math.inf if raw == _ET_NONE else math.inf if raw == _ET_END else raw

    def __repr__(self) -> str:
        return f"TaskContext(task_name={self.task_name!r}, partitions={list(map(str, self.partitions))})"


class StreamTask:
    """A synchronous task: ``process`` completes when it returns (rule 3).

    Optional hooks: ``init(context)``, ``window(collector, coordinator)`` (every
    ``task.window.ms``; never while that is disabled), ``end_of_stream(collector,
    coordinator)``, ``close()``. They are declared below for editors and type
    checkers only: an engine runs a hook when the task's class defines it.
    """

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        """Without a ``process`` of its own, a task that declares windows
        (:mod:`tailrace.windows`) adds every message to every window."""
        adds = self.__dict__.get("_tailrace_adds")  # bound by tailrace.windows.bind
        if adds is None:
            for name in getattr(type(self), "_tailrace_window_names", ()):
                getattr(self, name)  # a window no container bound says so (it raises)
            raise NotImplementedError(f"{type(self).__name__} must define process()")
        for add in adds:
            add(envelope, collector, coordinator)

    if TYPE_CHECKING:  # declared, not defined: engines look hooks up with hook(task, name)

        def init(self, context: TaskContext) -> None:
            """Once, before the first message."""

        def window(self, collector: Collector, coordinator: Coordinator) -> None:
            """Every ``task.window.ms``, with nothing outstanding (rule 8)."""

        def end_of_stream(self, collector: Collector, coordinator: Coordinator) -> None:
            """Once, when every input partition of the task has ended (rule 11)."""

        def close(self) -> None:
            """Once, when the container stops."""

        def on_event_time(
            self, key: Any, when_ms: int, collector: Collector, coordinator: Coordinator
        ) -> None:
            """An event-time timer set with ``context.schedule_event_time(key, when_ms)`` (no
            callback) fell due: the task's watermark reached ``when_ms`` (rule 38)."""


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

    if TYPE_CHECKING:  # declared, not defined: engines look hooks up with hook(task, name)

        def init(self, context: TaskContext) -> Awaitable[None] | None:
            """Once, before the first message; may be ``async def`` for an ``async def process``."""

        def window(self, collector: Collector, coordinator: Coordinator) -> Awaitable[None] | None:
            """Every ``task.window.ms``, with nothing outstanding (rule 8)."""

        def end_of_stream(self, collector: Collector, coordinator: Coordinator) -> Awaitable[None] | None:
            """Once, when every input partition of the task has ended (rule 11)."""

        def close(self) -> Awaitable[None] | None:
            """Once, when the container stops."""


def _is_coroutine_function(fn: object) -> bool:
    """``asyncio.iscoroutinefunction`` without importing asyncio (a sync job never needs
    it): asyncio's own marker can only be on ``fn`` once asyncio is imported."""
    if inspect.iscoroutinefunction(fn):
        return True
    aio = sys.modules.get("asyncio")
    return aio is not None and bool(aio.iscoroutinefunction(fn))


def task_kind(task: object) -> str:
    """``"sync"``, ``"async"`` (callback style) or ``"asyncio"`` (``async def process``).

    Raises TypeError naming the class when it is none of these.
    """
    cls = type(task)
    if isinstance(task, AsyncStreamTask):
        proc = getattr(cls, "process", None)
        if proc is not None and _is_coroutine_function(proc):
            return "asyncio"
        if getattr(cls, "process_async", None) is AsyncStreamTask.process_async:
            raise TypeError(f"{cls.__qualname__} must define process_async() or async def process()")
        return "async"
    proc = getattr(cls, "process", None)
    if isinstance(task, StreamTask):
        if proc is StreamTask.process and not _declares_windows(cls):
            raise TypeError(f"{cls.__qualname__} must define process()")
        # an async def process runs on the container's loop whatever the base class:
        # called as a sync process it would only make a coroutine that nothing awaits
        return "asyncio" if _is_coroutine_function(proc) else "sync"
    if hasattr(task, "process_async"):
        return "async"
    if proc is not None:
        return "asyncio" if _is_coroutine_function(proc) else "sync"
    raise TypeError(f"{cls.__qualname__} is not a task: define process() or process_async()")


def _declares_windows(cls: type) -> bool:
    """The class declares windows (tailrace.windows records their names on it; this module
    imports nothing of that one)."""
    return any(
        hasattr(getattr(cls, name, None), "store_name") for name in getattr(cls, "_tailrace_window_names", ())
    )


def _defines_entry_point(cls: type) -> bool:
    if issubclass(cls, AsyncStreamTask):
        proc = getattr(cls, "process", None)
        return (proc is not None and _is_coroutine_function(proc)) or getattr(
            cls, "process_async", None
        ) is not AsyncStreamTask.process_async
    proc = getattr(cls, "process", None)
    if issubclass(cls, StreamTask):
        return proc is not StreamTask.process or _declares_windows(cls)
    return callable(proc) or callable(getattr(cls, "process_async", None))


def _own_methods(cls: type) -> list[str]:
    """Public function names the task's own classes define (not tailrace's base classes)."""
    names: list[str] = []
    for klass in cls.__mro__:
        if klass in (object, StreamTask, AsyncStreamTask):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and name not in names and inspect.isroutine(value):
                names.append(name)
    return names


def check_task_class(cls: type, window_ms: int | None = None) -> list[str]:
    """Start-up checks of a task class; returns warnings to log, raises ConfigError to refuse.

    Refused: a class that defines neither ``process`` nor ``process_async`` (a
    method whose name is close to one is named). Warned: a method whose name is
    close to a hook it does not define (``windw``, ``end_of_steam``: they would
    never run), and ``window()`` while ``task.window.ms`` (``window_ms``, when
    given) is disabled.
    """
    own = _own_methods(cls)
    defined = {name for name in (*HOOKS, *ENTRY_POINTS) if callable(getattr(cls, name, None))}
    near: dict[str, str] = {}
    for name in own:
        if name in HOOKS or name in ENTRY_POINTS:
            continue
        import difflib  # here: most tasks define no other methods, and it costs every run an import

        match = difflib.get_close_matches(name.lower(), (*HOOKS, *ENTRY_POINTS), n=1, cutoff=0.82)
        if match:
            near[name] = match[0]
    qual = cls.__qualname__
    if not _defines_entry_point(cls):
        typos = [f"{n}() looks like a misspelling of {h}()" for n, h in near.items() if h in ENTRY_POINTS]
        hint = f"; {', '.join(typos)}" if typos else ""
        raise ConfigError(
            f"task class {qual} defines neither process() nor process_async() (nor async def process()){hint}"
        )
    if not _is_coroutine_function(getattr(cls, "process", None)):
        # only a task with async def process runs on an event loop: any other task would
        # call an async hook, get a coroutine, and never run it
        coro = [h for h in HOOKS if _is_coroutine_function(getattr(cls, h, None))]
        if coro:
            names = ", ".join(f"{h}()" for h in coro)
            raise ConfigError(
                f"task class {qual} defines {names} with async def, which only a task with "
                f"async def process() runs (docs/asyncio.md); make {'them' if len(coro) > 1 else 'it'} "
                "plain methods, or process() an async def"
            )
    warnings = [
        f"task class {qual}: method {n}() looks like a misspelling of the hook {h}(), "
        f"which it does not define; {n}() is never called"
        for n, h in near.items()
        if h not in defined and (h in HOOKS or h == "process")
    ]
    if window_ms is not None and window_ms <= 0 and "window" in own:
        warnings.append(
            f"task class {qual} defines window(), which never runs: task.window.ms is {window_ms} "
            "(disabled); set it to the window period in milliseconds"
        )
    return warnings


def hook(task: object, name: str) -> Callable[..., Any] | None:
    """The task's optional hook ``name`` (init/window/end_of_stream/close) or None."""
    fn = getattr(task, name, None)
    return fn if callable(fn) else None


MetricsMapping = Mapping[str, Any]
