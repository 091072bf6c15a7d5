"""The C engine: the dispatch loop of ``csrc/src/loop.c`` driven through ``tailrace._core``.

The C loop decides what runs next (completions, release, watermarks, barriers,
timers, round robin); the compiled batch executor (``_core.LoopRunner``) runs
process calls and input polling with the GIL taken once per batch. The rarely
run operations (window, commit, timers, end of stream) are the methods
``on_*`` below, called from that executor on the loop thread.

Behaviour matches the reference engine (``engine/reference.py``) decision for
decision, including where SEMANTICS.md leaves room: commits write only when a
watermark moved (or, with state stores, when they hold uncommitted writes, and then
only with nothing unreleased: docs/state.md), ``commits`` counts store writes, requests from window, timers
and end of stream take effect at once, a task at end of stream counts as having
voted for shutdown, and a failure stops the loop at once, then each task's low
watermark is committed and every task is closed before the error is raised.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from .._core import COMMIT_ALL, COMMIT_CURRENT, Coordinator, LoopRunner, _PartState, _TaskSlot, wall_ms
from ..api import hook
from ..clock import Clock, ManualClock
from ..container import JobPlan
from ..errors import CallbackTimeoutError, TailraceError, TaskError
from ..metrics import ContainerMetrics, RunResult, TaskMetrics, partition_lag
from ..stores import Journal
from .event_time import END as ET_END
from .event_time import watermark_lag_ms, watermark_value
from .failures import FurtherErrors
from .timers import EventTimers, TimerHeap, before_window, check_event_time, early_commit
from .watchdog import StuckCallWatch

log = logging.getLogger("tailrace.engine.native")

# seconds: on real time the C timer (CLOCK_MONOTONIC) and time.time() disagree by rounding
# only; virtual time has none (ManualClock.reading_at puts the C deadline on the first
# nanosecond at which time() reaches a timer, so a timer never fires early)
_TIMER_SLACK = 0.0002


class _Timers:
    """Per-task one-shot timers (rule 23): the TimerService of TaskContext.

    ``schedule``/``cancel`` from any thread; each change tells the C loop the
    earliest due time, which wakes it (tr_loop_set_user_timer).
    """

    def __init__(self, runner: LoopRunner | None, index: int, clock: Clock, events: EventTimers) -> None:
        self._lock = threading.Lock()
        self._timers = TimerHeap()
        self.events = events  # event-time timers (rule 38)
        self.runner = runner
        self.index = index
        self._clock = clock

    def now(self) -> float:
        """The run's clock in epoch seconds (``context.now()``)."""
        return self._clock.time()

    def _publish(self, not_before: int = 0) -> None:
        # lock held: the latest call into the loop carries the latest earliest time
        if self.runner is not None:
            self.runner.set_user_timer(self.index, self._timers.earliest(), not_before)

    def schedule(self, key: Any, when: float, fn: Callable[..., Any]) -> None:
        with self._lock:
            self._timers.push(key, when, fn)
            self._publish()

    def cancel(self, key: Any) -> bool:
        with self._lock:
            found = self._timers.remove(key)
            if found:
                self._publish()
            return found

    def schedule_event_time(self, key: Any, when_ms: int | float, fn: Callable[..., Any] | None) -> None:
        when_ms = check_event_time(key, when_ms)
        with self._lock:
            self.events.schedule(key, when_ms, fn)
            self._publish_events()

    def cancel_event_time(self, key: Any) -> bool:
        with self._lock:
            found = self.events.cancel(key)
            if found:
                self._publish_events()
            return found

    def _publish_events(self) -> None:
        # lock held, as _publish
        if self.runner is not None:
            self.runner.set_event_timer(self.index, self.events.earliest())

    def pop_event_due(self, watermark: int | float) -> list[tuple[Any, float, Callable[..., Any]]]:
        """Remove and return the event-time timers due at ``watermark``, in time order; the
        loop then watches for the next one."""
        with self._lock:
            due = self.events.pop_due(watermark)
            self._publish_events()
        return due

    def pop_due(self, now: float, not_before: int = 0) -> list[tuple[Any, Callable[..., Any]]]:
        """Remove and return the timers due at ``now``, in time order; the loop is woken for
        the rest not before its clock reads ``not_before`` (ns)."""
        with self._lock:
            due = self._timers.pop_due(now)
            self._publish(not_before)
        return due


class NativeEngine:
    """The C run loop for "sync" and "async" tasks (SEMANTICS.md).

    ``run()`` blocks on the calling thread (the GIL is released while the loop
    waits); ``stop()`` and ``metrics()`` are safe from any thread, ``stop()``
    also from a signal handler.
    """

    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self.config = cfg = plan.config
        self._slots: list[_TaskSlot] = []
        self._windows: list[Callable[..., Any] | None] = []
        self._timers: list[_Timers] = []
        for tp in plan.tasks:
            parts = [_PartState(s, r, tp.start_offsets.get(s)) for s, r in zip(tp.partitions, tp.readers)]
            process = tp.task.process if tp.kind == "sync" else tp.task.process_async
            slot = _TaskSlot(tp.name, tp, process, tp.collector, tp.kind == "async", parts)
            if tp.policy is not None and tp.policy.active:
                slot.policy = tp.policy
            slot.timestamps = tp.timestamps
            slot.et_track = tp.event_tracking
            slot.part_index = {(s.stream, s.partition): j for j, s in enumerate(tp.partitions)}
            if tp.stores and tp.kind == "sync":
                # its store writes are recorded per invocation: a failed message's are undone,
                # so a skipped one leaves none and a failed one costs no commit (rules 39, 40)
                slot.journal = Journal()
            self._slots.append(slot)
            self._windows.append(hook(tp.task, "window") if cfg.window_ms > 0 else None)
            self._timers.append(_Timers(None, tp.index, plan.clock, tp.event_timers()))
        self._clock = plan.clock
        self._timer_slack = 0.0 if plan.clock.manual else _TIMER_SLACK
        self._runner = LoopRunner(self._slots, self, cfg, [w is not None for w in self._windows], plan.clock)
        for tp, timers in zip(plan.tasks, self._timers):
            timers.runner = self._runner
            tp.early_commit(early_commit(timers.schedule))
        for i, tp in enumerate(plan.tasks):
            if tp.event_time_floor is not None:  # rule 33: at least its committed value
                self._runner.event_floor(i, tp.event_time_floor)
        if plan.writer is not None:  # a failed commit stops the loop at once (any thread)
            plan.writer.on_error = self._runner.post_error
        self._ran = False
        self._failure: BaseException | None = None
        self._further = FurtherErrors((tp.name for tp in plan.tasks), log)
        self._reason = "stop"
        self._final_seen = False  # the final commits began (on_commit)

    # -- Engine protocol ---------------------------------------------------------
    def stop(self) -> None:
        """Request a graceful stop (rule 19); wakes a parked loop. Any thread, signal handlers."""
        self._runner.stop()

    def metrics(self) -> tuple[dict[str, TaskMetrics], ContainerMetrics]:
        """A snapshot of task and container metrics; safe from any thread."""
        chosen, wakeups, iterations, _ = self._runner.stats()
        tasks = {s.name: self._task_metrics(i) for i, s in enumerate(self._slots)}
        return tasks, ContainerMetrics(chosen, wakeups, iterations)

    def run(self) -> RunResult:
        """Run until end of stream, shutdown, stop or error (raises TaskError)."""
        if self._ran:
            raise TailraceError("NativeEngine.run() may be called once")
        self._ran = True
        clock = self._clock
        started = clock.monotonic()
        idle = self._runner.idle
        manual = clock if isinstance(clock, ManualClock) else None
        if manual is not None:  # a test driver's virtual time: it moves the C loop's clock
            manual.attach(idle, self._runner.clock_moved)
        try:
            if self._start():
                self._loop()
            if self._failure is not None:
                self._final_commit()  # the low watermark, never past a failure (rules 18, 19)
            try:
                self.plan.drain()  # every commit the commit writer holds is durable
            except BaseException as e:  # noqa: BLE001 - recorded; raised below
                self._fail(e)
        finally:
            self._close_tasks()
            if manual is not None:
                manual.detach(idle)
        if self._failure is not None:
            raise self._failure
        tasks, container = self.metrics()
        committed = {p.ssp: p.committed for s in self._slots for p in s.parts if p.committed is not None}
        return RunResult(tasks, container, committed, self._reason, clock.monotonic() - started)

    # -- start, loop, end -------------------------------------------------------------
    def _start(self) -> bool:
        runner = self._runner
        for i, s in enumerate(self._slots):
            for j, p in enumerate(s.parts):
                p.reader.start(p.committed, runner.waker(i, j))
        for i, s in enumerate(self._slots):
            init = hook(s.plan.task, "init")
            timers = self._timers[i]
            try:
                with timers._lock:
                    timers.events.restore()  # durable event-time timers (rule 38)
                    timers._publish_events()
                # every task gets its context before its first message (declared windows
                # bind to it), init or not
                context = s.plan.make_context(
                    self.config,
                    timers,
                    functools.partial(self._task_metrics, i),
                    watermark=functools.partial(runner.event_watermark, i),
                )
                fast = s.plan.windows_process(self.config)
                if fast is not None:
                    s.process = fast  # its window's add, without StreamTask.process around it
                if init is not None:
                    init(context)
            except Exception as e:  # noqa: BLE001 - user code
                self._fail(TaskError(s.name, original=e, phase="init"))
                return False
        return True

    def _loop(self) -> None:
        runner = self._runner
        ms = self.config.callback_timeout_ms
        watch = StuckCallWatch(ms, threading.get_ident()) if ms > 0 else None
        runner.watch = watch
        try:
            reason = runner.run()
        finally:
            if watch is not None:
                watch.close()
        error = runner.take_error()
        if reason == "timeout":
            t, ssp, offset = runner.timeout_info()
            slot = self._slots[t]
            slot.failed += 1
            ms = self.config.callback_timeout_ms
            error = CallbackTimeoutError(
                slot.name,
                ssp,
                offset,
                TimeoutError(f"callback not completed within task.callback.timeout.ms={ms}"),
            )
        if error is not None:
            self._fail(error)
        elif reason == "error":
            self._fail(TailraceError("the dispatch loop stopped with an error but recorded none"))
        else:
            self._reason = reason

    def _fail(self, error: BaseException) -> None:
        if error is self._failure:  # a failed commit (the writer posted it), raised again later
            return
        if self._failure is None:
            log.info("stopping on error: %s", error)
            self._failure = error
        else:
            self._further.report(self._failure, error)

    def _final_commit(self) -> None:
        for i in range(len(self._slots)):
            try:
                self._commit(i)
            except BaseException as e:  # noqa: BLE001 - the first error wins
                self._fail(e)

    def _close_tasks(self) -> None:
        for s in self._slots:
            close = hook(s.plan.task, "close")
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # user code; close every task regardless
                log.exception("close() of task %r failed", s.name)
                if self._failure is None:
                    self._failure = TaskError(s.name, original=e, phase="close")

    # -- operations the C loop hands over (loop thread) ------------------------------
    def _refresh(self, i: int) -> None:
        for j, p in enumerate(self._slots[i].parts):
            mark = self._runner.watermark(i, j)
            if mark is not None:
                p.released_n, p.low_watermark = mark

    def _commit(self, i: int) -> None:
        """Write each partition's low watermark when one moved (rules 9, 10, 12, 13). Raises."""
        s = self._slots[i]
        self._refresh(i)
        parts = s.parts
        if s.plan.exact:
            # Stores, or exactly-once outputs (rule 41): a commit writes offsets and state
            # (and held outputs) together, so it runs only when they hold exactly the
            # released prefix (rule 27): nothing invoked and unreleased (a pool's
            # handed-back ops were never invoked), and with key ordering nothing taken
            # ahead of a message still buffered. Otherwise (a held tail after a commit
            # request, the final commit after a failure, a look-ahead the task now catches
            # up on) it writes nothing; the next commit carries it.
            if not self._runner.settled(i):
                return
            if not s.plan.state_dirty() and not any(p.low_watermark != p.committed for p in parts):
                return
        elif not any(p.low_watermark != p.committed for p in parts):
            return
        offsets = {p.ssp: p.low_watermark for p in parts if p.low_watermark is not None}
        try:
            self.plan.commit(s.plan, offsets, self._runner.event_watermark(i))
        except TailraceError:
            raise
        except Exception as e:
            raise TaskError(s.name, original=e, phase="commit") from e
        for p in parts:
            p.committed = p.low_watermark
            p.committed_n = p.released_n
        s.commits += 1

    def on_commit(self, i: int, final: bool) -> int:
        if final and not self._final_seen:  # the first of the final commits: the drain is over
            self._final_seen = True
            outstanding = sum(self._runner.task_stats(t)[2] for t in range(len(self._slots)))
            if outstanding and self._failure is None:
                log.warning(
                    "shutdown: %d callbacks still outstanding after %s; committing low watermarks",
                    outstanding,
                    self.config.drain_text(),
                )
        try:
            self._commit(i)
        except BaseException as e:  # noqa: BLE001 - recorded; stops the loop
            self._runner.post_error(e)
        return 0

    def on_window(self, i: int) -> int:
        s = self._slots[i]
        window = self._windows[i]
        if window is None:
            return 0
        coordinator = Coordinator()
        try:
            window(s.collector, coordinator)
        except Exception as e:  # noqa: BLE001 - user code
            if self.config.ignores(e):
                s.ignored += 1
            else:
                self._runner.post_error(TaskError(s.name, original=e, phase="window"))
                return 0
        return coordinator.take()

    def on_timer(self, i: int, window_ns: int | None = None) -> int:
        """Run task i's due timers. With a window of the task due too (since the loop's
        clock read ``window_ns``), only those due before it: the window runs next, then the
        rest (rules 8, 23: in the order they fell due, a window and a timer due at one
        instant: the window first). The loop is woken for the rest not before the window."""
        s = self._slots[i]
        requests = 0
        clock = self._clock
        limit = clock.time() + self._timer_slack
        not_before = 0
        if window_ns is not None:
            limit = min(limit, before_window(clock, window_ns, self._runner.clock_time_of(window_ns)))
            not_before = window_ns
        for key, fn in self._timers[i].pop_due(limit, not_before):
            coordinator = Coordinator()
            s.timers += 1  # each timer counts, as on the reference engine (one op fires all due)
            try:
                fn(key, s.collector, coordinator)
            except Exception as e:  # noqa: BLE001 - user code
                self._runner.post_error(
                    TaskError(s.name, original=e, phase="timer", detail=f"timer {key!r}: {e!r}")
                )
                return 0
            requests |= coordinator.take()
        more = self._event_timers(i, self._runner.event_watermark(i))
        return 0 if more < 0 else requests | more

    def _event_timers(self, i: int, raw: int) -> int:
        """Run task i's event-time timers due at its watermark ``raw`` (C's ms; rules 35, 38),
        in time order, until none is: a timer may set another that is due already. Their
        requests, or -1 when one raised (the loop stops)."""
        s = self._slots[i]
        watermark = watermark_value(raw)
        requests = 0
        while True:
            due = self._timers[i].pop_event_due(watermark)
            if not due:
                return requests
            for key, when, fn in due:
                coordinator = Coordinator()
                s.timers += 1
                try:
                    fn(key, when, s.collector, coordinator)
                except Exception as e:  # noqa: BLE001 - user code
                    self._runner.post_error(
                        TaskError(
                            s.name, original=e, phase="timer", detail=f"event-time timer {key!r}: {e!r}"
                        )
                    )
                    return -1
                requests |= coordinator.take()

    def on_end_of_stream(self, i: int) -> int:
        s = self._slots[i]
        # rule 37: every input ended, the watermark is +infinity: open windows close and the
        # event-time timers fire before end_of_stream
        requests = self._event_timers(i, ET_END)
        if requests < 0:
            return 0
        eos = hook(s.plan.task, "end_of_stream")
        if eos is not None:
            coordinator = Coordinator()
            try:
                eos(s.collector, coordinator)
            except Exception as e:  # noqa: BLE001 - user code
                self._runner.post_error(TaskError(s.name, original=e, phase="end_of_stream"))
                return 0
            requests |= coordinator.take()
        if requests & (COMMIT_CURRENT | COMMIT_ALL):  # the hook's own commit runs before the task is done
            try:
                self._commit(i)
            except BaseException as e:  # noqa: BLE001 - recorded; stops the loop
                self._runner.post_error(e)
                return 0
        return requests & ~COMMIT_CURRENT

    # -- metrics -----------------------------------------------------------------------
    def _task_metrics(self, i: int) -> TaskMetrics:
        s = self._slots[i]
        processed, completed, outstanding, windows, _ = self._runner.task_stats(i)
        keys_in_flight, head_of_line_ms = self._runner.key_stats(i)
        m = TaskMetrics(
            task=s.name,
            processed=processed,
            completed=completed,
            failed=s.failed,
            ignored=s.ignored,
            outstanding=outstanding,
            windows=windows,
            commits=s.commits,
            timers=s.timers,
            keys_in_flight=keys_in_flight,
            head_of_line_ms=head_of_line_ms,
        )
        raw = self._runner.event_watermark(i)
        m.event_time_watermark = watermark_value(raw)
        m.event_time_lag_ms = watermark_lag_ms(raw, wall_ms(self._clock))
        policy = s.plan.policy
        if policy is not None:
            m.skipped, m.dead_lettered, m.retried = policy.skipped, policy.dead_lettered, policy.retried
        m.late = s.plan.late
        for j, p in enumerate(list(s.parts)):
            mark = self._runner.watermark(i, j)
            low = p.low_watermark if mark is None or mark[1] is None else mark[1]
            if p.committed is not None:
                m.committed[p.ssp] = p.committed
            if low is not None:
                m.low_watermark[p.ssp] = low
            if p.newest_read is not None:
                m.newest_read[p.ssp] = p.newest_read
            m.lag[p.ssp] = partition_lag(p.newest_read, p.committed, p.read_n - p.committed_n)
        return m


__all__ = ["NativeEngine"]
