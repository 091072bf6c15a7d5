"""Windows over event time (or processing time): tumbling, hopping and session windows with
their aggregates (SEMANTICS rules 34-37; docs/windows.md).

A window is declared as a class attribute of a task::

    class PerUser(StreamTask):
        per_minute = Tumbling(60_000, key="user", aggregate=Count(), output="files.counts")

The attribute is a spec (a descriptor). Before the task's ``init`` runs, the container binds
each instance to a runtime of its own (``bind``): ``self.per_minute`` is then that runtime,
whose ``add(envelope, collector)`` assigns a message to its windows. A task that declares
windows and defines no ``process`` adds every message to every window.

State (rule 36): each declared window keeps its open windows in a reserved store of the
task, ``tailrace.window.<attribute>``, committed with the offsets like any store. The
runtime's in-memory index (a heap of close times) is rebuilt from the store at start and
only ever holds *more* entries than the store needs (an entry whose window is gone is
skipped), so a store write undone by a retry or a skipped message never leaves the index
short of a window. Closing runs in one engine timer per declared window, armed at its
earliest close time: ``context.schedule_event_time`` (event time) or ``context.schedule``
(processing time); those timers are not persisted, the store re-arms them at start.
"""

from __future__ import annotations

import copy
import functools
import heapq
import itertools
import math
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .api import StreamTask as _StreamTask
from .api import TaskContext
from .config import StoreSpec
from .errors import ConfigError
from .stores import _MISSING as _STORE_MISSING
from .stores import journal_current as _journal_current

if TYPE_CHECKING:
    from .api import Collector, Coordinator, Envelope
    from .stores import KeyValueStore

__all__ = [
    "Aggregate",
    "Collect",
    "Count",
    "Fold",
    "Hopping",
    "Max",
    "Mean",
    "Min",
    "Session",
    "Sum",
    "Tumbling",
    "Window",
    "WindowResult",
    "declared_windows",
]

STORE_PREFIX = "tailrace.window."
"""Each declared window's store is ``STORE_PREFIX + attribute name`` (no job can declare a
store with a dot in its name)."""

_MISSING: Any = object()
# no accumulator: what tailrace.stores.journal_undo takes for "the key was not there"
_NO_ACC: Any = _STORE_MISSING


def _fresh_copier(agg: Aggregate) -> Callable[[Any], Any] | None:
    """How a fixed window copies an accumulator before ``add`` so that the one it had stays
    as it was (the undo journal holds it): None for the built-ins that make a new value."""
    if isinstance(agg, Collect):
        return list.copy  # Collect appends in place
    if isinstance(agg, Agg):
        return None if agg.compiled() is not None else _deep_list_copy
    if isinstance(agg, Fold):
        return _shallow_copy  # a user's add may change a list or dict in place
    return None


_SCALARS = frozenset({int, float, str, bool, type(None)})


def _deep_list_copy(acc: Any) -> Any:
    return [_shallow_copy(v) for v in acc]


def _shallow_copy(acc: Any) -> Any:
    t = type(acc)
    return acc.copy() if t is list or t is dict else acc


_ET_NONE = -(1 << 63)  # the engines' raw watermark of -infinity; +infinity is 2**63 - 1
_ET_END = (1 << 63) - 1


class WindowResult(NamedTuple):
    """One window's result: ``final`` is False for an ``emit="updates"`` value sent after a
    message, True for the one result sent when the window closes. For a session window,
    ``start`` and ``end`` are the timestamps of its first and last message; for the others
    ``[start, end)``."""

    key: Any
    start: int
    end: int
    value: Any
    final: bool


# -- aggregates ---------------------------------------------------------------------------------
Getter = Callable[["Envelope"], Any]


def _getter(what: str | Callable[[Envelope], Any] | None, owner: str) -> Getter:
    """A message field (a name), a callable of the envelope, or None (the whole message)."""
    if what is None:
        return lambda envelope: envelope.message
    if callable(what):
        return what
    if isinstance(what, str):
        field = what

        def get(envelope: Envelope) -> Any:
            message = envelope.message
            try:
                return message[field]
            except KeyError:
                raise KeyError(f"{owner}: the message has no field {field!r}") from None
            except (TypeError, IndexError):
                raise TypeError(
                    f"{owner}: the message is no object with a field {field!r}: {message!r:.80}"
                ) from None

        return get
    raise TypeError(f"{owner}: expected a field name, a callable of the envelope or None, got {what!r}")


class Aggregate:
    """How a window folds its messages: ``initial()``, ``add(acc, envelope)``, ``merge(a, b)``
    (``a`` the earlier session; None when the aggregate cannot merge), ``result(acc)``.

    Accumulators are stored (rule 36): they must be JSON values. ``add`` and ``merge`` may
    change the accumulator they are given (it is a copy) and must return the new one.
    """

    mergeable = True

    def initial(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, envelope: Envelope) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class Count(Aggregate):
    """The number of messages."""

    def initial(self) -> int:
        return 0

    def add(self, acc: int, envelope: Envelope) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def __repr__(self) -> str:
        return "Count()"


class _OfValue(Aggregate):
    def __init__(self, value: str | Callable[[Envelope], Any]) -> None:
        self.what = value
        self.value = _getter(value, repr(self))

    def __repr__(self) -> str:
        what = self.what if isinstance(self.what, str) else getattr(self.what, "__name__", "fn")
        return f"{type(self).__name__}({what!r})"


class Sum(_OfValue):
    """The sum of a field (or of a callable of the envelope)."""

    def initial(self) -> Any:
        return 0

    def add(self, acc: Any, envelope: Envelope) -> Any:
        return acc + self.value(envelope)

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class Min(_OfValue):
    """The smallest value of a field (or of a callable of the envelope)."""

    def initial(self) -> Any:
        return None

    def add(self, acc: Any, envelope: Envelope) -> Any:
        v = self.value(envelope)
        return v if acc is None or v < acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None or (b is not None and b < a) else a


class Max(_OfValue):
    """The largest value of a field (or of a callable of the envelope)."""

    def initial(self) -> Any:
        return None

    def add(self, acc: Any, envelope: Envelope) -> Any:
        v = self.value(envelope)
        return v if acc is None or v > acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None or (b is not None and b > a) else a


class Mean(_OfValue):
    """The arithmetic mean of a field (or of a callable of the envelope)."""

    def initial(self) -> list[Any]:
        return [0, 0]

    def add(self, acc: list[Any], envelope: Envelope) -> list[Any]:
        return [acc[0] + self.value(envelope), acc[1] + 1]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, acc: list[Any]) -> float:
        return acc[0] / acc[1]


class Collect(Aggregate):
    """A list of a field of each message (a callable of the envelope; None: the whole
    message), in the order they were added (for a merged session: the earlier session's
    first)."""

    def __init__(self, value: str | Callable[[Envelope], Any] | None = None) -> None:
        self.what = value
        self.value = _getter(value, repr(self))

    def initial(self) -> list[Any]:
        return []

    def add(self, acc: list[Any], envelope: Envelope) -> list[Any]:
        acc.append(self.value(envelope))
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b

    def __repr__(self) -> str:
        what = self.what if self.what is None or isinstance(self.what, str) else "fn"
        return f"Collect({what!r})"


class Agg(Aggregate):
    """Several aggregates of one window at once, by name: ``Agg(views=Count(),
    spent=Sum("amount"))``; its result is a dict of theirs (``{"views": 3, "spent": 42}``).
    Mergeable when each is."""

    def __init__(self, **aggregates: Aggregate) -> None:
        if not aggregates:
            raise TypeError("Agg: give at least one aggregate, as name=Count()")
        for name, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise TypeError(f"Agg: {name}={agg!r} is no aggregate (Count(), Sum(field), ...)")
        self.parts = aggregates
        self._names = tuple(aggregates)
        self._aggs = tuple(aggregates.values())
        self.mergeable = all(a.mergeable for a in self._aggs)

    def initial(self) -> list[Any]:
        return [a.initial() for a in self._aggs]

    def add(self, acc: list[Any], envelope: Envelope) -> list[Any]:
        return [a.add(v, envelope) for a, v in zip(self._aggs, acc)]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return [agg.merge(x, y) for agg, x, y in zip(self._aggs, a, b)]

    def result(self, acc: list[Any]) -> dict[str, Any]:
        return {name: agg.result(v) for name, agg, v in zip(self._names, self._aggs, acc)}

    def compiled(self) -> list[tuple[int, str | None]] | None:
        """Its parts as the compiled add takes them, (kind, field): 0 Count, 1 Sum, 2 Min,
        3 Max, each of a message field; None when some part is anything else."""
        kinds = {Count: 0, Sum: 1, Min: 2, Max: 3}
        out = []
        for agg in self._aggs:
            kind = kinds.get(type(agg))
            if kind is None or (kind and not isinstance(getattr(agg, "what", None), str)):
                return None
            out.append((kind, None if kind == 0 else agg.what))  # type: ignore[attr-defined]
        return out

    def __repr__(self) -> str:
        return f"Agg({', '.join(f'{n}={a!r}' for n, a in self.parts.items())})"


class Fold(Aggregate):
    """Your own aggregate: ``initial`` (a JSON value, copied for each window, or a callable
    making one), ``add(acc, envelope) -> acc``, optionally ``merge(a, b) -> acc`` (``a`` the
    earlier session: a Session window needs it) and ``result(acc) -> value``."""

    def __init__(
        self,
        initial: Any,
        add: Callable[[Any, Envelope], Any],
        merge: Callable[[Any, Any], Any] | None = None,
        result: Callable[[Any], Any] | None = None,
    ) -> None:
        if not callable(add):
            raise TypeError(f"Fold: add must be a callable (acc, envelope) -> acc, got {add!r}")
        self._initial = initial
        self._add = add
        self._merge = merge
        self._result = result
        self.mergeable = merge is not None

    def initial(self) -> Any:
        initial = self._initial
        if callable(initial):
            return initial()
        t = type(initial)
        if t is list and all(type(v) in _SCALARS for v in initial):
            return initial.copy()  # the common [0, 0]: deepcopy costs microseconds a window
        return initial if t in _SCALARS else copy.deepcopy(initial)

    def add(self, acc: Any, envelope: Envelope) -> Any:
        return self._add(acc, envelope)

    def merge(self, a: Any, b: Any) -> Any:
        assert self._merge is not None  # Session refuses a Fold without merge at start-up
        return self._merge(a, b)

    def result(self, acc: Any) -> Any:
        return acc if self._result is None else self._result(acc)

    def __repr__(self) -> str:
        return f"Fold({getattr(self._add, '__name__', 'add')})"


# -- keys ----------------------------------------------------------------------------------------
def _as_key(key: Any) -> Any:
    """A window key as the store gives it back: a list becomes a tuple (json keys)."""
    if type(key) is list or type(key) is tuple:
        return tuple(_as_key(k) for k in key)
    return key


def _second(entry: tuple[Any, Any]) -> Any:
    return entry[1]


def _order(key: Any) -> tuple[Any, ...]:
    """A total order over window keys of mixed types (None, numbers, strings, bytes, tuples),
    for "then key" in the close order (rule 35)."""
    if key is None:
        return (0,)
    if isinstance(key, bool | int | float):
        return (1, key)
    if isinstance(key, str):
        return (2, key)
    if isinstance(key, bytes):
        return (3, key)
    if isinstance(key, tuple):
        return (4, tuple(_order(k) for k in key))
    return (5, repr(key))


# -- the specs ----------------------------------------------------------------------------------
KeySpec = str | Callable[["Envelope"], Any] | None


class Window:
    """What every window kind shares (see the kinds' docstrings and docs/windows.md).

    ``key``: a message field, a callable ``(envelope) -> key``, or None (``envelope.key``).
    ``aggregate``: default ``Count()``. ``emit``: ``"final"`` or ``"updates"`` (also the new
    value after each message, ``final=False``). ``grace_ms``: how long after its end a window
    stays open. ``time``: ``"event"`` (the envelope's timestamp, the task's watermark) or
    ``"processing"`` (the wall clock at ``add``, the wall clock as watermark). ``output``
    (``"system.stream"``: each result is sent there) or ``on_result`` (the name of a task method
    ``(result, collector, coordinator)``): exactly one. ``late_output``: where late messages
    go (optional; they are counted in any case).
    """

    kind = "window"

    def __init__(
        self,
        *,
        key: KeySpec = None,
        aggregate: Aggregate | None = None,
        emit: str = "final",
        grace_ms: int = 0,
        time: str = "event",
        output: str | None = None,
        on_result: str | None = None,
        late_output: str | None = None,
    ) -> None:
        self.key = key
        self.aggregate = aggregate if aggregate is not None else Count()
        self.emit = emit
        self.grace_ms = grace_ms
        self.time = time
        self.output = output
        self.on_result = on_result
        self.late_output = late_output
        self.name = "?"
        self.owner = "?"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__qualname__
        # what StreamTask.process of an instance no container bound looks at (tailrace.api
        # imports nothing of this module)
        owner._tailrace_window_names = (*getattr(owner, "_tailrace_window_names", ()), name)  # type: ignore[attr-defined]

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        # a bound runtime lives in the instance's __dict__ and shadows this (non-data) descriptor
        raise RuntimeError(
            f"window {self.where} is not bound to a running task: a container binds it before "
            "the task's init() (a task instance made by hand has no windows)"
        )

    @property
    def where(self) -> str:
        return f"{self.owner}.{self.name}"

    @property
    def store_name(self) -> str:
        return STORE_PREFIX + self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} window {self.where}>"

    # start-up checks ------------------------------------------------------------------
    def _refuse(self, message: str, allowed: str | None = None) -> ConfigError:
        return ConfigError(f"window {self.where} ({type(self).__name__}): {message}", allowed=allowed)

    def _positive(self, name: str, value: Any, zero: bool = False) -> None:
        ok = type(value) is int and (value >= 0 if zero else value > 0)
        if not ok:
            raise self._refuse(
                f"{name} is {value!r}", "an int of milliseconds " + (">= 0" if zero else "> 0")
            )

    def check(self, cls: type) -> None:
        """Refuse a bad declaration at start-up (ConfigError naming the window)."""
        if not isinstance(self.aggregate, Aggregate):
            raise self._refuse(
                f"aggregate is {self.aggregate!r}",
                "Count(), Sum(f), Min(f), Max(f), Mean(f), Collect(f), Fold(...)",
            )
        if self.key is not None and not isinstance(self.key, str) and not callable(self.key):
            raise self._refuse(
                f"key is {self.key!r}", "a message field name, a callable (envelope) -> key, None"
            )
        if self.emit not in ("final", "updates"):
            raise self._refuse(f"emit is {self.emit!r}", "'final', 'updates'")
        if self.time not in ("event", "processing"):
            raise self._refuse(f"time is {self.time!r}", "'event', 'processing'")
        self._positive("grace_ms", self.grace_ms, zero=True)
        if (self.output is None) == (self.on_result is None):
            raise self._refuse(
                "give exactly one of output= and on_result=",
                "output='system.stream' or on_result='method name'",
            )
        for name in ("output", "late_output"):
            stream = getattr(self, name)
            if stream is not None and (not isinstance(stream, str) or not stream):
                raise self._refuse(f"{name} is {stream!r}", "a stream name, 'system.stream'")
        if self.on_result is not None:
            method = getattr(cls, self.on_result, None) if isinstance(self.on_result, str) else None
            if not callable(method):
                raise self._refuse(
                    f"on_result names {self.on_result!r}, which is no method of {cls.__qualname__}",
                    "the name of a method (result, collector, coordinator)",
                )
            from .api import _is_coroutine_function

            if _is_coroutine_function(method):
                raise self._refuse(
                    f"on_result method {self.on_result}() is an async def; make it a plain method"
                )

    def _runtime(self, task: Any, context: TaskContext, store: KeyValueStore[Any, Any]) -> _Runtime:
        raise NotImplementedError


class _Fixed(Window):
    """Windows of a fixed size every ``step_ms``, aligned to the epoch plus ``offset_ms``."""

    def __init__(self, size_ms: int, step_ms: int, offset_ms: int, options: dict[str, Any]) -> None:
        super().__init__(**options)
        self.size_ms = size_ms
        self.step_ms = step_ms
        self.offset_ms = offset_ms

    def check(self, cls: type) -> None:
        super().check(cls)
        self._positive("size_ms", self.size_ms)
        self._positive("step_ms", self.step_ms)
        if type(self.offset_ms) is not int:
            raise self._refuse(f"offset_ms is {self.offset_ms!r}", "an int of milliseconds")
        if self.step_ms > self.size_ms:
            raise self._refuse(
                f"step_ms {self.step_ms} is larger than size_ms {self.size_ms}: messages between "
                "windows would belong to none (rule 34)",
                "step_ms <= size_ms",
            )

    def starts(self, ts: int) -> list[int]:
        """The starts of the windows holding ``ts``, oldest first (floor division: windows
        before the epoch exist too)."""
        size, step, offset = self.size_ms, self.step_ms, self.offset_ms
        last = (ts - offset) // step * step + offset  # the latest start <= ts
        first = last - (size - 1) // step * step  # the earliest start with start + size > ts
        while first + size <= ts:
            first += step
        return list(range(first, last + 1, step))

    def _runtime(self, task: Any, context: TaskContext, store: KeyValueStore[Any, Any]) -> _Runtime:
        return _FixedRuntime(self, task, context, store)


class Tumbling(_Fixed):
    """Fixed windows of ``size_ms``: ``[k*size + offset, (k+1)*size + offset)``. Closes when the
    watermark reaches its end plus ``grace_ms`` (rules 34, 35)."""

    kind = "tumbling"

    def __init__(self, size_ms: int, *, offset_ms: int = 0, **options: Any) -> None:
        super().__init__(size_ms, size_ms, offset_ms, options)


class Hopping(_Fixed):
    """Overlapping windows of ``size_ms`` every ``step_ms`` (``step_ms <= size_ms``; ``size_ms``
    need not be a multiple of it): ``[k*step + offset, k*step + offset + size)``; a message
    belongs to each that holds its timestamp (rule 34)."""

    kind = "hopping"

    def __init__(self, size_ms: int, step_ms: int, *, offset_ms: int = 0, **options: Any) -> None:
        super().__init__(size_ms, step_ms, offset_ms, options)


class Session(Window):
    """Per-key sessions: messages of a key at most ``gap_ms`` apart are one session covering
    ``[first, last]``; a message bridging two sessions merges them. Closes when the watermark
    exceeds ``last + gap + grace`` (rules 34, 35). The aggregate must merge (every built-in
    does; a ``Fold`` needs ``merge=``)."""

    kind = "session"

    def __init__(self, gap_ms: int, **options: Any) -> None:
        super().__init__(**options)
        self.gap_ms = gap_ms

    def check(self, cls: type) -> None:
        super().check(cls)
        self._positive("gap_ms", self.gap_ms)
        if not self.aggregate.mergeable:
            raise self._refuse(
                f"aggregate {self.aggregate!r} cannot merge sessions: a message that bridges two "
                "sessions merges their accumulators",
                "Fold(initial, add, merge=...) or a built-in aggregate",
            )

    def _runtime(self, task: Any, context: TaskContext, store: KeyValueStore[Any, Any]) -> _Runtime:
        return _SessionRuntime(self, task, context, store)


_DECLARED: weakref.WeakKeyDictionary[type, dict[str, Window]] = weakref.WeakKeyDictionary()


def declared_windows(cls: type) -> dict[str, Window]:
    """The windows a task class declares (its own and inherited ones), by attribute name, in
    declaration order."""
    found = _DECLARED.get(cls)
    if found is None:
        found = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Window):
                    found[name] = value
                else:
                    found.pop(name, None)  # a subclass replaced it
        _DECLARED[cls] = found
    return found


def check_windows(cls: type) -> dict[str, Window]:
    """Start-up checks of every window ``cls`` declares; the windows. ConfigError to refuse."""
    windows = declared_windows(cls)
    for window in windows.values():
        window.check(cls)
    return windows


def store_specs(windows: dict[str, Window]) -> dict[str, StoreSpec]:
    """The reserved stores that hold the windows' state (json keys and values)."""
    return {w.store_name: StoreSpec() for w in windows.values()}


def bind(task: Any, context: TaskContext) -> list[_Runtime]:
    """Give ``task`` a runtime of its own for each window its class declares (in its
    ``__dict__``, where ``self.NAME`` finds it), each restored from its store and with its
    timer armed. Called where the engines make a task's context, before ``init``."""
    runtimes = []
    for name, window in declared_windows(type(task)).items():
        runtime = window._runtime(task, context, context.store(window.store_name))
        task.__dict__[name] = runtime
        runtimes.append(runtime)
    for runtime in runtimes:
        runtime.restore()
    # StreamTask.process of a task without its own: one lookup, then each window's add
    task.__dict__["_tailrace_adds"] = [r.add for r in runtimes]
    return runtimes


# -- runtimes ------------------------------------------------------------------------------------
class _Runtime:
    """One declared window of one task instance: its store, its close-time index, its timer.

    Thread-safety: ``add`` may run on a pool thread or in an async task while nothing else of
    the task runs but other async messages' ``add``: one lock serialises them with each other
    and with closing (which runs as a barrier).
    """

    _close_ordered = False  # _close's results need sorting into close order (rule 35)

    def __init__(self, spec: Window, task: Any, context: TaskContext, store: KeyValueStore[Any, Any]) -> None:
        self.spec = spec
        self.name = spec.name
        self._context = context
        self._store = store
        self._agg = spec.aggregate
        self._grace = spec.grace_ms
        self._updates = spec.emit == "updates"
        self._processing = spec.time == "processing"
        self._timer_key = ("tailrace.window", spec.name)
        self._armed: int | None = None
        self._heap: list[tuple[Any, ...]] = []
        self._seq = itertools.count()
        self._lock = threading.RLock()
        # add and closing never overlap for a sync task on the loop thread (rule 21): no lock
        config = getattr(context, "config", None)
        self._locked = (
            getattr(context, "loop", None) is not None
            or getattr(config, "thread_pool_size", 0) > 0
            or not isinstance(task, _StreamTask)
        )
        # the engine's watermark as it keeps it: an int, -2**63 / 2**63 - 1 for -inf / +inf,
        # which compare with window ends as the infinities do
        raw = context._watermark if isinstance(context, TaskContext) else None
        if raw is None:
            read = context.watermark

            def raw() -> int:
                value = read()
                return _ET_NONE if value == -math.inf else _ET_END if value == math.inf else int(value)

        self._raw_watermark: Callable[[], int] = raw
        self.late = 0  # late messages seen by this run (TaskMetrics.late)
        key = spec.key
        if key is None:
            self._key: Callable[[Envelope], Any] = lambda envelope: envelope.key
        elif isinstance(key, str):
            self._key = _getter(key, f"window {spec.where}: key")
        else:
            self._key = key
        self._on_result = getattr(task, spec.on_result) if spec.on_result is not None else None

    def __repr__(self) -> str:
        return f"<{type(self.spec).__name__} window {self.spec.where} of task {self._context.task_name!r}>"

    # what the task calls -----------------------------------------------------------------
    def add(self, envelope: Envelope, collector: Collector, coordinator: Coordinator | None = None) -> bool:
        """Assign ``envelope`` to its windows (rule 34); True when it joined one, False when it
        was late (rule 35: counted, and sent to ``late_output`` when set). With
        ``emit="updates"`` each window it joined sends its new value. ``coordinator`` is handed
        to an ``on_result`` method (None when not given)."""
        try:
            key = self._key(envelope)
            kt = type(key)
            if kt is not str and kt is not int:
                key = _as_key(key)
                if isinstance(key, dict | set):
                    raise TypeError(
                        f"window {self.spec.where}: a window key must be a JSON scalar or array, "
                        f"got {key!r:.80}"
                    )
            if self._processing:
                ts = watermark = math.floor(self._context.now() * 1000)
            else:
                stamp = envelope.timestamp
                if type(stamp) is not int:
                    raise TypeError(f"the envelope has no event timestamp ({stamp!r}): docs/event-time.md")
                ts = stamp
                watermark = self._raw_watermark()
        except Exception as e:
            e.add_note(f"in window {self.spec.where} of task {self._context.task_name!r}")
            raise
        if not self._locked:
            return self._add(envelope, key, ts, watermark, collector, coordinator)
        with self._lock:
            return self._add(envelope, key, ts, watermark, collector, coordinator)

    # shared machinery ------------------------------------------------------------------
    def _timestamp(self, envelope: Envelope) -> int:
        if self._processing:
            return math.floor(self._context.now() * 1000)
        ts = envelope.timestamp
        if type(ts) is not int:
            raise TypeError(f"the envelope has no event timestamp ({ts!r}); see docs/event-time.md")
        return ts

    def _watermark(self) -> int | float:
        if self._processing:
            return math.floor(self._context.now() * 1000)
        return self._raw_watermark()

    def _push(self, when: int, *entry: Any) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), *entry))

    def _arm(self) -> None:
        """Keep one timer at the earliest close time (none when nothing is open)."""
        when = self._heap[0][0] if self._heap else None
        if when == self._armed:
            return
        self._armed = when
        context = self._context
        if when is None:
            if self._processing:
                context.cancel(self._timer_key)
            else:
                context.cancel_event_time(self._timer_key)
        elif self._processing:
            context.schedule(self._timer_key, when / 1000.0, self._fire)
        else:
            context.schedule_event_time(self._timer_key, when, self._fire)

    def _due(self, watermark: int | float) -> list[tuple[Any, ...]]:
        due = []
        heap = self._heap
        while heap and heap[0][0] <= watermark:
            due.append(heapq.heappop(heap))
        return due

    def _fire(self, timer_key: Any, collector: Collector, coordinator: Coordinator) -> None:
        with self._lock:
            self._armed = None
            watermark = self._watermark()
            if self._processing and self._heap:  # the clock read in ms may round below the timer's time
                watermark = max(watermark, self._heap[0][0])
            closed = self._close(watermark)
            if not self._close_ordered:
                closed.sort(key=lambda r: (r.end, r.start, _order(r.key)))
            try:
                for result in closed:
                    self._emit(result, collector, coordinator)
            finally:
                self._arm()

    def _emit(self, result: WindowResult, collector: Collector, coordinator: Coordinator | None) -> None:
        if self._on_result is not None:
            self._on_result(result, collector, coordinator)
            return
        assert self.spec.output is not None
        key = result.key
        record = {
            "key": key,
            "start": result.start,
            "end": result.end,
            "value": result.value,
            "final": result.final,
        }
        collector.send(self.spec.output, record, key=key)

    def _late(
        self,
        envelope: Envelope,
        key: Any,
        ts: int,
        windows: list[list[int]],
        watermark: int | float,
        collector: Collector,
    ) -> bool:
        self.late += 1
        stream = self.spec.late_output
        if stream is not None:
            message = {
                "message": envelope.message,
                "key": key,
                "timestamp": ts,
                "windows": windows,
                "watermark": math.inf if watermark == _ET_END else watermark,
            }
            collector.send(stream, message, key=key)
        return False

    def restore(self) -> None:
        raise NotImplementedError

    def _add(
        self,
        envelope: Envelope,
        key: Any,
        ts: int,
        watermark: int | float,
        collector: Collector,
        coordinator: Coordinator | None,
    ) -> bool:
        raise NotImplementedError

    def _close(self, watermark: int | float) -> list[WindowResult]:
        raise NotImplementedError


class _FixedRuntime(_Runtime):
    """Tumbling and hopping windows. Store: ``(start, key) -> accumulator``; index: a heap of
    ``(end + grace, seq, start, key)``, one entry pushed when a window is created.

    The open windows' accumulators live in ``_entries`` above the store (its overlay): a
    message costs a dict lookup and the fold, not a store read and an encoded store write.
    The windows written since the last commit (``_dirty``) go into the store when a commit
    takes its changes (``flush``, on the loop thread at the commit's barrier), so the
    commit still carries exactly the state of the messages before it (rules 26, 27). A
    sync invocation's writes are recorded in the thread's undo journal with the store's
    own (``_entries``, ``_dirty`` and ``_lock`` are what ``journal_undo`` restores): a
    skipped or failed message leaves no trace in a window (rules 39, 40). Where a journal may
    hold an accumulator, it is never changed in place (``_fresh``), so the journal's earlier
    value stays as it was; the compiled ``process`` of a lone declared window (no journal)
    folds an ``Agg`` of Count/Sum/Min/Max into its list in place, and ``flush`` hands the
    store copies."""

    spec: _Fixed
    # _close gives its windows in close order: one close time has one end, so one start
    _close_ordered = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._stored: set[tuple[int, Any]] = set()  # windows the store holds (flushed)
        self._entries: dict[tuple[int, Any], Any] = {}  # open windows: (start, key) -> acc
        self._dirty: dict[tuple[int, Any], Any] = {}  # written since the last flush
        # the close-time index: the heap holds each close time once, and this its windows
        # (the keys of one window end are many: one heap entry each cost more compares)
        self._closing: dict[int, list[tuple[int, Any]]] = {}
        self._store._overlay = self
        self._fresh = _fresh_copier(self._agg)
        fast = self._compiled_add()
        self._compiled = fast
        if fast is not None:
            self.add = fast.add  # type: ignore[method-assign]

    def _compiled_add(self) -> Any:
        """The compiled ``add`` of the common case (tailrace._core.TumblingAdd), or None."""
        spec = self.spec
        key = spec.key
        if (
            spec.step_ms != spec.size_ms
            or self._processing
            or self._updates
            or self._locked
            or not (key is None or isinstance(key, str))
        ):
            return None
        try:
            from ._core import LoopRunner, TumblingAdd
        except ImportError:  # pragma: no cover - a build without the compiled core
            return None
        agg = self._agg
        fold = agg._add if isinstance(agg, Fold) else agg.add
        raw = self._raw_watermark
        loop, task = None, 0
        runner = getattr(raw.func, "__self__", None) if isinstance(raw, functools.partial) else None
        if isinstance(runner, LoopRunner):
            loop, task = runner, raw.args[0]  # type: ignore[attr-defined]  # the C engine: read it in C
        return TumblingAdd(
            self,
            key,
            fold,
            int(self._fresh is not None),
            spec.size_ms,
            spec.offset_ms,
            self._grace,
            loop,
            task,
            raw,
            _journal_current,
            agg.initial,
            _NO_ACC,
            agg.compiled() if isinstance(agg, Agg) else None,
        )

    def restore(self) -> None:
        size, grace = self.spec.size_ms, self._grace
        with self._lock:
            self._heap.clear()
            self._closing.clear()
            self._entries.clear()
            self._dirty.clear()
            self._stored.clear()
            for (start, key), acc in self._store.items():
                self._entries[start, key] = acc
                self._stored.add((start, key))
                self._push(start + size + grace, start, key)
            heapq.heapify(self._heap)
            self._arm()

    def _push(self, when: int, *entry: Any) -> None:
        group = self._closing.get(when)
        if group is None:
            self._new_close_time(when, entry)
        else:
            group.append(entry)

    def _new_close_time(self, when: int, entry: tuple[int, Any]) -> None:
        """A window closing at a time no open window closes at yet."""
        self._closing[when] = [entry]
        heapq.heappush(self._heap, (when, next(self._seq)))
        if self._armed is None or when < self._armed:
            self._arm()

    def _due(self, watermark: int | float) -> list[tuple[Any, ...]]:
        due: list[tuple[Any, ...]] = []
        heap, closing = self._heap, self._closing
        while heap and heap[0][0] <= watermark:
            when = heapq.heappop(heap)[0]
            group = closing.pop(when, [])
            # one close time: one end and one start; then by key (rule 35)
            if all(type(k) is str for _, k in group):
                group.sort(key=_second)
            else:
                group.sort(key=lambda e: _order(e[1]))
            due.extend((when, 0, start, key) for start, key in group)
        return due

    def flush(self) -> None:
        """Write the windows changed since the last flush into the store (a commit is about
        to take the store's changes)."""
        with self._lock:
            if not self._dirty:
                return
            store, entries, stored = self._store, self._entries, self._stored
            for skey in self._dirty:
                acc = entries.get(skey, _NO_ACC)
                if acc is not _NO_ACC:
                    # a copy: the compiled process changes an Agg's list in place later (the
                    # store encodes a list at the put, but a value it kept as is would be
                    # encoded by the commit writer's thread after that)
                    store.put(skey, acc[:] if type(acc) is list else acc)
                    stored.add(skey)
                elif skey in stored:  # (one opened and closed since the last flush never was)
                    store.delete(skey)
                    stored.discard(skey)
            self._dirty.clear()  # in place: the compiled add holds it

    def _add(
        self,
        envelope: Envelope,
        key: Any,
        ts: int,
        watermark: int | float,
        collector: Collector,
        coordinator: Coordinator | None,
    ) -> bool:
        spec, agg, grace = self.spec, self._agg, self._grace
        size = spec.size_ms
        if spec.step_ms == size:  # tumbling: one window
            start = ts - (ts - spec.offset_ms) % size
            if start + size + grace <= watermark:
                return self._late(envelope, key, ts, [[start, start + size]], watermark, collector)
            open_: list[int] | tuple[int] = (start,)
        else:
            starts = spec.starts(ts)
            open_ = [s for s in starts if s + size + grace > watermark]
            if not open_:
                return self._late(envelope, key, ts, [[s, s + size] for s in starts], watermark, collector)
        created = False
        updates = []
        entries, dirty, fresh = self._entries, self._dirty, self._fresh
        journal = _journal_current()
        for start in open_:
            skey = (start, key)
            acc = entries.get(skey, _NO_ACC)
            if journal is not None:
                journal.push(self, skey, acc)
            if acc is _NO_ACC:
                acc = agg.initial()
                self._push(start + size + grace, start, key)
                created = True
            elif fresh is not None:
                acc = fresh(acc)
            acc = agg.add(acc, envelope)
            entries[skey] = dirty[skey] = acc
            if self._updates:
                updates.append(WindowResult(key, start, start + size, agg.result(acc), False))
        if created:
            self._arm()
        for result in updates:
            self._emit(result, collector, coordinator)
        return True

    def _close(self, watermark: int | float) -> list[WindowResult]:
        entries, dirty, agg, size = self._entries, self._dirty, self._agg, self.spec.size_ms
        closed = []
        for _, _, start, key in self._due(watermark):
            acc = entries.pop((start, key), _NO_ACC)
            if acc is _NO_ACC:
                continue  # a duplicate entry, or a window whose creation was undone
            dirty[start, key] = _NO_ACC  # deleted from the store at the next flush
            closed.append(WindowResult(key, start, start + size, agg.result(acc), True))
        return closed


class _SessionRuntime(_Runtime):
    """Session windows. Store: ``key -> {"open": [[start, last, acc], ...], "closed": [start,
    last] or None}``, the key's open sessions by start and the latest session closed, kept
    while a message that is not late could still fall within the gap of it (such a message
    belongs to a closed session: it is late, rule 35, and never starts a second session
    that a batch computation would not have). Index: a heap of ``(when, seq, key)``, one
    entry per key at or before its next close time (``_scheduled``)."""

    spec: Session

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._gap = self.spec.gap_ms
        self._scheduled: dict[Any, int] = {}

    def _next(self, state: dict[str, Any]) -> int | None:
        """When the key needs the timer next: the earliest close (``last + gap + grace + 1``:
        the watermark must exceed ``last + gap + grace``) or the expiry of its closed horizon."""
        reach = self._gap + self._grace + 1
        times = [last + reach for _, last, _ in state["open"]]
        if state["closed"] is not None:
            times.append(state["closed"][1] + self._gap + reach)
        return min(times) if times else None

    def _schedule(self, key: Any, when: int | None) -> None:
        if when is None:
            return
        have = self._scheduled.get(key)
        if have is None or when < have:
            self._scheduled[key] = when
            self._push(when, key)

    def restore(self) -> None:
        with self._lock:
            self._heap.clear()
            self._scheduled.clear()
            for key, state in self._store.items():
                self._schedule(key, self._next(state))
            self._arm()

    def _add(
        self,
        envelope: Envelope,
        key: Any,
        ts: int,
        watermark: int | float,
        collector: Collector,
        coordinator: Coordinator | None,
    ) -> bool:
        gap, grace, agg, store = self._gap, self._grace, self._agg, self._store
        state = store.get(key)
        if state is None:
            state = {"open": [], "closed": None}
        # closed: the horizon, and sessions due whose timer has not run yet
        closed = [c] if (c := state["closed"]) is not None else []
        closed += [[s, last] for s, last, _ in state["open"] if last + gap + grace < watermark]
        near = [c for c in closed if c[0] - gap <= ts <= c[1] + gap]
        if near or ts + gap + grace < watermark:
            return self._late(envelope, key, ts, near or [[ts, ts]], watermark, collector)
        joined = [s for s in state["open"] if s[0] - gap <= ts <= s[1] + gap]
        rest = [s for s in state["open"] if not s[0] - gap <= ts <= s[1] + gap]
        if joined:
            start, last, acc = min(ts, joined[0][0]), max(ts, *(s[1] for s in joined)), joined[0][2]
            for s in joined[1:]:
                acc = agg.merge(acc, s[2])
        else:
            start, last, acc = ts, ts, agg.initial()
        acc = agg.add(acc, envelope)
        session = [start, last, acc]
        state["open"] = sorted([*rest, session], key=lambda s: s[0])
        store.put(key, state)
        self._schedule(key, last + gap + grace + 1)
        self._arm()
        if self._updates:
            self._emit(WindowResult(key, start, last, agg.result(acc), False), collector, coordinator)
        return True

    def _close(self, watermark: int | float) -> list[WindowResult]:
        gap, grace, agg, store = self._gap, self._grace, self._agg, self._store
        keys = []
        for when, _, key in self._due(watermark):
            if self._scheduled.get(key) == when:
                del self._scheduled[key]
            keys.append(key)
        closed = []
        for key in dict.fromkeys(keys):
            state = store.get(key)
            if state is None:
                continue
            keep = []
            for start, last, acc in state["open"]:
                if last + gap + grace < watermark:
                    closed.append(WindowResult(key, start, last, agg.result(acc), True))
                    if state["closed"] is None or last > state["closed"][1]:
                        state["closed"] = [start, last]
                else:
                    keep.append([start, last, acc])
            state["open"] = keep
            if state["closed"] is not None and state["closed"][1] + 2 * gap + grace < watermark:
                state["closed"] = None  # no message that is not late can fall near it any more
            if not keep and state["closed"] is None:
                store.delete(key)
            else:
                store.put(key, state)
                self._schedule(key, self._next(state))
        return closed
