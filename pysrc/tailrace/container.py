"""The container: plans a job (tasks, partitions, readers, producers, checkpoints)
and hands it to an engine (the C run loop, or the pure-Python reference engine).

Both engines receive the same :class:`JobPlan` and must behave identically
(SEMANTICS.md); everything that is not the run loop itself lives here so there
is one way to do it.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .api import StreamTask, TaskContext, TimerService, check_task_class, hook, task_kind
from .clock import SYSTEM_CLOCK, Clock
from .collector import Collector
from .config import Config, StoreSpec, parse_config
from .engine.event_time import END as ET_END
from .engine.event_time import NONE as ET_NONE
from .engine.policy import ErrorPolicy, RunLog
from .engine.timers import EVENT_TIMERS_STORE, EventTimers
from .errors import ConfigError, InputError, TailraceError, TaskError
from .interfaces import (
    CheckpointStore,
    CommitOutputs,
    HandedRecords,
    HeldProducer,
    PartitionReader,
    Producer,
    StateChanges,
    StoreWrite,
    System,
    Write,
)
from .memory import MemoryCheckpointStore
from .metrics import ContainerMetrics, RunResult, TaskMetrics
from .stores import TaskStores
from .timestamps import timestamp_reader
from .types import Offset, SystemStreamPartition, parse_system_stream
from .windows import check_windows, declared_windows
from .windows import store_specs as window_store_specs

if TYPE_CHECKING:
    from .aio import AsyncioRunner, AsyncioTask

log = logging.getLogger("tailrace")

TaskFactory = Callable[[], Any]
EngineName = Literal["c", "python"]  # the keys of ENGINES

ENGINES: dict[str, str] = {
    "c": "tailrace.engine.native:NativeEngine",
    "python": "tailrace.engine.reference:ReferenceEngine",
}


class TaskPlan:
    """One task: its instance, its partitions (in a fixed order: the partition
    index used by engines), their readers and committed start offsets.

    TaskPlan and JobPlan are plain classes, not dataclasses: making a dataclass costs
    about a millisecond of CPU at import (it compiles its methods), which every run pays.
    """

    __slots__ = (
        "collector",
        "event_time_committed",
        "event_time_floor",
        "event_tracking",
        "held",
        "index",
        "kind",
        "name",
        "on_event_time",
        "partitions",
        "policy",
        "readers",
        "start_offsets",
        "stores",
        "task",
        "timestamps",
        "user_task",
        "windows",
    )

    def __init__(
        self,
        name: str,
        index: int,
        task: Any,
        kind: str,  # "sync" or "async" (an ``async def process`` task arrives wrapped: "async")
        partitions: list[SystemStreamPartition],
        readers: list[PartitionReader],
        start_offsets: dict[SystemStreamPartition, Offset],
        collector: Collector,
        stores: TaskStores | None = None,  # the task's key-value stores (rules 25-29)
        policy: ErrorPolicy | None = None,  # what a bad message does (rules 39, 40)
        held: dict[str, HeldProducer] | None = None,  # exactly-once: its producers, by system (rule 41)
    ) -> None:
        self.name = name
        self.index = index
        self.task = task
        self.kind = kind
        self.partitions = partitions
        self.readers = readers
        self.start_offsets = start_offsets
        self.collector = collector
        self.stores = stores
        self.policy = policy
        self.held = held
        # a tailrace._core.TimestampReader (task.timestamp.field or the task's timestamp
        # method), or None: the system's time or ingestion time (rule 32)
        self.timestamps: Any = None
        # with timestamps read (a field or a method): the event-time watermark committed
        # (rule 33), which a restart resumes from (the floor), or None
        self.event_time_floor: int | None = None
        self.event_time_committed: int | None = None
        # its watermark follows the messages handed to it, not those read ahead into its
        # input buffer (rules 33, 35, 38): a task whose timestamps are read (a field or a
        # method), or with windows or durable event-time timers (on_event_time)
        self.event_tracking = False
        self.on_event_time: Callable[..., Any] | None = None  # the user task's method (rule 38)
        # the user's task instance (``task`` may be the adapter of an ``async def`` task) and the
        # runtimes of the windows its class declares, bound in make_context (tailrace.windows)
        self.user_task: Any = task
        self.windows: list[Any] = []

    def __repr__(self) -> str:
        return f"TaskPlan({self.name!r}, {len(self.partitions)} partitions, {self.kind})"

    def event_timers(self) -> EventTimers:
        """The task's event-time timers (rule 38): durable ones, which run its
        ``on_event_time`` method, live in its store ``tailrace.event-timers``."""
        method = self.on_event_time
        store = self.stores.get(EVENT_TIMERS_STORE) if method is not None and self.stores else None
        return EventTimers(store, method)

    def make_context(
        self,
        config: Config,
        timers: TimerService,
        metrics: Callable[[], TaskMetrics],
        loop: Any = None,
        watermark: Callable[[], int] | None = None,
    ) -> TaskContext:
        """The task's context; binds the windows its class declares to it (before ``init``:
        an engine makes the context of a task with windows even when it has no ``init``)."""
        context = TaskContext(
            self.name, self.partitions, config, timers, metrics, loop, self.stores, watermark
        )
        if self.has_windows:
            from .windows import bind

            self.windows = bind(self.user_task, context)
        return context

    def windows_process(self, config: Config) -> Callable[..., Any] | None:
        """After ``make_context``: what stands in for the task's ``process`` when its class
        declares one window and no ``process`` of its own (a sync task): that window's
        ``add``, which the engine then calls directly; else None."""
        task = self.user_task
        if self.kind != "sync" or task is not self.task or type(task).process is not StreamTask.process:
            return None
        runtimes = self.windows
        if len(runtimes) != 1:
            return None
        compiled = getattr(runtimes[0], "_compiled", None)
        if compiled is not None and config.callback_timeout_ms <= 0:
            # the add is all of process, and no timeout can fail a message after it: no undo
            # journal needed (a failing add changes nothing)
            return compiled.process
        return runtimes[0].add

    @property
    def has_windows(self) -> bool:
        """The task's class declares windows (tailrace.windows): it needs its context bound."""
        from .windows import declared_windows

        return bool(declared_windows(type(self.user_task)))

    @property
    def late(self) -> int:
        """Late messages its windows saw in this run (rule 35; TaskMetrics.late)."""
        return sum(w.late for w in self.windows)

    def event_time_state(self, watermark: int | None) -> StateChanges | None:
        """What a commit writes of the task's event-time watermark (rule 33): its reserved
        store's entry, when its timestamps are read (task.timestamp.field or a timestamp
        method) or it has windows or durable event-time timers, and the watermark is finite
        and past what was committed; else None."""
        if watermark is None or not (self.timestamps is not None or self.event_tracking):
            return None
        if not ET_NONE < watermark < ET_END:
            return None
        committed = self.event_time_committed
        if committed is not None and watermark <= committed:
            return None
        return {EVENT_TIME_STORE: {_EVENT_TIME_KEY: str(watermark).encode()}}

    def state_dirty(self) -> bool:
        """True when the task's stores hold writes, or its producers outputs (exactly-once),
        that no commit has carried yet."""
        if self.stores is not None and self.stores.dirty():
            return True
        return self.held is not None and any(p.pending() for p in self.held.values())

    @property
    def exact(self) -> bool:
        """A commit of this task carries effects of its messages (state, held outputs): it may
        run only when they hold exactly the released prefix (rules 27, 41; the engines)."""
        return self.stores is not None or self.held is not None

    def take_held(self) -> list[Publication]:
        """Loop thread, at a commit's snapshot: the publications of the outputs held since the
        last one (exactly-once; none otherwise)."""
        if self.held is None:
            return []
        return [pub for p in self.held.values() if (pub := p.take()) is not None]

    def early_commit(self, request: Callable[[], None]) -> None:
        """The engine's way to make this task's commit fall due at once, called when a held
        producer is full (rule 41: an early commit)."""
        for p in (self.held or {}).values():
            p.on_full = request


Publication = Callable[[Write, CommitOutputs], None]


def write_commit(
    store: CheckpointStore,
    task_name: str,
    offsets: dict[SystemStreamPartition, Offset],
    state: StateChanges | None,
    publications: list[Publication],
) -> None:
    """A commit's atomic write of offsets and state, inside the publications of its held
    outputs (exactly-once, rule 41): each publication wraps the next and the innermost wraps
    the store's write, which gets what they collected (file lengths, Redis entries)."""

    def write(outputs: CommitOutputs) -> None:
        if outputs:
            store.write(task_name, offsets, state, outputs=outputs)
        elif state:
            store.write(task_name, offsets, state)
        elif offsets:
            store.write(task_name, offsets)

    def step(i: int) -> Write:
        if i == len(publications):
            return write
        return lambda outputs: publications[i](step(i + 1), outputs)

    step(0)(CommitOutputs())


def needs_event_tracking(task: object) -> bool:
    """True when ``task`` has event-time timers that survive restarts (an ``on_event_time``
    method) or declares windows: its watermark must follow the messages handed to it."""
    from .windows import declared_windows

    return hook(task, "on_event_time") is not None or bool(declared_windows(type(task)))


def reserved_stores(task: object) -> dict[str, StoreSpec]:
    """The stores the runtime keeps for ``task`` besides the job's: its durable event-time
    timers (an ``on_event_time`` method, rule 38)."""
    if hook(task, "on_event_time") is not None:
        return {EVENT_TIMERS_STORE: StoreSpec()}
    return {}


# The task state that holds its committed event-time watermark: a store name no job can
# declare (a user's store name has no dot), one entry.
EVENT_TIME_STORE = "tailrace.event-time"
_EVENT_TIME_KEY = b"watermark"


def committed_event_time(store: CheckpointStore, task_name: str) -> int | None:
    """The event-time watermark a task committed (rule 33), or None."""
    try:
        raw = store.state_get(task_name, EVENT_TIME_STORE, _EVENT_TIME_KEY)
    except NotImplementedError:
        return None
    return None if raw is None else int(raw)


def _event_time_committed(task: TaskPlan, written: StateChanges | None) -> None:
    """After a commit that wrote ``written`` durably: the task's committed watermark."""
    value = written[EVENT_TIME_STORE][_EVENT_TIME_KEY] if written else None
    if value is not None:
        task.event_time_committed = int(value)


def _merge_state(state: StateChanges | None, extra: StateChanges | None) -> StateChanges | None:
    if not extra:
        return state
    return {**state, **extra} if state else extra


class _Commit:
    """One task's commit handed to the writer: its offsets, the producers' syncs, its
    stores' snapshots and its held outputs' publications; ``done`` is set once it is written
    (or failed: ``error``)."""

    __slots__ = ("done", "error", "event_time", "offsets", "publications", "snapshots", "syncs", "task")

    def __init__(
        self,
        task: TaskPlan,
        offsets: dict[SystemStreamPartition, Offset],
        syncs: list[Callable[[], None]],
        snapshots: dict[str, dict[Any, Any]] | None,
        publications: list[Publication],
        event_time: StateChanges | None = None,
    ) -> None:
        self.task = task
        self.event_time = event_time
        self.offsets = offsets
        self.syncs = syncs
        self.snapshots = snapshots
        self.publications = publications
        self.done = threading.Event()
        self.error: BaseException | None = None


# The interpreter's switch interval (how long a thread that holds the GIL keeps it while
# another waits) while commit writers of stores that ask for a shorter one run
# (CheckpointStore.writer_switch_interval_s): the shortest asked, restored when the last of
# them closes (unless someone set another meanwhile). A Redis store writing exactly-once
# outputs asks 0.2 ms: each commit is a round trip, and after each the writer waited for
# the GIL up to CPython's default 5 ms behind a busy loop thread (bench/redis_bench.py).
_switch_lock = threading.Lock()
_switch_asked: list[float] = []
_switch_saved = 0.0  # the interval before the first ask
_switch_set: float | None = None  # the interval set for the asks (None: none set)


def _switch_interval_acquire(interval: float) -> None:
    global _switch_saved, _switch_set
    with _switch_lock:
        if not _switch_asked:
            _switch_saved, _switch_set = sys.getswitchinterval(), None
        _switch_asked.append(interval)
        want = min(_switch_asked)
        if want < sys.getswitchinterval():
            sys.setswitchinterval(want)
            _switch_set = sys.getswitchinterval()


def _switch_interval_release(interval: float) -> None:
    with _switch_lock:
        _switch_asked.remove(interval)
        if not _switch_asked and _switch_set is not None and sys.getswitchinterval() == _switch_set:
            sys.setswitchinterval(_switch_saved)


# Commits of a task without stores that may be in flight at once: the loop goes on while the
# writer makes the earlier ones durable (exactly-once outputs commit every few thousand
# records, and each commit's write is a round trip that holds its store). The writer writes
# them in order, and none after one that failed.
_MAX_IN_FLIGHT = 4


class CommitWriter:
    """Writes a job's commits on a thread of its own, so that the loop goes on processing
    while a commit is made durable (issue 34; rules 13, 26, 27 unchanged).

    At a commit the loop thread only takes its snapshot: the producers write their
    buffers (``Producer.flush_begin``), each store swaps its dict of changes for an empty
    one (O(1)), and the offsets are the low watermarks of the moment. This thread then,
    in commit order: makes the outputs durable (fsync), encodes the state (letting the GIL
    go every few hundred keys), and writes offsets and state in one atomic ``write``. A
    task's next commit waits for its previous one (``JobPlan.commit``), so a task has at
    most one commit in flight and its checkpoints are written in order; a crash leaves the
    previous or the new checkpoint whole, as before. A failed write puts the state back
    to dirty (the next commit carries it), records the error for the task's next commit
    and the drain, and tells the engine at once (``on_error``: the C loop stops on it).

    With a store that ``groups_writes`` (Redis under exactly-once outputs), the commits
    queued behind a write go to the store together (``write_many``: one round trip), at most
    one of each task and up to ``_GROUP_MAX``; each is written or fails on its own.
    """

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._queue: deque[_Commit] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self.on_error: Callable[[BaseException], None] | None = None
        # figures (bench/commit_pause.py): the writer's own time and the state keys it wrote
        # (seconds, keys: its flush rate)
        self.busy = 0.0
        self.keys = 0
        self._failed: dict[str, BaseException] = {}  # task name -> its first failed commit's error
        self._switch = store.writer_switch_interval_s  # held (_switch_interval_acquire) until close
        if self._switch is not None:
            _switch_interval_acquire(self._switch)
        self._thread = threading.Thread(target=self._run, name="tailrace-commit-writer", daemon=True)
        self._thread.start()

    def submit(self, commit: _Commit) -> None:
        with self._cond:
            self._queue.append(commit)
            self._cond.notify()

    def forget_failure(self, task: str) -> None:
        """The loop thread learnt of the task's failed commit, and every commit of the task
        submitted before it is done: the task's next commit is written again."""
        with self._cond:
            self._failed.pop(task, None)

    def close(self) -> None:
        """Write what is queued, then stop the thread (idempotent)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            switch, self._switch = self._switch, None
        if self._thread is not threading.current_thread():
            self._thread.join()
        if switch is not None:
            _switch_interval_release(switch)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                group = self._take_group()
            if len(group) == 1:
                self._write_one(group[0])
            else:
                self._write_group(group)

    def _take_group(self) -> list[_Commit]:
        """The next commit, and with a store that ``groups_writes`` the commits queued after
        it that may be written in the same call: of other tasks (a task's commits are written
        one after the other), made only of ``HandedRecords`` publications (condition held)."""
        queue = self._queue
        first = queue.popleft()
        if not self._store.groups_writes or not _groupable(first):
            return [first]
        group, tasks = [first], {first.task.name}
        while queue and len(group) < _GROUP_MAX:
            commit = queue[0]
            if commit.task.name in tasks or not _groupable(commit):
                break
            group.append(queue.popleft())
            tasks.add(commit.task.name)
        return group

    def _write_one(self, commit: _Commit) -> None:
        try:
            failed = self._failed.get(commit.task.name)
            if failed is not None:
                raise failed  # a later commit of a task whose earlier one failed: unwritten
            self._write(commit)
        except BaseException as e:  # noqa: BLE001 - recorded for the loop thread
            self._fail(commit, e)
        finally:
            commit.done.set()

    def _fail(self, commit: _Commit, error: BaseException) -> None:
        self._failed.setdefault(commit.task.name, error)
        commit.error = error
        on_error = self.on_error
        if on_error is not None:
            try:
                on_error(error)
            except Exception:
                log.exception("commit writer: cannot report %r", error)

    def _write(self, commit: _Commit) -> None:
        task = commit.task
        stores = task.stores
        ok = False
        started = time.perf_counter()
        try:
            state = self._state(commit)
            write_commit(self._store, task.name, commit.offsets, state, commit.publications)
            ok = True
            self._written(commit, state)
            self.busy += time.perf_counter() - started
        except TailraceError:
            raise
        except Exception as e:
            raise TaskError(task.name, original=e, phase="commit") from e
        finally:
            if stores:
                stores.end_commit(ok)

    def _state(self, commit: _Commit) -> StateChanges | None:
        """The commit's producers synced (their outputs durable first), then its state
        changes encoded, with its event-time state."""
        for sync in commit.syncs:
            sync()
        stores = commit.task.stores
        state = (
            stores.encode(commit.snapshots, yield_gil=True, rows=self._store.takes_rows)
            if stores and commit.snapshots
            else None
        )
        return _merge_state(state, commit.event_time)

    def _written(self, commit: _Commit, state: StateChanges | None) -> None:
        _event_time_committed(commit.task, commit.event_time)
        self.keys += sum(map(len, state.values())) if state else 0

    def _write_group(self, group: list[_Commit]) -> None:
        """Several tasks' commits in one ``write_many`` (see ``_take_group``): each is synced
        and encoded as ``_write`` does, then written, failing or passing on its own."""
        started = time.perf_counter()
        ready: list[tuple[_Commit, StateChanges | None]] = []
        writes: list[StoreWrite] = []
        for commit in group:
            failed = self._failed.get(commit.task.name)
            if failed is not None:  # a later commit of a task whose earlier one failed: unwritten
                self._finish(commit, failed)
                continue
            try:
                state = self._state(commit)
            except BaseException as e:  # noqa: BLE001 - recorded for the loop thread
                self._finish(commit, _commit_error(commit.task.name, e))
                continue
            outputs = CommitOutputs()
            for publication in commit.publications:
                assert isinstance(publication, HandedRecords)  # (_groupable)
                outputs.records.append(publication.records)
            if commit.offsets or state or outputs:
                ready.append((commit, state))
                writes.append((commit.task.name, commit.offsets, state, outputs))
            else:
                self._finish(commit, None, state)
        if writes:
            self._write_many(ready, writes)
        self.busy += time.perf_counter() - started

    def _write_many(self, ready: list[tuple[_Commit, StateChanges | None]], writes: list[StoreWrite]) -> None:
        """The store's ``write_many`` of the group's ready commits; each finished with its result."""
        try:
            errors = self._store.write_many(writes)
        except BaseException as e:  # noqa: BLE001 - every commit of the call failed
            errors = [e] * len(writes)
        for (commit, state), error in zip(ready, errors):
            self._finish(commit, None if error is None else _commit_error(commit.task.name, error), state)

    def _finish(
        self,
        commit: _Commit,
        error: BaseException | None,
        state: StateChanges | None = None,
    ) -> None:
        """A grouped commit written (``error`` None) or failed: its stores told, its waiter woken."""
        stores = commit.task.stores
        try:
            if error is None:
                self._written(commit, state)
            else:
                self._fail(commit, error)
        finally:
            if stores:
                stores.end_commit(error is None)
            commit.done.set()


def _commit_error(task_name: str, error: BaseException) -> BaseException:
    """A commit's failure as its waiter raises it: an error of tailrace's own (or a
    BaseException such as KeyboardInterrupt) as it is, anything else as a TaskError naming
    the task (as ``CommitWriter._write`` raises it)."""
    if isinstance(error, TailraceError) or not isinstance(error, Exception):
        return error
    wrapped = TaskError(task_name, original=error, phase="commit")
    wrapped.__cause__ = error
    return wrapped


def _groupable(commit: _Commit) -> bool:
    return all(isinstance(p, HandedRecords) for p in commit.publications)


# Commits the writer hands a store that ``groups_writes`` in one call, at most: Redis runs
# the call's MULTI/EXEC as one step, blocking its other clients (readers, heartbeats, other
# containers) meanwhile; four commits of 2,000 held entries are about 6 ms of it. Four and
# sixteen measured alike on bench/redis_bench.py.
_GROUP_MAX = 4


class JobPlan:
    """What an engine runs: the tasks, the checkpoint store, the producers and systems."""

    __slots__ = (
        "_commit_lock",
        "_in_flight",
        "asyncio_runner",
        "clock",
        "config",
        "producers",
        "store",
        "systems",
        "tasks",
        "writer",
    )

    def __init__(
        self,
        config: Config,
        tasks: list[TaskPlan],
        store: CheckpointStore,
        producers: dict[str, Producer],
        systems: dict[str, System] | None = None,
        asyncio_runner: AsyncioRunner | None = None,  # the event loop of ``async def`` tasks, if any
        clock: Clock = SYSTEM_CLOCK,  # every deadline of the run (tailrace.testing passes a ManualClock)
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.store = store
        self.producers = producers
        self.systems = {} if systems is None else systems
        self.asyncio_runner = asyncio_runner
        self.clock = clock
        self._commit_lock = threading.Lock()
        # commits off the loop thread where the store waits on a disk; in the loop on virtual
        # time (a test driver's clock: a commit is written when the test's step returns)
        self.writer = CommitWriter(store) if store.background_writes and not clock.manual else None
        # task name -> its commits the writer holds, oldest first (at most one for a task with
        # stores: a store has one snapshot in flight; see _MAX_IN_FLIGHT)
        self._in_flight: dict[str, deque[_Commit]] = {}

    def __repr__(self) -> str:
        return f"JobPlan({self.config.job_name!r}, {len(self.tasks)} tasks)"

    def commit(
        self,
        task: TaskPlan,
        offsets: Mapping[SystemStreamPartition, Offset],
        event_time: int | None = None,
    ) -> None:
        """Flush every producer (output covering the commit is durable first), then
        write the task's checkpoint and its store changes in one atomic write (rules
        9, 13, 26). On success the stores' written entries turn clean; on failure they
        stay dirty for the next commit. Raises on failure.

        With a commit writer (``CommitWriter``), this takes the commit's snapshot and
        hands it over: the write is durable later, before the task's next commit begins
        and before ``drain`` returns; a failure of an earlier commit of the task raises
        here.

        ``event_time``: the task's event-time watermark, committed with the offsets in its
        reserved state (rule 33; TaskPlan.event_time_state)."""
        writer = self.writer
        extra = task.event_time_state(event_time)
        if writer is None:
            self._commit_now(task, offsets, extra)
            return
        with self._commit_lock:
            stores = task.stores
            self._settle(task, 1 if stores else _MAX_IN_FLIGHT)
            syncs = [sync for p in self.producers.values() if (sync := p.flush_begin()) is not None]
            snapshots = stores.snapshot() if stores else None
            commit = _Commit(task, dict(offsets), syncs, snapshots, task.take_held(), extra)
            self._in_flight.setdefault(task.name, deque()).append(commit)
            writer.submit(commit)

    def _settle(self, task: TaskPlan, room: int = 1) -> None:
        """Settle the task's commits in flight, oldest first, until fewer than ``room`` are
        left (1: all of them): wait for each, tell its readers what is committed, raise its
        error (commit lock held). Those already written are settled without waiting."""
        flight = self._in_flight.get(task.name)
        while flight:
            commit = flight[0]
            if len(flight) < room and not commit.done.is_set():
                return
            commit.done.wait()
            flight.popleft()
            if commit.error is not None:
                # the writer fails the later ones unwritten; once they are, the task's next
                # commit (its state back to dirty) may be written again
                for later in flight:
                    later.done.wait()
                flight.clear()
                if self.writer is not None:
                    self.writer.forget_failure(task.name)
                raise commit.error
            for ssp, reader in zip(task.partitions, task.readers):
                if ssp in commit.offsets:
                    reader.committed(commit.offsets[ssp])

    def drain(self) -> None:
        """Wait until every commit handed to the writer is durable; raise the first failure
        (loop thread, at the end of a run). A no-op without a commit writer."""
        if self.writer is None:
            return
        first: BaseException | None = None
        with self._commit_lock:
            for task in self.tasks:
                try:
                    self._settle(task)
                except BaseException as e:  # noqa: BLE001 - the first error wins
                    first = first or e
        if first is not None:
            raise first

    def _commit_now(
        self, task: TaskPlan, offsets: Mapping[SystemStreamPartition, Offset], extra: StateChanges | None
    ) -> None:
        with self._commit_lock:
            for producer in self.producers.values():
                producer.flush()
            stores = task.stores
            publications = task.take_held()
            if not stores:
                write_commit(self.store, task.name, dict(offsets), extra, publications)
            else:
                ok = False
                try:
                    state = _merge_state(stores.begin_commit(), extra)
                    write_commit(self.store, task.name, dict(offsets), state, publications)
                    ok = True
                finally:
                    stores.end_commit(ok)
            _event_time_committed(task, extra)
            for ssp, reader in zip(task.partitions, task.readers):
                if ssp in offsets:
                    reader.committed(offsets[ssp])

    def close(self) -> None:
        """Close readers, producers, systems and the store (idempotent, best effort); the
        commit writer first writes what it holds."""
        if self.writer is not None:
            _quietly(self.writer.close)
        if self.asyncio_runner is not None:
            _quietly(self.asyncio_runner.close)
        for t in self.tasks:
            for r in t.readers:
                _quietly(r.close)
        for p in self.producers.values():
            _quietly(p.close)
        for s in self.systems.values():
            _quietly(s.close)
        _quietly(self.store.close)


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        log.exception("error while closing %r", fn)


class Engine(Protocol):
    """What an engine provides. ``stop`` and ``metrics`` are safe from any thread
    (``stop`` also from a signal handler)."""

    def run(self) -> RunResult: ...

    def stop(self) -> None: ...

    def metrics(self) -> tuple[dict[str, TaskMetrics], ContainerMetrics]: ...


def load_engine(name: str) -> Callable[[JobPlan], Engine]:
    """The engine class registered as ``name`` ("c" or "python")."""
    target = ENGINES.get(name)
    if target is None:
        raise ConfigError(f"unknown engine {name!r}", key="engine", allowed=", ".join(ENGINES))
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


InputSpec = str | SystemStreamPartition
_WARNED: set[str] = set()  # start-up warnings already logged by this process


def check_task_factory(task: object) -> None:
    """TypeError naming what was given unless ``task`` can make tasks (a class, or a
    factory called once per task): an instance would fail later as "object is not callable"."""
    if callable(task):
        return
    name = type(task).__qualname__
    if callable(getattr(task, "process", None)) or callable(getattr(task, "process_async", None)):
        got = (
            f"an instance of {name}: pass the class {name} itself (the container makes one instance per task)"
        )
    else:
        text = repr(task)
        got = f"{text if len(text) <= 80 else text[:77] + '...'} ({name})"
    raise TypeError(f"expected a task class (or a factory returning a task), got {got}")


class Container:
    """Runs a task class (or factory) over inputs; one run loop, many tasks.

    ``task``: the task class, or a factory called once per task that returns its
    instance (an instance is a TypeError: the container makes one per task).
    ``inputs``: ``"system.stream"`` names (every partition) or explicit
    SystemStreamPartitions. Tasks are grouped by partition number (Samza's
    GroupByPartition): task "Partition N" owns partition N of every input.
    ``systems``: the systems inputs and outputs name, a list (each system under its own
    name: two of one name are a ConfigError) or a mapping name -> system.
    ``config``: Samza keys (or snake_case keywords). ``checkpoints``: a
    CheckpointStore (default: in memory). ``engine``: "c" (default) or "python".
    ``default_output_system``: the system of a bare stream name in ``collector.send``
    (``"out"`` for ``"NAME.out"``; one of ``systems``, else ConfigError; the job file's
    ``[job] default_output``).
    ``stores``: key-value stores of every task (rules 25-29), ``{NAME: {option:
    value}}`` with the options of ``stores.NAME.*`` (``{}`` for the defaults) or a
    list of names; tasks get them with ``context.store(NAME)`` in ``init``.
    ``clock``: where every deadline of the run is read (default real time; tests pass a
    :class:`~tailrace.clock.ManualClock` through :mod:`tailrace.testing`).

    ``run()`` blocks until end of stream, shutdown or error, and returns a
    RunResult; an error raises TaskError (or another TailraceError) after the
    container stopped. ``stop()`` is safe from any thread and signal handlers.
    """

    def __init__(
        self,
        task: type | TaskFactory,
        *,
        inputs: Sequence[InputSpec],
        systems: Sequence[System] | Mapping[str, System],
        config: Mapping[str, Any] | Config | None = None,
        checkpoints: CheckpointStore | None = None,
        engine: EngineName = "c",
        default_output_system: str | None = None,
        stores: Mapping[str, Mapping[str, Any] | None] | Sequence[str] | None = None,
        clock: Clock | None = None,
        **config_kwargs: Any,
    ) -> None:
        check_task_factory(task)
        if stores is not None:
            config_kwargs["stores"] = stores
        self._clock = clock if clock is not None else SYSTEM_CLOCK
        self.config = parse_config(config, **config_kwargs)
        self._engine_cls = load_engine(engine)
        self.engine_name = engine
        if isinstance(systems, Mapping):
            self.systems = dict(systems)
        else:
            self.systems = {}
            for s in systems:
                first = self.systems.get(s.name)
                if first is s:
                    raise ConfigError(f"system {s.name!r} is listed twice", key="systems")
                if first is not None:
                    # the second would replace the first without a word (a job file's systems
                    # are a table, keyed by name: no duplicate gets this far)
                    raise ConfigError(
                        f"two systems are named {s.name!r} ({type(first).__name__} and "
                        f"{type(s).__name__}): give each a name of its own",
                        key="systems",
                    )
                self.systems[s.name] = s
        if isinstance(inputs, (str, bytes)):
            raise ConfigError(
                f"expected a list of 'system.stream' names or SystemStreamPartitions, got {inputs!r} "
                f"(one input is [{inputs!r}])",
                key="inputs",
            )
        if not inputs:
            raise ConfigError("a container needs at least one input", key="inputs")
        self._inputs = list(inputs)
        self._factory = task
        self._store = checkpoints if checkpoints is not None else MemoryCheckpointStore()
        if default_output_system is not None and default_output_system not in self.systems:
            raise ConfigError(
                f"default_output_system names unknown system {default_output_system!r}",
                key="default_output_system",
                allowed=", ".join(sorted(self.systems)),
            )
        self._default_output_system = default_output_system
        self._engine: Engine | None = None
        self._plan: JobPlan | None = None
        self._stop_requested = False
        self._lock = threading.Lock()

    # -- planning -------------------------------------------------------------
    def _input_partitions(self) -> list[SystemStreamPartition]:
        ssps: list[SystemStreamPartition] = []
        for spec in self._inputs:
            if isinstance(spec, SystemStreamPartition):
                if spec.system not in self.systems:
                    raise ConfigError(f"input {spec} names unknown system {spec.system!r}", key="inputs")
                ssps.append(spec)
                continue
            try:
                ss = parse_system_stream(spec)
            except ValueError as e:
                raise ConfigError(str(e), key="inputs") from None
            system = self.systems.get(ss.system)
            if system is None:
                raise ConfigError(
                    f"input {spec!r} names unknown system {ss.system!r}",
                    key="inputs",
                    allowed=", ".join(sorted(self.systems)) or "no systems defined",
                )
            n = system.partitions(ss.stream)
            if n < 1:
                # the C engine would refuse a task over nothing, the Python one read nothing: refused
                # here for both, before anything starts
                raise InputError(
                    "input stream has no partitions (a job reads at least one partition of each input)",
                    source=f"{ss.system}.{ss.stream}",
                )
            ssps.extend(SystemStreamPartition(ss.system, ss.stream, p) for p in range(n))
        if len(set(ssps)) != len(ssps):
            raise ConfigError("an input partition is listed twice", key="inputs")
        return ssps

    def plan(self) -> JobPlan:
        """Resolve inputs, group partitions into tasks, open the store, make readers."""
        ssps = self._input_partitions()
        by_partition: dict[int, list[SystemStreamPartition]] = {}
        for ssp in ssps:
            by_partition.setdefault(ssp.partition, []).append(ssp)
        specs = self.config.stores
        self._check_state(specs, "stores")
        if self.config.error_policy == "dead-letter":
            system = self.config.error_stream.partition(".")[0]
            if system not in self.systems:
                raise ConfigError(
                    f"no system {system!r} for the dead letters of {self.config.error_stream!r}",
                    key="task.error.stream",
                    allowed=", ".join(f"{name}.STREAM" for name in sorted(self.systems)) or "(no systems)",
                )
        producers = {name: s.producer() for name, s in self.systems.items()}
        self._store.open(self.config.job_name)
        tasks: list[TaskPlan] = []
        runner: AsyncioRunner | None = None
        run_log = RunLog()
        try:
            for index, pnum in enumerate(sorted(by_partition)):
                name = f"Partition {pnum}"
                instance = user_task = self._factory()
                adapter: AsyncioTask | None = None
                if type(instance).__name__ == "AsyncioTask" and type(instance).__module__ == "tailrace.aio":
                    # adapted by its maker already (tailrace.testing runs async def tasks on
                    # a loop of its virtual clock): the user's task is inside
                    adapter = instance
                    user_task = instance.task
                if index == 0:
                    self._check_task(instance)
                    windows = self._check_windows(type(user_task))
                else:
                    windows = declared_windows(type(user_task))
                try:
                    kind = task_kind(instance)
                except TypeError as e:
                    raise ConfigError(str(e), key="job.task") from None
                if kind == "asyncio":
                    # async def process: run on the container's asyncio loop behind
                    # the callback interface every engine already runs
                    from .aio import AsyncioRunner, AsyncioTask  # asyncio: only when a task needs it

                    runner = runner or AsyncioRunner()
                    instance = adapter = AsyncioTask(instance, runner, self.config)
                    kind = "async"
                stamper = timestamp_reader(self.config, name, user_task)
                parts = sorted(by_partition[pnum])
                committed = self._store.load(name)
                readers = [self.systems[s.system].reader(s) for s in parts]
                start = {s: committed[s] for s in parts if s in committed}
                held = self._hold(name, producers) if self.config.exactly_once else None
                collector = Collector(held if held is not None else producers, self._default_output_system)
                reserved = reserved_stores(user_task)
                if reserved:
                    self._check_state([f"durable event-time timers ({', '.join(reserved)})"], "on_event_time")
                task_specs = (
                    {**specs, **window_store_specs(windows), **reserved} if windows or reserved else specs
                )
                stores = TaskStores(name, task_specs, self._store) if task_specs else None
                policy = ErrorPolicy(self.config, name, collector, dict(zip(parts, readers)), run_log)
                if adapter is not None:
                    adapter.policy = policy  # an async def task counts its own retries
                plan = TaskPlan(
                    name, index, instance, kind, parts, readers, start, collector, stores, policy, held
                )
                plan.timestamps = stamper
                plan.event_tracking = stamper is not None or needs_event_tracking(user_task)
                plan.on_event_time = hook(user_task, "on_event_time")
                if adapter is not None and plan.on_event_time is not None:
                    from .aio import sync_hook  # an async def on_event_time runs on the task's loop

                    plan.on_event_time = sync_hook(adapter.runner, plan.on_event_time)
                plan.user_task = user_task
                if plan.event_tracking:  # rule 33: resume from the committed watermark
                    floor = committed_event_time(self._store, name)
                    plan.event_time_floor = plan.event_time_committed = floor
                tasks.append(plan)
        except Exception:
            self._store.close()
            if runner is not None:
                runner.close()
            raise
        return JobPlan(self.config, tasks, self._store, producers, dict(self.systems), runner, self._clock)

    def _check_state(self, names: Any, what: str) -> None:
        """A checkpoint store that keeps no state is refused for ``names`` (stores, windows)."""
        if names and type(self._store).state_get is CheckpointStore.state_get:
            raise ConfigError(
                f"checkpoint store {type(self._store).__name__} keeps no state; {what} "
                f"({', '.join(sorted(names))}) need one that does",
                key="checkpoints",
                allowed="sqlite, memory, redis",
            )

    def _check_windows(self, cls: type) -> dict[str, Any]:
        """Start-up checks of the windows ``cls`` declares (tailrace.windows): each is sound,
        and their state can be committed with the offsets (rules 26, 27, 36)."""
        windows = check_windows(cls)
        if windows:
            self._check_state([f"window {w.where}" for w in windows.values()], "windows")
            if self.config.async_commit:
                raise ConfigError(
                    f"task.async.commit=true cannot be combined with windows ({', '.join(windows)}): "
                    "their state is a store, whose commit must not include the effect of a message "
                    "above the low watermark",
                    key="task.async.commit",
                    allowed="false while the task declares windows",
                )
        return windows

    def _hold(self, task_name: str, producers: dict[str, Producer]) -> dict[str, HeldProducer]:
        """Task ``task_name``'s producers under exactly-once outputs (rule 41): every system of
        the job must give the guarantee with this checkpoint store, or the job is refused here,
        at start-up, naming the system."""
        held: dict[str, HeldProducer] = {}
        for name, producer in producers.items():
            try:
                held[name] = producer.hold(task_name, self._store)
            except NotImplementedError:
                raise ConfigError(
                    f"system {name!r} ({type(self.systems[name]).__name__}) cannot give exactly-once "
                    "outputs: its outputs cannot be held until the commit and published with it",
                    key="task.output.guarantee",
                    allowed="at-least-once with this system (exactly-once: files, memory, redis)",
                ) from None
        return held

    def _check_task(self, instance: Any) -> None:
        """Start-up checks of the task class (misspelled hooks, a window that never runs);
        each warning once per process (a Redis member plans a container per rebalance)."""
        for warning in check_task_class(type(instance), self.config.window_ms):
            if warning not in _WARNED:
                _WARNED.add(warning)
                log.warning("%s", warning)

    # -- running --------------------------------------------------------------
    def run(self) -> RunResult:
        """Run until end of stream, shutdown or error (see class docstring)."""
        plan = self.plan()
        self._plan = plan
        try:
            engine = self._engine_cls(plan)
            with self._lock:
                self._engine = engine
                stop_now = self._stop_requested
            if stop_now:
                engine.stop()
            return engine.run()
        finally:
            plan.close()

    def stop(self) -> None:
        """Request a graceful stop (rule 19). Safe from any thread and signal handlers."""
        self._stop_requested = True
        engine = self._engine
        if engine is not None:
            engine.stop()

    def metrics(self) -> tuple[dict[str, TaskMetrics], ContainerMetrics] | None:
        """A live snapshot while running (None before the engine starts)."""
        engine = self._engine
        return None if engine is None else engine.metrics()

    def skipped(self) -> dict[SystemStreamPartition, int]:
        """Bad input skipped so far per partition (``PartitionReader.skipped()``; empty before planning)."""
        plan = self._plan
        if plan is None:
            return {}
        return {ssp: r.skipped() for t in plan.tasks for ssp, r in zip(t.partitions, t.readers)}


__all__ = ["Container", "Engine", "InputError", "JobPlan", "TaskPlan", "load_engine"]
