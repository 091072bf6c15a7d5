"""The pure-Python reference engine: Samza's asynchronous run loop, written to be read.

One loop thread (the thread calling :meth:`ReferenceEngine.run`) owns every
piece of run-loop state. Other threads (callbacks, pool workers, reader
wakeups, ``stop()``) only append to ``_events`` or set a flag under one
condition variable, which wakes the loop. Each loop iteration does, in order:

1. apply arrived completions (``_apply_events``) and callback deadlines;
2. release completions in sequence order (``_release``, rules 12, 15);
3. decide whether to stop (``_check_stop``: votes, shutdown ALL, end of
   stream, ``stop()``);
4. fill input buffers (``_poll_inputs``, rule 6);
5. run due barriers: commit, window, timers (``_run_barriers``, rules 8-10, 23);
6. finish tasks at end of stream (``_end_of_stream``, rule 11);
7. hand envelopes to tasks, round robin (``_dispatch``, rules 1-5);
8. block until something happens when nothing progressed (``_wait``, rule 7).

Decisions where SEMANTICS.md leaves room (the C engine makes the same ones):

- *Outstanding* (rule 2, metric ``outstanding``) means invoked and not yet
  released, as the C sequencer counts it: a completion held behind a gap still
  occupies a concurrency slot, so held completions are bounded by
  ``task.max.concurrency``.
- Barriers wait for *unresolved* callbacks (invoked, no completion arrived).
  A commit (without ``task.async.commit``) runs once every invoked callback has
  resolved; release has then stopped right after the completion carrying the
  commit request (rule 15), so the commit covers exactly that prefix and the
  held tail is released right after it. Window and timers need nothing
  outstanding at all (everything released).
- A commit writes the low watermark of every partition of the task that has
  one, and only when some partition's watermark moved past its committed
  offset; a commit with nothing new writes nothing (no store write, metric
  ``commits`` unchanged). ``commits`` counts checkpoint writes. A task with state
  stores also commits when they hold uncommitted writes, and only with nothing
  unreleased (docs/state.md).
- A task's due window and timers run in the order they fell due (a window and a
  timer due at one instant: the window first), and before its end of stream. One
  barrier runs every timer of the task due at once; a window or timers that make a
  stop due (shutdown ALL, the last vote) end them: no window or timer of any task
  runs after that.
- Requests from window, timers and ``end_of_stream`` take effect at once
  (nothing is outstanding then). A commit requested by ``end_of_stream`` runs
  right after the hook, before the task is done.
- A task that reached end of stream counts as having voted for shutdown
  (CURRENT_TASK); otherwise one finished task would keep a voted container alive.
- Stopping is decided right after releases and again after barriers, before
  end of stream and dispatch: a shutdown request released together with the
  last message wins (reason "shutdown", the ``end_of_stream`` hook does not run),
  and nothing is dispatched once a stop is due.
- Commit ALL marks every task for a commit at its own next barrier; only the
  requesting task's release stops at the request (rule 15).
- Shutdown (votes, shutdown ALL, end of stream, ``stop()``) drains: no new
  dispatch, window, timer or end-of-stream hook; outstanding callbacks are
  awaited up to ``task.shutdown.ms`` while releases and requested commits go on;
  then a final commit and ``close()`` on every task.
- A failure stops the loop as soon as it is seen (outstanding callbacks of other
  tasks are not awaited); the engine then commits each task's low watermark,
  which never passes the failed message (rule 18), closes the tasks and raises.
- Runs (the C loop's RUN op): a sync task without key ordering, in an engine
  with no pool and no callback timeout, and with nothing outstanding, gets up to
  ``_RUN_MAX`` buffered messages in a row from one Python loop (``_run``), each
  completed and released before the next starts, with no callback object, lock
  or event per message. A run ends before a message once a barrier is due, a
  stop is asked or a timer is set, and right after a message that failed or made
  a coordinator request; the loop then goes on as after any dispatch. The task's
  counters move when the run ends (as the C loop's).
- ``window``, timers, ``end_of_stream`` and commits run on the loop thread; only
  sync ``process`` goes to the pool. A task is pinned to one pool thread
  (partition-to-thread affinity, as the C loop), so its calls run one at a time
  in invocation order (rules 1, 21); different tasks run in parallel. Above max
  concurrency 1 the loop hands its thread up to that many messages ahead.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .._core import (
    COMMIT_ALL,
    COMMIT_CURRENT,
    SHUTDOWN_ALL,
    SHUTDOWN_CURRENT,
    Coordinator,
    Envelope,
    stamp_envelopes,
    wall_ms,
)
from ..api import hook
from ..clock import Clock
from ..container import JobPlan, TaskPlan
from ..errors import CallbackError, CallbackTimeoutError, TailraceError, TaskError
from ..metrics import ContainerMetrics, RunResult, TaskMetrics, partition_lag
from ..ordering import key_error, key_identity
from ..stores import Journal, journal_bind, journal_undo
from ..types import BadInput, Offset, SystemStreamPartition
from .event_time import END, NONE, EventTime, watermark_lag_ms, watermark_value
from .failures import FurtherErrors
from .policy import FAIL, IGNORED
from .timers import EventTimers, TimerHeap, before_window, check_event_time, early_commit
from .watchdog import StuckCallWatch

log = logging.getLogger("tailrace.engine.reference")
_POOL_EXIT_GRACE_S = 0.05  # idle pool threads exit at once; only a stuck one takes longer
_POOL_IDLE_EXIT_S = 2.0  # more for threads not inside process (a pool of 1024 takes ~0.1 s to exit)

_COMMIT = COMMIT_CURRENT | COMMIT_ALL
# messages of one task in a row (ReferenceEngine._run), a task's turn (rule 5): the C
# loop's TR_RUN_MAX, so that both engines share time between tasks alike (256 cost ~2.5%
# fewer instructions per message on bench/e2e.py's job, but let one task run four times
# longer than the C loop lets it before another's turn)
_RUN_MAX = 64
# a partition of a task served by runs is refilled to this many messages, not to the whole
# input buffer: decoded messages then wait briefly enough to be processed while still in the
# CPU cache (on bench/e2e.py's file job, 4 tasks, buffers of 1024 cost ~20% more CPU than 256)
_RUN_FILL = 256
# seconds after which a run ends, keeping the rest of its turn (as the C loop's RUN_SLICE_NS)
_RUN_SLICE_S = 0.1
# passes of barrier work one loop iteration runs back to back (_run_barriers)
_BARRIER_ROUNDS = 64


def _after(now: float, seconds: float) -> float:
    """``now + seconds`` on the whole-nanosecond grid the clocks count in (tailrace.clock,
    as the C loop): a deadline summed in float seconds can land an ulp past the clock's
    reading at that very nanosecond (0.1 + 0.2 > 0.3), and a virtual clock stepped exactly
    to it would then never reach it."""
    return round((now + seconds) * 1e9) / 1e9


def _rearm(when: float, period: float, now: float) -> float:
    """The next firing of a periodic timer that fell due at ``when`` and fired at ``now``:
    on its grid (Samza's fixed rate, as the C loop), or a period after ``now`` when a whole
    period or more was missed (the missed firings coalesce into the one that fired)."""
    after = _after(when, period)
    return after if after > now else _after(now, period)


def _taken_ahead(t: _Task) -> bool:
    """A keyed task has invoked a message while an earlier one of its partition is still
    buffered: its state then holds an effect past the low watermark, so no commit with
    stores may write it (rules 27, 30). Walks at most the input buffers (rule 31)."""
    for p in t.parts:
        gap = False
        for entry in p.order:
            if entry[1] == 0:
                gap = True
            elif gap:
                return True
    return False


class _Callback:
    """Completion handle of one invocation; safe from any thread (rules 17, 22)."""

    __slots__ = (
        "_done",
        "_engine",
        "abandoned",
        "bad",
        "coordinator",
        "deadline",
        "entry",
        "env",
        "handed_back",
        "ignored",
        "key",
        "late_after",
        "offset",
        "part",
        "raised",
        "requests",
        "seq",
        "started",
        "task",
    )

    def __init__(
        self, engine: ReferenceEngine, task: _Task, seq: int, part: _Partition, offset: Offset
    ) -> None:
        self._engine = engine
        self._done = False  # guarded by engine._cv
        self.task = task
        self.seq = seq
        self.part = part
        self.offset = offset
        self.coordinator: Coordinator | None = None  # async: requests read on completion
        self.requests = 0  # sync: requests harvested after process returned
        self.ignored = False
        self.env: Envelope | None = None  # async with task.error.policy: for its failure
        self.bad = False  # its input could not be read (BadInput): its failure is the input's error
        # process_async raised and task.error.policy completed it: a later resolution is dropped
        self.abandoned = False
        self.handed_back = False  # failed, its writes undone: not taken after all (rule 40)
        # process_async raised: the message failed, whatever resolved its callback during
        # the call (rules 16, 18); read and written on the loop thread only
        self.raised = False
        self.deadline = 0.0
        # with task.callback.timeout.ms, while its process_async call runs on the loop
        # thread: the real time past which a completion is late (0.0: not in that call)
        self.late_after = 0.0
        self.key: Any = None  # task.ordering = key: the key identity it holds busy
        self.entry: list[Any] | None = None  # task.ordering = key: its _Partition.order entry
        self.started = 0.0  # the clock's monotonic time at invocation (head-of-line metric)

    def complete(self) -> None:
        """Mark the message done. A second resolution stops the container (rule 17)."""
        self._engine._resolve(self, None)

    def fail(self, exc: BaseException) -> None:
        """Mark the message failed; stops the container with TaskError (rule 16)."""
        if not isinstance(exc, BaseException):
            exc = TypeError(f"callback.fail() expects an exception, got {exc!r}")
        self._engine._resolve(self, exc)

    def __repr__(self) -> str:
        return f"<callback {self.task.name} {self.part.ssp} offset={self.offset!r} seq={self.seq}>"


def _retry_sync(process: Callable[..., Any], env: Envelope, collector: Any, coordinator: Coordinator) -> None:
    """One more attempt of a sync process call (task.error.retries)."""
    coordinator.take()
    process(env, collector, coordinator)


class _Partition:
    """One input partition of a task: its reader, bounded buffer and offsets."""

    __slots__ = (
        "at_end",
        "buffer",
        "committed",
        "committed_n",
        "low_watermark",
        "newest_read",
        "order",
        "read_n",
        "reader",
        "released_n",
        "ssp",
    )

    def __init__(self, ssp: SystemStreamPartition, reader: Any, start: Offset | None) -> None:
        self.ssp = ssp
        self.reader = reader
        self.buffer: deque[Envelope] = deque()
        self.at_end = False
        self.low_watermark: Offset | None = start  # last released offset (rule 12)
        self.committed: Offset | None = start  # last offset written to the store
        self.newest_read: Offset | None = None
        self.read_n = 0  # messages read into the buffer
        self.released_n = 0  # messages released in order
        self.committed_n = 0  # released_n at the last commit
        # task.ordering = key (rules 30, 31): every message read and not yet passed by
        # the low watermark, in offset order: [offset, state] (0 buffered, 1 invoked,
        # 2 released); the input buffer bounds its length
        self.order: deque[list[Any]] = deque()


class _Timers:
    """Per-task one-shot timers (rule 23): ``TimerService`` for ``TaskContext``.

    ``schedule``/``cancel`` from any thread (task code may run on the pool); the
    loop reads due timers with ``next_due``/``pop_due``.
    """

    def __init__(self, wake: Callable[[], None], clock: Clock, events: EventTimers) -> None:
        self._lock = threading.Lock()
        self._timers = TimerHeap()
        self.events = events  # event-time timers (rule 38)
        self._wake = wake  # also ends a run in progress (ReferenceEngine._run)
        self._clock = clock

    def now(self) -> float:
        """The run's clock in epoch seconds (``context.now()``: virtual under a test driver)."""
        return self._clock.time()

    def schedule(self, key: Any, when: float, fn: Callable[..., Any]) -> None:
        with self._lock:
            self._timers.push(key, when, fn)
        self._wake()  # outside the lock: the loop reads timers under its own lock

    def cancel(self, key: Any) -> bool:
        with self._lock:
            removed = self._timers.remove(key)
        if removed:
            self._wake()  # a due timer it removes holds its task back no more (rules 8, 23)
        return removed

    def schedule_event_time(self, key: Any, when_ms: int | float, fn: Callable[..., Any] | None) -> None:
        when_ms = check_event_time(key, when_ms)
        with self._lock:
            self.events.schedule(key, when_ms, fn)
        self._wake()

    def cancel_event_time(self, key: Any) -> bool:
        with self._lock:
            removed = self.events.cancel(key)
        if removed:
            self._wake()
        return removed

    def event_due(self, watermark: int) -> bool:
        """True while an event-time timer is due at the task's watermark (rule 38)."""
        with self._lock:
            at = self.events.earliest()
        return at != END and watermark >= at

    def pop_event_due(self, watermark: int | float) -> list[tuple[Any, float, Callable[..., Any]]]:
        """Remove and return the event-time timers due at ``watermark``, in time order."""
        with self._lock:
            return self.events.pop_due(watermark)

    def next_due(self) -> float | None:
        """The earliest registered time (epoch seconds, as the clock's ``time()``), or None."""
        with self._lock:
            return self._timers.earliest()

    def pop_due(self, now: float) -> list[tuple[Any, Callable[..., Any]]]:
        """Remove and return the timers due at ``now``, in time order."""
        with self._lock:
            return self._timers.pop_due(now)


class _Task:
    """Run-loop state of one task. Touched by the loop thread only (metrics read it)."""

    def __init__(self, engine: ReferenceEngine, plan: TaskPlan, now: float) -> None:
        cfg = engine.config
        self.plan = plan
        self.name = plan.name
        self.kind = plan.kind
        self.instance = plan.task
        self.collector = plan.collector
        self.parts = [
            _Partition(ssp, reader, plan.start_offsets.get(ssp))
            for ssp, reader in zip(plan.partitions, plan.readers)
        ]
        self.part_rr = 0  # round-robin cursor over partitions (rule 5)
        self.process: Callable[..., Any] = (
            plan.task.process if plan.kind == "sync" else plan.task.process_async
        )
        self.window = hook(plan.task, "window") if cfg.window_ms > 0 else None
        self.eos_hook = hook(plan.task, "end_of_stream")
        self.coordinator = Coordinator()  # reused by sync process on one thread
        # task.error.policy when it decides anything besides failing (rule 39); a sync task's
        # undo journal of its store writes (one thread runs its messages at a time)
        self.policy = plan.policy if plan.policy is not None and plan.policy.active else None
        self.timestamps = plan.timestamps  # a TimestampReader, or None (rule 32)
        # its event-time watermark (rules 33, 37), on the run's monotonic clock in ns
        # a task with windows or durable event-time timers: it follows the messages handed
        # to the task (rules 35, 38; C: TR_TASK_EVENT_TRACK)
        self.track = plan.event_tracking
        self.event_time = EventTime(
            len(self.parts),
            cfg.watermark_lag_ms,
            cfg.watermark_idle_ms * 1_000_000,
            round(now * 1e9),
            track=self.track,
        )
        if plan.event_time_floor is not None:  # rule 33: at least its committed value
            self.event_time.floor(plan.event_time_floor)
        # a sync task with stores records its store writes per invocation: a failed
        # message's are undone, so a skipped one leaves none and a failed one costs no
        # commit (rules 39, 40)
        self.journal: Journal | None = Journal() if plan.stores and plan.kind == "sync" else None
        self.timers = _Timers(engine._timer_set, engine._clock, plan.event_timers())
        plan.early_commit(early_commit(self.timers.schedule))
        # a sync task without key ordering: runs of messages on the loop thread when the
        # engine has no pool and no stuck-call watch (ReferenceEngine._run)
        # (a tracking task's messages go one by one through _invoke, which moves its watermark)
        self.inline = plan.kind == "sync" and cfg.ordering != "key" and not self.track
        # sequencing (rules 2, 12, 15)
        self.next_seq = 0
        self.next_release = 0
        self.unrun = 0  # sequence numbers at the tail handed back unrun by the pool at a stop
        self.unresolved: dict[int, _Callback] = {}  # invoked, no completion yet (invocation order)
        self.held: dict[int, _Callback] = {}  # completed, not yet released
        self.release_stopped = False  # release stopped after a commit request (rule 15)
        # barriers (rules 8, 9, 23)
        self.commit_requested = False
        self.next_commit = _after(now, cfg.commit_ms / 1000) if cfg.commit_ms > 0 else None
        self.next_window = _after(now, cfg.window_ms / 1000) if self.window is not None else None
        self.window_due = False  # the window timer fired; the window has not run yet (rule 8)
        self.window_due_at = 0.0  # when the pending window fell due (monotonic seconds)
        self.voted = False
        self.done = False  # end of stream reached and hook run (rule 11)
        self.worker: int | None = None  # its pool thread (with a pool)
        # task.ordering = key (rules 30, 31): keys with a message outstanding
        self.keyed = cfg.ordering == "key"
        # as the C loop: 16 x max concurrency, no more than the input buffers hold
        self.key_window = max(
            cfg.max_concurrency,
            min(16 * cfg.max_concurrency, cfg.input_buffer_size * max(1, len(self.parts))),
        )
        self.busy: set[Any] = set()
        # a commit with stores found messages taken ahead of an earlier one still buffered:
        # no look-ahead past each partition's first buffered message until none is left
        # (then the commit is asked again), so the state becomes an offset prefix (rule 27)
        self.catch_up = False
        self.run_left = 0  # what a run cut by a barrier left of its turn (0: a new turn)
        # metrics
        self.processed = 0
        self.started = 0  # on the pool: the process calls its pool thread began (the metric)
        self.completed = 0
        self.failed = 0
        self.ignored = 0
        self.windows = 0
        self.commits = 0
        self.timer_runs = 0

    @property
    def outstanding(self) -> int:
        """Invoked and not yet released (rule 2); handed back unrun at a stop: not."""
        return self.next_seq - self.next_release - self.unrun

    def buffered(self) -> bool:
        return any(p.buffer for p in self.parts)


class ReferenceEngine:
    """Pure-Python run loop implementing SEMANTICS.md for "sync" and "async" tasks.

    ``run()`` blocks on the calling thread; ``stop()`` and ``metrics()`` are safe
    from any thread, and ``stop()`` from a signal handler.
    """

    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self.config = plan.config
        # Condition over an RLock: stop() may run in a signal handler on the loop
        # thread while that thread holds the lock.
        self._clock = plan.clock  # every deadline of the run comes from it (tailrace.clock)
        self._cv = self._clock.condition(threading.RLock())
        # (kind, callback, exception; for "late": how late, in seconds; for "commit": no
        # callback, the error of a commit the commit writer failed)
        self._events: deque[tuple[str, _Callback, Any]] = deque()
        self._signalled = False  # reader wakeup / timer change since the last wait
        self._stop_flag = False
        # set by stop() and by a timer scheduled: a run in progress ends after its
        # current message, so the loop acts on it first (ReferenceEngine._run)
        self._poke = False
        self._runs = False  # runs on the loop thread (no pool, no watch): set by run()
        self._ran = False
        self._watch: StuckCallWatch | None = None  # sync calls on the loop thread (rules 3, 16)
        now = self._clock.monotonic()
        self._tasks = [_Task(self, tp, now) for tp in plan.tasks]
        if plan.writer is not None:  # a failed commit stops the loop at once (its thread)
            plan.writer.on_error = self._commit_failed
        self._rr = 0  # round-robin cursor over tasks (rule 5)
        self._failure: BaseException | None = None
        self._further = FurtherErrors((tp.name for tp in plan.tasks), log)
        # a callback failed or resolved twice (set under _cv by the resolving thread, before
        # the loop applies it): pool threads invoke no more queued messages
        self._failing = False
        self._draining = False
        self._reason = "stop"
        self._drain_deadline = 0.0
        self._shutdown_all = False
        self._done_count = 0  # tasks at end of stream
        self._vote_count = 0  # tasks that voted for shutdown or are done
        self._workers: list[queue.SimpleQueue[Any]] = []
        self._threads: list[threading.Thread] = []
        self._busy: list[bool] = []  # per pool thread: inside a process call
        self._metrics = ContainerMetrics()
        self._timeout = (
            self.config.callback_timeout_ms / 1000 if self.config.callback_timeout_ms > 0 else None
        )
        # the clock's monotonic() for runs: time.monotonic itself on real time (no method layer)
        self._monotonic: Callable[[], float] = (
            time.monotonic if type(self._clock).monotonic is Clock.monotonic else self._clock.monotonic
        )

    # -- public ---------------------------------------------------------------
    def stop(self) -> None:
        """Request a graceful stop (rule 19); wakes a blocked loop. Any thread, signal handlers."""
        self._stop_flag = True
        self._poke = True  # after the flag: a run that sees the poke sees the flag
        with self._cv:
            self._cv.notify()

    def metrics(self) -> tuple[dict[str, TaskMetrics], ContainerMetrics]:
        """A snapshot of task and container metrics; safe from any thread."""
        c = self._metrics
        snapshot = ContainerMetrics(c.envelopes_chosen, c.idle_wakeups, c.loop_iterations)
        return {t.name: self._task_metrics(t) for t in self._tasks}, snapshot

    def run(self) -> RunResult:
        """Run until end of stream, shutdown, stop or error (raises TaskError)."""
        if self._ran:
            raise TailraceError("ReferenceEngine.run() may be called once")
        self._ran = True
        started = self._clock.monotonic()
        ms = self.config.callback_timeout_ms
        if ms > 0 and not self.config.thread_pool_size:
            self._watch = StuckCallWatch(ms, threading.get_ident())
        self._runs = self._watch is None and not self.config.thread_pool_size
        try:
            self._start()
            if self._failure is None:
                self._loop()
            self._final_commit()
            self._drain()
        finally:
            self._stop_pool()  # before close(): no process call of a task after its close (rule 19)
            self._close_tasks()
            if self._watch is not None:
                self._watch.close()
            self._clock.forget(self._cv)
        if self._failure is not None:
            raise self._failure
        tasks, container = self.metrics()
        committed = {p.ssp: p.committed for t in self._tasks for p in t.parts if p.committed is not None}
        return RunResult(tasks, container, committed, self._reason, self._clock.monotonic() - started)

    # -- threads other than the loop ------------------------------------------
    def _wakeup(self) -> None:
        """Reader wakeup / timer change: any thread."""
        with self._cv:
            self._signalled = True
            self._cv.notify()

    def _commit_failed(self, error: BaseException) -> None:
        """The commit writer failed a commit (its thread): the loop stops on it at once."""
        with self._cv:
            self._events.append(("commit", None, error))  # type: ignore[arg-type]
            self._failing = True
            self._poke = True
            self._signalled = True
            self._cv.notify()

    def _timer_set(self) -> None:
        """``context.schedule`` (any thread): a run in progress ends, the loop re-reads the timers."""
        self._poke = True
        self._wakeup()

    def _resolve(self, cb: _Callback, exc: BaseException | None) -> None:
        """complete()/fail() from any thread: exactly one resolution wins (rule 17)."""
        if cb.abandoned:
            return  # process_async raised and its message was skipped or dead-lettered
        if exc is not None and cb.task.policy is not None and cb.env is not None:
            verdict, exc = self._decide(cb.task, cb.env, exc, None)  # rule 39
            if verdict != FAIL:
                exc = None
        late_by = time.monotonic() - cb.late_after if cb.late_after and exc is None else 0.0
        with self._cv:
            if cb._done:
                self._events.append(("twice", cb, exc))
                self._failing = True
            elif late_by > 0:
                cb._done = True
                self._events.append(("late", cb, late_by))
            else:
                cb._done = True
                self._events.append(("done", cb, exc))
                if exc is not None:
                    self._failing = True
            self._cv.notify()

    def _run_sync(self, t: _Task, cb: _Callback, env: Envelope, coordinator: Coordinator) -> bool:
        """A sync process call (loop thread or pool): completes when it returns (rule 3).
        True when it completed (ignored, skipped or dead-lettered included)."""
        error: BaseException | None = None
        watch = self._watch if not self._workers else None  # the loop thread's own calls
        if watch is not None:
            started = time.monotonic()  # real time, as the C engine: the call takes real time
            watch.begin(t.name, cb.part.ssp, cb.offset, started)
        journal = t.journal
        if journal is not None:
            journal_bind(journal)
        try:
            if type(env.message) is BadInput:
                cb.bad = True
                raise env.message.error
            t.process(env, t.collector, coordinator)
        except Exception as exc:  # noqa: BLE001 - user code; reported through the callback
            verdict, e = self._decide(t, env, exc, coordinator)
            if verdict == IGNORED:
                cb.ignored = True
                log.debug("task %r ignored %r at %s offset %r", t.name, e, cb.part.ssp, cb.offset)
            elif verdict == FAIL:
                error = e
                if journal is not None:
                    journal_undo(journal)
                if (journal is not None or not t.plan.stores) and t.plan.held is None:
                    cb.handed_back = True  # as the C loop (rules 40, 41)
        finally:
            if journal is not None:
                journal_bind(None)
                journal.clear()
        if watch is not None:
            watch.end()
            took = time.monotonic() - started
            if error is None and took > watch.timeout_s:
                # rules 3, 16: nothing could time this call out while it ran on the loop
                # thread; it fails when it returns, as a late call on the pool does
                with self._cv:
                    cb._done = True
                t.unresolved.pop(cb.seq, None)
                self._fail_late(cb, "process returned", took)
                return False
        cb.requests = coordinator.take()
        self._resolve(cb, error)
        return error is None

    def _worker_main(self, i: int, q: queue.SimpleQueue[Any]) -> None:
        busy = self._busy
        while True:
            item = q.get()
            if item is None:
                return
            if self._failing or self._failure is not None:
                # the run failed (or a failure is on its way to the loop): a queued
                # message is not invoked (rule 16; as the C loop, whose error is posted
                # when the callback fails)
                continue
            if self._draining:
                # a graceful stop began: dispatch has stopped, and a queued message is
                # handed back, never invoked (rule 19; as the C loop's workers): not
                # awaited by the drain, not committed; and never run after close()
                with self._cv:
                    self._events.append(("unrun", item[1], None))
                    self._cv.notify()
                continue
            busy[i] = True
            item[0].started += 1  # one pool thread per task: the only writer
            try:
                self._run_sync(*item)
            finally:
                busy[i] = False

    # -- start and the loop ---------------------------------------------------
    def _start(self) -> None:
        n = self.config.thread_pool_size
        for i in range(n):
            q: queue.SimpleQueue[Any] = queue.SimpleQueue()
            th = threading.Thread(
                target=self._worker_main, args=(i, q), name=f"tailrace-pool-{i}", daemon=True
            )
            self._workers.append(q)
            self._busy.append(False)
            self._threads.append(th)
            th.start()
        for t in self._tasks:
            if n:
                t.worker = t.plan.index % n  # one thread per task, as the C loop (rules 1, 21)
            for p in t.parts:
                p.reader.start(p.committed, self._wakeup)
        for t in self._tasks:
            init = hook(t.instance, "init")
            try:
                with t.timers._lock:
                    t.timers.events.restore()  # durable event-time timers (rule 38)
                # every task gets its context before its first message (declared windows
                # bind to it), init or not
                context = t.plan.make_context(
                    self.config,
                    t.timers,
                    functools.partial(self._task_metrics, t),
                    watermark=functools.partial(getattr, t.event_time, "value"),
                )
                fast = t.plan.windows_process(self.config)
                if fast is not None:
                    t.process = fast  # its window's add, without StreamTask.process around it
                if init is not None:
                    init(context)
            except Exception as e:  # noqa: BLE001 - user code
                self._fail(TaskError(t.name, original=e, phase="init"))
                return

    def _loop(self) -> None:
        while True:
            self._metrics.loop_iterations += 1
            progress = self._apply_events()
            self._check_deadlines()
            if self._failure is not None:
                return
            for t in self._tasks:
                progress |= self._release(t)
            self._check_stop()
            if self._draining:
                progress |= self._run_barriers(commit_only=True)
                if self._failure is not None:
                    return
                if all(t.outstanding == 0 and not t.commit_requested for t in self._tasks):
                    return
                if self._clock.monotonic() >= self._drain_deadline:
                    log.warning(
                        "shutdown: %d callbacks still outstanding after %s; committing low watermarks",
                        sum(t.outstanding for t in self._tasks),
                        self.config.drain_text(),
                    )
                    return
            else:
                progress |= self._poll_inputs()
                if self._failure is not None:
                    return
                progress |= self._run_barriers(commit_only=False)
                if self._failure is not None:
                    return  # a window or timer failed (rule 16): no end of stream after it
                self._check_stop()  # requests released by a commit, or from window and timers
                if not self._draining:
                    progress |= self._end_of_stream()
                    if self._failure is not None:
                        return
                    self._check_stop()  # requests from end_of_stream, or the end itself
                if not self._draining:
                    progress |= self._dispatch()
            if self._failure is None and not progress:
                self._wait()

    # -- 1. completions and deadlines -----------------------------------------
    def _apply_events(self) -> bool:
        with self._cv:
            if not self._events:
                return False
            events = list(self._events)
            self._events.clear()
        for kind, cb, exc in events:
            if kind == "commit":  # a commit the commit writer failed to write (rule 16)
                self._fail(exc)
                continue
            t = cb.task
            if kind == "twice":
                what = "failed" if exc is not None else "completed"
                self._fail(
                    CallbackError(
                        t.name, cb.part.ssp, cb.offset, exc, detail=f"callback {what} a second time (rule 17)"
                    )
                )
                continue
            t.unresolved.pop(cb.seq, None)
            if t.keyed:
                t.busy.discard(cb.key)  # rule 30: the next message of this key may start
            if kind == "unrun":
                # handed back by its pool thread once the stop began: never invoked, so not
                # outstanding (the drain does not wait for it) and not processed; a task's
                # hand-backs are the tail of its sequence numbers (its thread runs them in
                # order and invokes none after the first), so its state still commits
                t.processed -= 1
                t.unrun += 1
                if cb.entry is not None:
                    cb.entry[1] = 0  # task.ordering = key: buffered again, not taken ahead
                continue  # nor completed: the watermark stays before it
            if kind == "late":
                # rules 3, 16: completed during its own process_async call, which held the
                # loop thread past the deadline (nothing could time it out meanwhile): it
                # fails, as a sync call that returns late does
                self._fail_late(cb, "callback completed", exc + self.config.callback_timeout_ms / 1000)
                continue
            if exc is not None:
                t.failed += 1
                if cb.handed_back:  # as "unrun": not processed, nor taken ahead (rule 40)
                    t.processed -= 1
                    t.unrun += 1
                    if cb.entry is not None:
                        cb.entry[1] = 0
                self._fail(exc if cb.bad else TaskError(t.name, cb.part.ssp, cb.offset, exc))
                continue
            if cb.raised:
                continue  # completed, then its process_async raised: it failed (_raised)
            if t.track and t.kind == "sync" and self._workers:
                self._done(t, cb)  # its pool thread's call returned
            if cb.ignored:
                t.ignored += 1
            if cb.coordinator is not None:
                cb.requests = cb.coordinator.take()
            t.held[cb.seq] = cb
        return True

    def _fail_late(self, cb: _Callback, what: str, took: float) -> None:
        """Rules 3, 16: a call held the loop thread past task.callback.timeout.ms (nothing
        could time it out meanwhile) and its message completed only then (``took`` seconds
        after its start): it fails, as a callback the deadline caught does."""
        cb.task.failed += 1
        ms = self.config.callback_timeout_ms
        self._fail(
            CallbackTimeoutError(
                cb.task.name,
                cb.part.ssp,
                cb.offset,
                TimeoutError(f"{what} after {took * 1000:.0f} ms, past task.callback.timeout.ms={ms}"),
            )
        )

    def _check_deadlines(self) -> None:
        """Callback timeout (rule 16): the oldest unresolved callback of each task; of those
        past their deadline, the one whose deadline came first times out (at one deadline,
        the first task's), as the C engine's timer heap orders them."""
        if self._timeout is None or self._failure is not None:
            return
        now = self._clock.monotonic()
        due: list[tuple[float, int, _Task, _Callback]] = []
        for i, t in enumerate(self._tasks):
            if t.unresolved:
                oldest = next(iter(t.unresolved.values()))
                if now >= oldest.deadline:
                    due.append((oldest.deadline, i, t, oldest))
        for _, _, t, cb in sorted(due, key=lambda d: (d[0], d[1])):
            with self._cv:
                if cb._done:  # completed just now: the event is queued
                    continue
                cb._done = True  # a late completion is then an error too, but we stop anyway
            t.failed += 1
            ms = self.config.callback_timeout_ms
            self._fail(
                CallbackTimeoutError(
                    t.name,
                    cb.part.ssp,
                    cb.offset,
                    TimeoutError(f"callback not completed within task.callback.timeout.ms={ms}"),
                )
            )
            return

    # -- 2. release in order --------------------------------------------------
    def _release(self, t: _Task) -> bool:
        """Release held completions in sequence order; stop after a commit request (rule 15)."""
        released = False
        while not t.release_stopped:
            cb = t.held.pop(t.next_release, None)
            if cb is None:
                break
            t.next_release += 1
            t.completed += 1
            part = cb.part
            if t.keyed and cb.entry is not None:
                # invocation order is not offset order: the watermark moves over the
                # contiguous released prefix of the partition (rules 12, 13, 30)
                cb.entry[1] = 2
                while part.order and part.order[0][1] == 2:
                    part.low_watermark = part.order.popleft()[0]
                    part.released_n += 1
            else:
                part.low_watermark = cb.offset
                part.released_n += 1
            released = True
            if cb.requests:
                self._apply_requests(t, cb.requests)
                if cb.requests & _COMMIT:
                    t.release_stopped = True
        return released

    def _apply_requests(self, t: _Task, bits: int) -> None:
        """Coordinator requests once they take effect (rule 14)."""
        if bits & COMMIT_CURRENT:
            t.commit_requested = True
        if bits & COMMIT_ALL:
            for other in self._tasks:
                other.commit_requested = True
        if bits & SHUTDOWN_CURRENT:
            self._vote(t)
        if bits & SHUTDOWN_ALL:
            self._shutdown_all = True

    # -- 3. deciding to stop --------------------------------------------------
    def _vote(self, t: _Task) -> None:
        if not t.voted:
            t.voted = True
            self._vote_count += 1

    def _check_stop(self) -> None:
        """Start draining on end of stream, shutdown requests or stop() (rules 11, 14, 19)."""
        if self._draining:
            return
        n = len(self._tasks)
        if self._done_count == n:
            reason = "end_of_stream"
        elif self._shutdown_all or self._vote_count == n:
            reason = "shutdown"
        elif self._stop_flag:
            reason = "stop"
        else:
            return
        log.debug("run loop stopping: %s", reason)
        self._reason = reason
        self._draining = True
        self._drain_deadline = _after(self._clock.monotonic(), self.config.drain_ms / 1000)

    # -- 4. input -------------------------------------------------------------
    def _poll_inputs(self) -> bool:
        """Refill partition buffers up to task.input.buffer.size (rule 6); those of a task
        served by runs up to ``_RUN_FILL`` (no more than that size)."""
        cap = self.config.input_buffer_size
        got = False
        for t in self._tasks:
            if t.done:
                continue
            fill = min(cap, _RUN_FILL) if t.inline and self._runs else cap
            for i, p in enumerate(t.parts):
                if t.keyed:
                    # rule 31: counted from the watermark, and read on up to the whole buffer
                    # (a keyed task's buffer may hold only busy keys: no dispatch frees it)
                    held = len(p.order)
                    if p.at_end or held >= fill:
                        continue
                else:
                    held = len(p.buffer)
                    if p.at_end or held > fill // 2:
                        continue
                try:
                    batch = p.reader.poll(fill - held)
                    ended = not batch and p.reader.at_end()
                except Exception as e:  # noqa: BLE001 - bad input: stop, committing what was released (rule 18)
                    self._fail(e)
                    return got
                if batch:  # rule 32: stamped as read (ingestion time: the wall clock now)
                    if type(batch) is not list:
                        batch = list(batch)
                    stamp_envelopes(batch, t.timestamps, wall_ms(self._clock))
                # rule 33: its largest timestamp, an empty poll, or its end (C: tr_loop_event_time_read,
                # tr_loop_partition_state)
                now_ns = round(self._clock.monotonic() * 1e9)
                if batch:
                    stamps = [e.timestamp for e in batch]
                    t.event_time.read(
                        i, max([NONE, *(ts for ts in stamps if ts is not None)]), now_ns, len(batch)
                    )
                elif ended:
                    t.event_time.ended(i, now_ns)
                else:
                    t.event_time.empty(i, now_ns)
                if t.keyed and not self._keys_ordered(t, p, batch):
                    return got
                if batch:
                    p.buffer.extend(batch)
                    if t.keyed:
                        p.order.extend([e.offset, 0] for e in batch)
                    p.read_n += len(batch)
                    p.newest_read = batch[-1].offset
                    got = True
                elif ended:
                    p.at_end = True
        return got

    def _keys_ordered(self, t: _Task, p: _Partition, batch: list[Envelope]) -> bool:
        """Every key of ``batch`` has an identity (rule 30); one that has none makes its
        envelope a bad message in its place (rule 39), as the C loop does when it hashes it.
        True (the batch is buffered, bad messages included)."""
        for i, env in enumerate(batch):
            try:
                key_identity(env.key)
            except Exception as e:  # noqa: BLE001 - the key's own hash or JSON failed
                error = key_error(t.name, p.ssp, env.offset, env.key, e)
                error.__cause__ = e
                batch[i] = Envelope(
                    env.system,
                    env.stream,
                    env.partition,
                    env.offset,
                    None,
                    BadInput(error, None, env.message),
                    env.timestamp,
                )
        return True

    # -- 5. barriers: commit, window, timers ----------------------------------
    def _run_barriers(self, commit_only: bool) -> bool:
        """What is due, in passes over the tasks in task order, as the C loop builds its
        control ops: commits run and the pass goes on; a task's window and timers end the
        pass (the next starts again from task 0). So what a task's hooks make due for it at
        once (a timer set for now, a commit then its window) runs before a later task's
        hooks (docs/testing.md: task by task), and commits that fall due together all run
        before the windows. At most ``_BARRIER_ROUNDS`` passes a loop iteration: a timer
        that sets itself for now again and again still lets the loop see a stop."""
        ran = False
        # periods fall due by the clock when the passes began: a window that ran past its
        # next time waits for the next iteration, after its task had a turn (rule 5)
        now = self._clock.monotonic()
        for _ in range(_BARRIER_ROUNDS):
            progressed = False
            for t in self._tasks:
                if self._failure is not None:
                    return ran
                did, hooks, commit_only = self._task_barriers(t, commit_only, now)
                progressed |= did
                if hooks:
                    break
            ran |= progressed
            if not progressed or self._stop_flag:
                break
        return ran

    def _task_barriers(self, t: _Task, commit_only: bool, now: float) -> tuple[bool, bool, bool]:
        """One round of ``t``'s barriers due at ``now`` (monotonic): (whether one ran,
        whether a window or timers ran, commit_only from now on)."""
        ran = False
        if not commit_only:
            self._check_stop()  # O(1); no window or timer once a stop is due
            commit_only = self._draining
        # the commit period runs while running; a graceful stop's drain waits for the
        # outstanding callbacks and then commits once (rule 19; as the C engine)
        if t.next_commit is not None and now >= t.next_commit and not self._draining:
            t.commit_requested = True
            t.next_commit = _rearm(t.next_commit, self.config.commit_ms / 1000, now)
        if not commit_only and not t.done and t.next_window is not None and now >= t.next_window:
            if not t.window_due:
                t.window_due_at = t.next_window
            t.window_due = True  # coalesced: one pending window at a time (rule 8)
            t.next_window = _rearm(t.next_window, self.config.window_ms / 1000, now)
        if t.commit_requested:
            if self.config.async_commit or not t.unresolved:  # rules 9, 10
                # the held tail may carry the next commit request: run it too
                while t.commit_requested and self._failure is None:
                    self._commit(t)
                    t.commit_requested = False
                    if t.release_stopped:
                        t.release_stopped = False
                        self._release(t)  # the held tail (rule 15)
                ran = True
            return ran, False, commit_only  # commit has priority over window and timers
        if commit_only or t.done or t.outstanding:
            return ran, False, commit_only
        hooks = self._run_hooks(t)
        return hooks, hooks, commit_only

    def _run_hooks(self, t: _Task) -> bool:
        """Run ``t``'s due window and timers in the order they fell due, the window first
        when they fell due at one instant (rules 8, 23): the timers due before the window,
        the window, then the other due timers. Once a hook has made a stop due (shutdown
        ALL, the last vote: rules 14, 19), requested a commit (it goes first: rule 9) or
        failed, the rest waits: for the loop's next pass, or forever once stopping."""
        wall = self._clock.time()
        if t.window_due:
            clock = self._clock  # (window_due_at: monotonic seconds on the ns grid, _after)
            window_time = wall - (clock.monotonic() - t.window_due_at)
            before = before_window(clock, round(t.window_due_at * 1e9), window_time)
            if self._run_timers(t, before) and self._hooks_cut(t):
                return True
            t.window_due = False
            self._run_window(t)
            if self._hooks_cut(t):
                return True
            self._run_timers(t, wall)
            return True
        return self._run_timers(t, wall)

    def _hooks_cut(self, t: _Task) -> bool:
        """After a window or timers of ``t`` ran: True when no more may run now (see _run_hooks)."""
        self._check_stop()  # O(1)
        return self._draining or self._failure is not None or t.commit_requested

    def _blocked(self, t: _Task, now: float) -> bool:
        """True while a barrier of ``t`` is due: no dispatch to it (rules 8, 9, 23)."""
        if t.commit_requested and not self.config.async_commit:
            return True
        if t.next_commit is not None and now >= t.next_commit and not self.config.async_commit:
            return True
        if t.window_due or (t.next_window is not None and now >= t.next_window):
            return True
        return self._timer_due(t)

    def _timer_due(self, t: _Task) -> bool:
        """True while a timer of ``t`` is due (rule 23), or an event-time timer (rule 38)."""
        due = t.timers.next_due()
        return (due is not None and due <= self._clock.time()) or t.timers.event_due(t.event_time.value)

    def _barrier_due(self, t: _Task, now: float) -> float:
        """When t's next window, commit or user timer is due (monotonic seconds; inf: none)."""
        due = math.inf
        if t.next_commit is not None:
            due = t.next_commit
        if t.next_window is not None and t.next_window < due:
            due = t.next_window
        if t.window_due:
            due = min(due, now)  # due already
        timer = t.timers.next_due()  # wall clock
        if timer is not None:
            due = min(due, now + (timer - self._clock.time()))
        if t.timers.event_due(t.event_time.value):
            due = min(due, now)  # due already (rule 38)
        return due

    def _next_barrier(self, now: float) -> float:
        """The earliest window, commit or user timer of a live task still to fall due after
        ``now`` (monotonic seconds; inf: none). One due already holds back its own task
        (``_blocked``), not the others, as in the C loop."""
        upcoming = (self._barrier_due(t, now) for t in self._tasks if not t.done)
        return min((d for d in upcoming if d > now), default=math.inf)

    def _commit(self, t: _Task) -> None:
        """Write each partition's low watermark (rules 9, 10, 12, 13), when it moved."""
        offsets = {p.ssp: p.low_watermark for p in t.parts if p.low_watermark is not None}
        if t.plan.exact:
            # Stores, or exactly-once outputs (rule 41): offsets and state go together, so a
            # commit runs only when the state (and held outputs) holds exactly the released
            # prefix (rule 27); else the next commit carries it.
            if t.outstanding:
                return
            if t.keyed and _taken_ahead(t):
                t.catch_up = True
                return
            if not t.plan.state_dirty() and not any(p.low_watermark != p.committed for p in t.parts):
                return
        elif not any(p.low_watermark != p.committed for p in t.parts):
            return
        try:
            self.plan.commit(t.plan, offsets, t.event_time.value)
        except TailraceError as e:
            self._fail(e)
            return
        except Exception as e:  # noqa: BLE001 - a store or producer failure stops the container
            self._fail(TaskError(t.name, original=e, phase="commit"))
            return
        for p in t.parts:
            p.committed = p.low_watermark
            p.committed_n = p.released_n
        t.commits += 1

    def _run_window(self, t: _Task) -> None:
        assert t.window is not None
        coordinator = Coordinator()
        t.windows += 1  # one that raises ran too (as on the C engine)
        try:
            t.window(t.collector, coordinator)
        except Exception as e:  # noqa: BLE001 - user code
            if self.config.ignores(e):
                t.ignored += 1
            else:
                self._fail(TaskError(t.name, original=e, phase="window"))
                return
        self._apply_requests(t, coordinator.take())
        ended = self._clock.monotonic()
        if t.next_window is not None and t.next_window <= ended:
            # it ended when the next window was due already: that one comes a period from
            # now, and the task's messages run in between (rules 5, 8; as the C loop)
            t.next_window = _after(ended, self.config.window_ms / 1000)

    def _run_timers(self, t: _Task, until: float) -> bool:
        """Run ``t``'s timers due at ``until`` (epoch seconds), in time order (rule 23)."""
        due = t.timers.pop_due(until)
        for key, fn in due:
            coordinator = Coordinator()
            t.timer_runs += 1  # one that raises ran too (as on the C engine)
            try:
                fn(key, t.collector, coordinator)
            except Exception as e:  # noqa: BLE001 - user code
                self._fail(TaskError(t.name, original=e, phase="timer", detail=f"timer {key!r}: {e!r}"))
                return True
            self._apply_requests(t, coordinator.take())
        return self._run_event_timers(t, t.event_time.value) or bool(due)

    def _run_event_timers(self, t: _Task, raw: int) -> bool:
        """Run ``t``'s event-time timers due at its watermark ``raw`` (rules 35, 38), in time
        order, until none is (a timer may set one due already); True when any ran."""
        ran = False
        watermark = watermark_value(raw)
        while self._failure is None:
            due = t.timers.pop_event_due(watermark)
            if not due:
                break
            ran = True
            for key, when, fn in due:
                coordinator = Coordinator()
                t.timer_runs += 1
                try:
                    fn(key, when, t.collector, coordinator)
                except Exception as e:  # noqa: BLE001 - user code
                    self._fail(
                        TaskError(
                            t.name, original=e, phase="timer", detail=f"event-time timer {key!r}: {e!r}"
                        )
                    )
                    return True
                self._apply_requests(t, coordinator.take())
        return ran

    # -- 6. end of stream -----------------------------------------------------
    def _end_of_stream(self) -> bool:
        """Finish tasks whose every partition is exhausted and drained (rule 11). The tasks
        whose end of stream is due are chosen first, then their hooks run: what one hook asks
        (a commit ALL, a shutdown ALL) does not hold back another due with it (as the C loop,
        which builds them into one batch)."""
        finished = False
        due = [
            t
            for t in self._tasks
            if not (t.done or t.outstanding or t.commit_requested)
            and all(p.at_end and not p.buffer for p in t.parts)
            # a due window or timer runs first (rules 8, 23), at the next barriers
            and not (t.window_due or self._timer_due(t))
        ]
        for t in due:
            if self._failure is not None:
                return True  # (rule 16: nothing runs after a failure)
            # rule 37: every input ended, the watermark is +infinity: open windows close and
            # the event-time timers fire before end_of_stream
            self._run_event_timers(t, END)
            if self._failure is not None:
                return True
            if t.eos_hook is not None:
                coordinator = Coordinator()
                try:
                    t.eos_hook(t.collector, coordinator)
                except Exception as e:  # noqa: BLE001 - user code
                    self._fail(TaskError(t.name, original=e, phase="end_of_stream"))
                    return True
                self._apply_requests(t, coordinator.take())
                if t.commit_requested:  # the hook's own commit runs before the task is done
                    self._commit(t)
                    t.commit_requested = False
            t.done = True
            self._done_count += 1
            self._vote(t)
            finished = True
        return finished

    # -- 7. dispatch ----------------------------------------------------------
    def _dispatch(self, budget: int = 1024) -> bool:
        """Hand buffered envelopes to tasks below their concurrency limit, round robin
        over tasks and, within a task, over its partitions (rules 1-5)."""
        mc = self.config.max_concurrency
        now = self._clock.monotonic()
        tasks = self._tasks
        n = len(tasks)
        sent = 0
        # the earliest window, commit or user timer that falls due during this dispatch:
        # once it is due, no message starts before the loop has run it (rules 8, 9, 23),
        # so the clock is read per message. (One due already is _blocked's business:
        # it holds back its own task, not the others, as in the C loop.)
        self._poke = False  # before reading the timers: one set from now on pokes (see _run)
        due = self._next_barrier(now)
        halt = False
        while sent < budget and self._failure is None and not halt:
            round_sent = 0
            cut: int | None = None  # a task whose run a barrier or a stop ended: it goes first next
            for i in range(n):
                t = tasks[(self._rr + i) % n]
                if t.done or not t.buffered():
                    continue
                if t.keyed:
                    # max concurrency counts invoked, not completed (rule 2); completed
                    # messages behind a slow one wait unreleased in a wider window
                    if len(t.unresolved) >= mc or t.outstanding >= t.key_window:
                        continue
                elif t.outstanding >= mc:
                    continue
                now = self._clock.monotonic()
                if self._poke:  # a timer was set (by a run's process, or any thread), or stop()
                    self._poke = False
                    due = self._next_barrier(now)
                if now >= due or self._stop_flag:
                    halt = True  # rules 8, 19: the loop acts on it before any more messages
                    cut = (self._rr + i) % n  # t keeps its turn (the C loop's carry_run)
                    break
                if self._blocked(t, now):
                    continue
                if t.inline and self._runs and not t.outstanding and not t.release_stopped:
                    quota = t.run_left or _RUN_MAX  # a turn is _RUN_MAX messages, however cut
                    limit = min(quota, budget - sent - round_sent)
                    if limit <= 0:
                        halt = True
                        break
                    # a run ends after _RUN_SLICE_S too (the counters it brings up to date
                    # at its end, for the progress line and metrics, are never older)
                    run_due = min(due, self._monotonic() + _RUN_SLICE_S)
                    k, requests = self._run(t, run_due, limit)
                    round_sent += k
                    if requests or self._failure is not None:
                        halt = True  # the loop acts on requests and failures first (rules 14-16)
                        break
                    t.run_left = 0
                    if (
                        k < limit
                        and t.buffered()
                        and (self._poke or self._stop_flag or self._monotonic() >= run_due)
                    ):
                        # cut by a barrier or a stop: it keeps the rest of its turn (rule 5),
                        # as in the C loop (trl_carry); else with runs cut at every commit
                        # the task served last before it would be served first after it,
                        # every time
                        t.run_left = quota - k
                        cut = (self._rr + i) % n
                        halt = True
                        break
                    continue
                chosen = self._choose_keyed(t) if t.keyed else self._choose(t)
                if chosen is None:
                    continue  # every buffered key is busy (rule 31)
                cb = self._invoke(t, chosen)
                round_sent += 1
                if self._failure is not None:
                    break
                if cb._done and (cb.requests or (cb.coordinator is not None and cb.coordinator._requests)):
                    # completed during its call, with requests: released now, when nothing
                    # is outstanding before it, they take effect before any other message
                    # (rule 14; a shutdown stops dispatch at once, as in the C loop)
                    self._apply_events()
                    self._release(t)
                    self._check_stop()
                    if self._draining or self._failure is not None:
                        halt = True
                        break
                d = self._barrier_due(t, now)  # a timer process() just set
                if now < d < due:
                    due = d
            if cut is not None:
                self._rr = cut
            elif round_sent:  # a round where every task was held back passes no turn on
                self._rr = (self._rr + 1) % n
            if not round_sent:
                break
            sent += round_sent
            self._apply_events()  # inline sync completions free their slot at the next release
            for t in tasks:
                self._release(t)
            self._check_stop()  # a released shutdown request ends dispatch at once (rule 14)
            if self._draining or any(t.commit_requested for t in tasks):
                break  # control work before normal work: the loop runs the commit first
        self._metrics.envelopes_chosen += sent
        return sent > 0

    def _run(self, t: _Task, due: float, limit: int) -> tuple[int, int]:
        """A run: up to ``limit`` buffered messages of an inline sync task, one after the
        other on the loop thread; returns (messages invoked, requests of the last one).

        The same steps as ``_invoke`` + ``_run_sync`` + ``_apply_events`` + ``_release``
        for each message, without the callback objects: with nothing outstanding when
        it starts, each message completes (process returns) and is released before the
        next is invoked (rules 1-3, 12), so a message's sequence number is released as
        soon as it is taken. Partitions round robin as ``_choose`` (rule 5). The run
        ends before the next message once a barrier is due (``due``, monotonic), a stop
        is asked or a timer is set (``_poke``, which ``_dispatch`` clears before it reads
        the timers into ``due``: rules 8, 19, 23), and right after a message that failed
        (rules 16, 18) or made a coordinator request (rules 14, 15). The task's counters
        and watermarks are brought up to date when it ends (metrics read during a run
        lag behind it, as the C loop's do).
        """
        if len(t.parts) == 1:
            invoked, completed, requests = self._run_partition(t, t.parts[0], due, limit)
        else:
            invoked, completed, requests = self._run_partitions(t, due, limit)
        t.next_seq += invoked
        t.processed += invoked
        t.next_release += completed
        t.completed += completed
        if requests:
            self._apply_requests(t, requests)  # as _release does for a released message
            if requests & _COMMIT:
                t.release_stopped = True  # nothing is held behind it (rule 15)
        return invoked, requests

    def _run_partition(self, t: _Task, part: _Partition, due: float, limit: int) -> tuple[int, int, int]:
        """``_run`` of a task with one partition: (invoked, completed, requests)."""
        process = t.process
        collector = t.collector
        coordinator = t.coordinator
        monotonic = self._monotonic
        popleft = part.buffer.popleft
        n = min(limit, len(part.buffer))
        invoked = completed = requests = 0
        last: Envelope | None = None  # the last message completed
        journal = t.journal
        mark = 0
        if journal is not None:
            journal_bind(journal)
        try:
            while invoked < n:
                if self._poke or monotonic() >= due:
                    break
                env = popleft()
                invoked += 1
                try:
                    if journal is not None:
                        mark = len(journal)
                    if type(env.message) is BadInput:
                        raise env.message.error
                    process(env, collector, coordinator)
                except Exception as e:  # noqa: BLE001 - user code
                    done = self._run_error(t, part, env, e, mark)
                    if done <= 0:
                        if done < 0:  # handed back untaken (rule 40)
                            invoked -= 1
                            part.buffer.appendleft(env)
                        break
                completed += 1
                last = env
                if coordinator._requests:
                    requests = coordinator.take()
                    break
        finally:
            if journal is not None:
                journal_bind(None)
                journal.clear()
            if last is not None:
                part.low_watermark = last.offset  # released (rules 12, 13)
                part.released_n += completed
        return invoked, completed, requests

    def _run_partitions(self, t: _Task, due: float, limit: int) -> tuple[int, int, int]:
        """``_run`` of a task with several partitions, round robin: (invoked, completed, requests)."""
        process = t.process
        collector = t.collector
        coordinator = t.coordinator
        monotonic = self._monotonic
        parts = t.parts
        k = len(parts)
        rr = t.part_rr
        invoked = completed = requests = 0
        journal = t.journal
        mark = 0
        if journal is not None:
            journal_bind(journal)
        try:
            while invoked < limit:
                if self._poke or monotonic() >= due:
                    break
                for _ in range(k):
                    part = parts[rr]
                    rr = rr + 1 if rr + 1 < k else 0
                    if part.buffer:
                        break
                else:
                    break  # every buffer is empty
                env = part.buffer.popleft()
                invoked += 1
                try:
                    if journal is not None:
                        mark = len(journal)
                    if type(env.message) is BadInput:
                        raise env.message.error
                    process(env, collector, coordinator)
                except Exception as e:  # noqa: BLE001 - user code
                    done = self._run_error(t, part, env, e, mark)
                    if done <= 0:
                        if done < 0:  # handed back untaken (rule 40)
                            invoked -= 1
                            part.buffer.appendleft(env)
                        break
                completed += 1
                part.low_watermark = env.offset  # released (rules 12, 13)
                part.released_n += 1
                if coordinator._requests:
                    requests = coordinator.take()
                    break
        finally:
            if journal is not None:
                journal_bind(None)
                journal.clear()
            t.part_rr = rr
        return invoked, completed, requests

    def _run_error(self, t: _Task, part: _Partition, env: Envelope, e: BaseException, mark: int = 0) -> int:
        """An exception from process in a run, as ``_run_sync`` + ``_apply_events`` see it:
        1 when ignored, skipped, dead-lettered or retried past (the message counts as
        completed, its requests too), else the container stops with it (rule 16) and the
        message's requests are void: -1 when its store writes were undone (or it has no
        stores), so it is handed back untaken and the final commit passes everything before
        it (rule 40), 0 otherwise."""
        verdict, e = self._decide(t, env, e, t.coordinator, mark)
        if verdict != FAIL:
            if verdict == IGNORED:
                t.ignored += 1
                log.debug("task %r ignored %r at %s offset %r", t.name, e, part.ssp, env.offset)
            return 1
        t.coordinator.take()
        t.failed += 1
        bad = type(env.message) is BadInput and e is env.message.error
        self._fail(e if bad else TaskError(t.name, part.ssp, env.offset, e))
        if t.journal is not None:
            journal_undo(t.journal, mark)
        if t.plan.held is not None:
            return 0  # exactly-once: its held sends cannot be parted from the others (rule 41)
        return -1 if t.journal is not None or not t.plan.stores else 0

    def _decide(
        self, t: _Task, env: Envelope, e: BaseException, coordinator: Coordinator | None, mark: int = 0
    ) -> tuple[int, BaseException]:
        """What task.error.policy makes of a failed message (tailrace.engine.policy, rule 39):
        ``(verdict, error)``. A sync call (``coordinator`` given) can be retried, and its store
        writes since ``mark`` of the task's journal undone."""
        if t.policy is None:
            return FAIL, e
        retry = undo = None
        if coordinator is not None:
            retry = functools.partial(_retry_sync, t.process, env, t.collector, coordinator)
        if t.journal is not None and coordinator is not None:
            undo = functools.partial(journal_undo, t.journal, mark)
        try:
            return t.policy.handle(env, e, retry, undo, coordinator is not None)
        except Exception as e2:  # noqa: BLE001 - a dead letter not sent: the message fails with it
            return FAIL, e2

    def _choose(self, t: _Task) -> tuple[_Partition, Envelope]:
        parts = t.parts
        k = len(parts)
        for i in range(k):
            p = parts[(t.part_rr + i) % k]
            if p.buffer:
                t.part_rr = (t.part_rr + i + 1) % k
                return p, p.buffer.popleft()
        raise AssertionError("choose called on a task with empty buffers")

    def _choose_keyed(self, t: _Task) -> tuple[_Partition, Envelope] | None:
        """The first buffered message whose key is free, partitions round robin (rule 30).

        A sync task on the pool takes its messages in offset order: its one pool thread
        runs them one at a time in that order, so one key's messages complete in order
        with one outstanding at a time, and nothing is taken ahead (as the C loop)."""
        parts = t.parts
        k = len(parts)
        in_order = t.kind == "sync" and bool(self._workers)
        for i in range(k):
            p = parts[(t.part_rr + i) % k]
            for j, env in enumerate(p.buffer):
                if in_order or key_identity(env.key) not in t.busy:
                    t.part_rr = (t.part_rr + i + 1) % k
                    del p.buffer[j]
                    return p, env
                if t.catch_up:
                    break  # only the first buffered message (see _Task.catch_up)
        return None

    def _invoke(self, t: _Task, chosen: tuple[_Partition, Envelope]) -> _Callback:
        part, env = chosen
        seq = t.next_seq
        t.next_seq += 1
        t.processed += 1
        cb = _Callback(self, t, seq, part, env.offset)
        cb.started = self._clock.monotonic()
        if t.track:  # handed to the task: its watermark counts it (rules 33, 35, 38)
            t.event_time.seen(t.parts.index(part), env.timestamp, round(cb.started * 1e9))
            if t.timers.event_due(t.event_time.value):
                self._poke = True  # its timers run before its next message
        if t.keyed:
            cb.key = key_identity(env.key)
            t.busy.add(cb.key)
            for entry in part.order:  # its place in offset order (a few entries in: rule 31)
                if entry[1] == 0 and entry[0] == env.offset:
                    entry[1] = 1
                    cb.entry = entry
                    break
            if t.catch_up and not _taken_ahead(t):
                t.catch_up = False
                t.commit_requested = True  # the commit that found the gap, now it can write
        if self._timeout is not None:
            cb.deadline = _after(self._clock.monotonic(), self._timeout)
        t.unresolved[seq] = cb
        if t.kind == "sync":
            if not self._workers:
                if self._run_sync(t, cb, env, t.coordinator) and t.track:
                    self._done(t, cb)
                return cb
            assert t.worker is not None
            self._workers[t.worker].put((t, cb, env, t.coordinator))
            return cb
        cb.coordinator = Coordinator()
        if t.policy is not None:
            cb.env = env  # a failure's policy needs the envelope (rule 39)
        if self._timeout is not None:
            cb.late_after = time.monotonic() + self.config.callback_timeout_ms / 1000  # real time, as sync
        try:
            if type(env.message) is BadInput:
                cb.bad = True
                raise env.message.error
            t.process(env, t.collector, cb.coordinator, cb)
        except Exception as e:  # noqa: BLE001 - user code
            self._raised(t, cb, e, env)
        finally:
            cb.late_after = 0.0
        if t.track and not cb.raised:
            self._done(t, cb)
        return cb

    def _done(self, t: _Task, cb: _Callback) -> None:
        """The task's call with ``cb``'s message returned (a tracking task; C:
        tr_loop_event_done): an ended partition counts as +infinity once its last message
        was processed (rule 37); a timer that makes due runs before the task's next message."""
        t.event_time.done(t.parts.index(cb.part), round(self._clock.monotonic() * 1e9))
        if t.timers.event_due(t.event_time.value):
            self._poke = True

    def _raised(self, t: _Task, cb: _Callback, e: BaseException, env: Envelope) -> None:
        """process_async raised: its message failed (rule 16), even when the call completed
        its callback first, so the message is never released and the watermark stays below
        it (rules 13, 18). A ``fail()`` made during the call resolved it first: its error is
        the one reported (rule 17, the first resolution wins; as the C engine). A later
        ``complete()`` / ``fail()`` is a second resolution. With task.error.policy skip or
        dead-letter the message completes instead, and a later resolution is dropped."""
        verdict, e = self._decide(t, env, e, None)
        if verdict != FAIL:
            with self._cv:
                resolved = cb._done
                cb._done = True
                cb.abandoned = True
                if not resolved:  # completed now (a completion during the call stands)
                    self._events.append(("done", cb, None))
                    self._cv.notify()
            return
        with self._cv:
            resolved = cb._done  # complete() / fail() during the call: its event is queued
            cb._done = True
        cb.raised = True  # before its event is applied: a completion then holds nothing
        if resolved:
            self._apply_events()  # a fail() first is recorded first
        t.failed += 1
        self._fail(e if cb.bad else TaskError(t.name, cb.part.ssp, cb.offset, e))

    # -- 8. waiting -----------------------------------------------------------
    def _wait(self) -> None:
        """Block until a completion, input, timer, stop or the next deadline (rule 7)."""
        timeout = self.config.max_idle_ms / 1000
        now = self._clock.monotonic()
        wall = self._clock.time()
        for t in self._tasks:
            # A barrier already due waits for completions (which notify), not for time.
            if t.next_commit is not None and t.next_commit > now:
                timeout = min(timeout, t.next_commit - now)
            if not (t.done or self._draining):
                if t.next_window is not None and t.next_window > now:
                    timeout = min(timeout, t.next_window - now)
                due = t.timers.next_due()
                if due is not None and due > wall:
                    timeout = min(timeout, due - wall)
            if self._timeout is not None and t.unresolved:
                timeout = min(timeout, next(iter(t.unresolved.values())).deadline - now)
        if self._draining:
            timeout = min(timeout, self._drain_deadline - now)
        with self._cv:
            if self._events or self._signalled or (self._stop_flag and not self._draining):
                self._signalled = False
                return
            if timeout <= 0:
                return
            self._clock.wait(self._cv, timeout)
            self._signalled = False
        self._metrics.idle_wakeups += 1

    # -- failure and the end --------------------------------------------------
    def _fail(self, error: BaseException) -> None:
        """Record the first failure (rule 16); the loop stops at its next check."""
        if error is self._failure:  # a failed commit, raised again by the drain
            return
        if self._failure is None:
            log.info("stopping on error: %s", error)
            self._failure = error
        else:
            self._further.report(self._failure, error)

    def _drain(self) -> None:
        """Wait for the commits the commit writer holds (JobPlan.drain); a failure stops the run."""
        try:
            self.plan.drain()
        except BaseException as e:  # noqa: BLE001 - recorded; raised by run()
            self._fail(e)

    def _final_commit(self) -> None:
        """Commit every task's low watermark (rule 19); after an error too, never more (rule 18)."""
        for t in self._tasks:
            self._commit(t)  # a failing commit is recorded by _fail, the first error wins

    def _close_tasks(self) -> None:
        for t in self._tasks:
            close = hook(t.instance, "close")
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # user code; close every task regardless
                log.exception("close() of task %r failed", t.name)
                if self._failure is None:
                    self._failure = TaskError(t.name, original=e, phase="close")

    def _stop_pool(self) -> None:
        """Stop the pool threads; one still inside a process call is left running (rule 19).

        The drain already waited task.shutdown.ms for outstanding calls, so a stop is
        bounded: idle threads get a short grace to exit, a stuck one is abandoned (a
        daemon thread; its late completion is dropped, nothing is committed for it).
        """
        for q in self._workers:
            q.put(None)
        deadline = time.monotonic() + _POOL_EXIT_GRACE_S
        stuck = 0
        idle_deadline = deadline + _POOL_IDLE_EXIT_S
        for i, th in enumerate(self._threads):
            th.join(timeout=max(0.0, deadline - time.monotonic()))
            if th.is_alive() and not self._busy[i]:
                # idle, on its way out: a large pool takes longer than the grace to exit
                th.join(timeout=max(0.0, idle_deadline - time.monotonic()))
            stuck += th.is_alive()
        if stuck and self._failure is not None:  # a failure waits for no call (rule 19)
            log.warning(
                "stopped by an error: %d pool thread(s) still inside process; left running, "
                "their messages are not committed",
                stuck,
            )
        elif stuck:
            log.warning(
                "shutdown: %d pool thread(s) still inside process after %s; "
                "left running, their messages are not committed",
                stuck,
                self.config.drain_text(),
            )

    def _head_of_line_ms(self, t: _Task) -> float:
        """Age of the oldest invoked message not yet released (0.0: none; as the C
        engine, measured with task.ordering = key only)."""
        if not t.keyed:
            return 0.0
        cb = t.unresolved.get(t.next_release) or t.held.get(t.next_release)
        if cb is None:
            return 0.0
        return max(0.0, (self._clock.monotonic() - cb.started) * 1000.0)

    def _task_metrics(self, t: _Task) -> TaskMetrics:
        processed, outstanding = t.processed, max(0, t.outstanding)
        if t.kind == "sync" and self._workers:
            # messages queued for the task's pool thread were not invoked yet (rule 2);
            # those begun and not yet released are outstanding
            processed = t.started
            outstanding = max(0, min(outstanding, t.started - (t.processed - outstanding)))
        m = TaskMetrics(
            task=t.name,
            processed=processed,
            completed=t.completed,
            failed=t.failed,
            ignored=t.ignored,
            outstanding=outstanding,
            keys_in_flight=len(t.busy),
            head_of_line_ms=self._head_of_line_ms(t),
            windows=t.windows,
            commits=t.commits,
            timers=t.timer_runs,
            event_time_watermark=watermark_value(t.event_time.value),
            event_time_lag_ms=watermark_lag_ms(t.event_time.value, wall_ms(self._clock)),
        )
        policy = t.plan.policy
        if policy is not None:
            m.skipped, m.dead_lettered, m.retried = policy.skipped, policy.dead_lettered, policy.retried
        m.late = t.plan.late
        for p in list(t.parts):
            if p.committed is not None:
                m.committed[p.ssp] = p.committed
            if p.low_watermark is not None:
                m.low_watermark[p.ssp] = p.low_watermark
            if p.newest_read is not None:
                m.newest_read[p.ssp] = p.newest_read
            m.lag[p.ssp] = partition_lag(p.newest_read, p.committed, p.read_n - p.committed_n)
        return m


__all__ = ["ReferenceEngine"]
