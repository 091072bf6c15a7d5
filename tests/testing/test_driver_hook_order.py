"""Windows, timers and commits that fall due in one step of virtual time: they run in the order
they fell due (commits first), before end of stream, and none runs once a shutdown of the
container took effect (rules 8, 9, 11, 14, 19, 23; docs/testing.md: ``advance``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import tailrace
from tailrace.memory import MemoryCheckpointStore
from tailrace.testing import TestDriver
from tailrace.types import Offset, Scope, SystemStreamPartition


@pytest.fixture(params=["python", "c"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class LoggingStore(MemoryCheckpointStore):
    """Logs each checkpoint write into the task's log, between its hooks."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def write(
        self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset], state: Any = None
    ) -> None:
        self.log.append("commit")
        super().write(task_name, offsets, state)


def timers_and_window(log: list[str], timer_ms: list[int]) -> type[tailrace.StreamTask]:
    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.context = context
            for ms in timer_ms:
                context.schedule(ms, context.now() + ms / 1000, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            log.append("process")

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            log.append(f"timer {key}")

        def window(self, collector: Any, coordinator: Any) -> None:
            log.append("window")

    return Task


@pytest.mark.parametrize(
    ("timer_ms", "expected"),
    [
        ([40], ["timer 40", "window"]),
        ([50], ["window", "timer 50"]),  # due at one instant: the window first
        ([60], ["window", "timer 60"]),
        ([20, 45, 55, 65], ["timer 20", "timer 45", "window", "timer 55", "timer 65"]),
    ],
)
def test_a_window_and_timers_due_in_one_advance_run_in_the_order_they_fell_due(
    engine: str, timer_ms: list[int], expected: list[str]
) -> None:  # rules 8, 23; docs/testing.md: advance runs them in time order
    log: list[str] = []
    with TestDriver(
        timers_and_window(log, timer_ms), inputs={"in": 1}, config={"task.window.ms": 50}, engine=engine
    ) as d:
        d.advance(70)
        assert log == expected


def test_commits_run_before_the_windows_and_timers_due_with_them(engine: str) -> None:  # rules 9, 23
    log: list[str] = []
    store = LoggingStore(log)
    config = {"task.window.ms": 50, "task.commit.ms": 45}
    with TestDriver(
        timers_and_window(log, [40, 60]), inputs={"in": 1}, config=config, engine=engine, checkpoints=store
    ) as d:
        d.send("in", "m")
        d.advance(70)
        assert log == ["process", "commit", "timer 40", "window", "timer 60"]


def test_a_window_coalesced_over_periods_is_ordered_by_its_first_due_time(engine: str) -> None:  # rules 8, 23
    log: list[str] = []
    with TestDriver(
        timers_and_window(log, [70]), inputs={"in": 1}, config={"task.window.ms": 50}, engine=engine
    ) as d:
        d.advance(120)  # the window fell due at 50 (and 100: coalesced), the timer at 70
        assert log == ["window", "timer 70"]


@pytest.mark.parametrize("commit_ms", [100, -1])
def test_a_window_and_timer_held_back_by_a_callback_run_before_end_of_stream(
    engine: str, commit_ms: int
) -> None:
    # rules 8, 11, 23: a window, a timer and a commit fall due while a callback is outstanding;
    # the input ends, then the callback completes: the commit runs, then the window and the
    # timer, then end of stream (the reference engine ran the commit, then end of stream, and
    # dropped the window and the timer)
    log: list[str] = []

    class Task(tailrace.AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            log.append("process")
            self.context.schedule("t", self.context.now() + 0.077, self.fire)

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            log.append("timer")

        def window(self, collector: Any, coordinator: Any) -> None:
            log.append("window")

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            log.append("end_of_stream")

    config = {"task.window.ms": 50, "task.commit.ms": commit_ms}
    with TestDriver(Task, inputs={"in": 1}, config=config, engine=engine) as d:
        d.send("in", "m")  # outstanding; the timer is due at 77 ms
        d.advance(150)  # window (50), timer (77) and commit (100) fall due, all held back
        assert log == ["process"]
        d.end_input()
        d.pending[0].complete()
        assert log == ["process", "window", "timer", "end_of_stream"]
        assert d.result is not None and d.result.reason == "end_of_stream"
    assert d.committed_offset("in") == 0


@pytest.mark.parametrize(
    ("timer_ms", "asks", "expected"),
    [
        (60, "window", ["window", "close"]),  # the window (50) asks: the timer (60) does not run
        (40, "timer", ["timer", "close"]),  # the timer (40) asks: the window (50) does not run
    ],
)
def test_no_window_or_timer_runs_after_a_shutdown_of_the_container(
    engine: str, timer_ms: int, asks: str, expected: list[str]
) -> None:
    # rules 14, 19: shutdown(ALL_TASKS_IN_CONTAINER) from a window or timer takes effect at
    # once; the window or timer due with it does not run (the reference engine ran the timer)
    log: list[str] = []

    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            context.schedule("t", context.now() + timer_ms / 1000, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            log.append("timer")
            if asks == "timer":
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

        def window(self, collector: Any, coordinator: Any) -> None:
            log.append("window")
            if asks == "window":
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

        def close(self) -> None:
            log.append("close")

    d = TestDriver(Task, inputs={"in": 1}, config={"task.window.ms": 50}, engine=engine)
    d.advance(70)  # both due
    result = d.close()
    assert result is not None and result.reason == "shutdown"
    assert log == expected


@pytest.mark.parametrize("start", [1_700_000_000.0, 1_700_000_000.123456, 1_234_567_890.98, 0.0, 3e9 + 0.1])
def test_a_timer_at_the_window_s_instant_runs_after_it_whatever_the_clock_s_start(
    engine: str, start: float
) -> None:
    # rules 8, 23: epoch seconds are ~240 ns apart, so the first nanosecond at which time()
    # reaches "now + 0.05" can come before the window's 50 ms: the C loop then ran the timer
    # first. At one instant the window runs first, step after step
    log: list[str] = []

    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.context = context
            for k in range(1, 6):
                context.schedule(k, context.now() + k * 50 / 1000, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            log.append(f"timer {key}")

        def window(self, collector: Any, coordinator: Any) -> None:
            log.append("window")

    with TestDriver(Task, inputs={"in": 1}, config={"task.window.ms": 50}, engine=engine, start=start) as d:
        for k in range(1, 6):
            d.advance(50)
            assert log[-2:] == ["window", f"timer {k}"], log


@pytest.mark.parametrize("hook", ["window", "timer"])
def test_a_window_or_timer_that_raises_counts_as_run(engine: str, hook: str) -> None:
    # "Metrics that must exist" (windows): the C engine counted a window or timer that raised,
    # the reference engine did not; both count it now (it ran), and the run fails (rule 16)
    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            context.schedule("t", context.now() + 0.05, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            if hook == "timer":
                raise ValueError("timer broke")

        def window(self, collector: Any, coordinator: Any) -> None:
            if hook == "window":
                raise ValueError("window broke")

    config = {"task.window.ms": 50 if hook == "window" else 60}
    d = TestDriver(Task, inputs={"in": 1}, config=config, engine=engine)
    with pytest.raises(tailrace.TaskError, match=f"{hook} broke"):
        d.advance(50)
    m = d.metrics()[0]["Partition 0"]
    assert (m.windows, m.timers) == ((1, 0) if hook == "window" else (0, 1))


def test_a_window_that_asks_commit_all_then_shutdown_all_stops_after_the_commits(engine: str) -> None:
    # rule 14: shutdown ALL stops the container after the pending commit requests ran. Both
    # tasks' windows fall due at once; the C loop dropped the second (rules 14, 19) without
    # queueing its commit, and its drain then waited for that commit for ever
    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.name = context.task_name

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def window(self, collector: Any, coordinator: Any) -> None:
            if self.name == "Partition 0":
                coordinator.commit(Scope.ALL_TASKS_IN_CONTAINER)
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    d = TestDriver(Task, inputs={"in": 2}, config={"task.window.ms": 50, "task.commit.ms": -1}, engine=engine)
    d.send("in", "a", partition=0)
    d.send("in", "b", partition=1)
    d.advance(50)
    assert not d.running
    result = d.close()
    assert result is not None and result.reason == "shutdown"
    assert d.committed_offset("in", 0) == 0 and d.committed_offset("in", 1) == 0


@pytest.mark.parametrize("timer", ["due at 50 ms", "set by the window for now"])
def test_what_fell_due_runs_task_by_task(engine: str, timer: str) -> None:
    # docs/testing.md: what fell due within one advance runs task by task. The C loop ran one
    # hook per task per batch: task 0's timer, task 1's window, then task 0's window
    log: list[tuple[str, str]] = []

    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.context = context
            self.name = context.task_name
            if self.name == "Partition 0" and timer == "due at 50 ms":
                context.schedule("t", context.now() + 0.05, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            log.append((self.name, "timer"))

        def window(self, collector: Any, coordinator: Any) -> None:
            log.append((self.name, "window"))
            if self.name == "Partition 0" and timer == "set by the window for now":
                self.context.schedule("t", self.context.now(), self.fire)

    with TestDriver(Task, inputs={"in": 2}, config={"task.window.ms": 100}, engine=engine) as d:
        d.advance(200)
    p0 = [("Partition 0", "timer"), ("Partition 0", "window")]
    expected = p0 if timer == "due at 50 ms" else p0[::-1]
    assert log == [*expected, ("Partition 1", "window")]


@pytest.mark.parametrize("change", ["cancel", "reschedule"])
def test_a_due_timer_cancelled_or_moved_later_holds_its_task_back_no_more(engine: str, change: str) -> None:
    # rules 8, 23: a due timer waits for the outstanding callback and holds back new messages;
    # cancelled, or re-registered for later, nothing is due: the next message is dispatched
    # (the C engine held the task back until the outstanding callback completed; the reference
    # engine, after a cancel, until the next advance)
    fired: list[str] = []

    class Task(tailrace.AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            pass  # completed by the test

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            fired.append(key)

    with TestDriver(Task, inputs={"in": 1}, engine=engine, config={"task.max.concurrency": 2}) as driver:
        driver.send("in", "A")
        task = driver.tasks[0]
        context = task.context  # type: ignore[attr-defined]
        context.schedule("t", context.now() + 0.1, task.fire)  # type: ignore[attr-defined]
        driver.advance(100)  # due, waiting for A
        driver.send("in", "B")
        assert [p.message for p in driver.pending] == ["A"]  # held back by the due timer
        if change == "cancel":
            assert context.cancel("t")
        else:
            context.schedule("t", context.now() + 0.05, task.fire)  # type: ignore[attr-defined]
        driver.settle()
        assert [p.message for p in driver.pending] == ["A", "B"]
        assert fired == []
        driver.pending[0].complete()
        driver.pending[0].complete()
        driver.advance(100)
        assert fired == ([] if change == "cancel" else ["t"])


def test_ends_of_stream_of_one_end_input_all_run_before_a_shutdown_all_of_one_of_them(engine: str) -> None:
    # rules 11, 14 and docs/testing.md (deterministic): end_input() ends every partition at
    # once; every task's end_of_stream runs, then the shutdown ALL asked by the first ends the
    # run, every time (the C engine skipped the others' now and then: the partitions' wake-ups
    # reached the loop one by one, and the first task's end of stream ran before the others'
    # partitions were seen to end)
    seen: dict[tuple[str, tuple[str, ...]], int] = {}
    log: list[str] = []

    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.name = context.task_name

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            log.append(self.name)
            if self.name == "Partition 0":
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    for _ in range(60):
        log.clear()
        with TestDriver(Task, inputs={"in": 3}, engine=engine) as driver:
            driver.start()
            result = driver.end_input()
            assert result is not None
            key = (result.reason, tuple(log))
            seen[key] = seen.get(key, 0) + 1
    assert seen == {("end_of_stream", ("Partition 0", "Partition 1", "Partition 2")): 60}


@pytest.mark.parametrize("window", [True, False])
def test_a_timer_due_now_set_by_process_holds_back_the_messages_after_it(engine: str, window: bool) -> None:
    # rules 8, 23: once a timer is due, no new message of its task is invoked until it ran.
    # With several messages dispatched in one pass (task.max.concurrency 4, after a completion
    # or a window), the C loop invoked those after the one whose process set the timer
    log: list[str] = []

    class Task(tailrace.AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            log.append(envelope.message)
            if envelope.message == "B":
                self.context.schedule("now", self.context.now(), self.fire)

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            log.append("timer")

        def window(self, collector: Any, coordinator: Any) -> None:
            log.append("window")

    config: dict[str, Any] = {"task.max.concurrency": 4}
    if window:
        config["task.window.ms"] = 50
    with TestDriver(Task, inputs={"in": 1}, engine=engine, config=config) as driver:
        driver.send("in", "A")
        driver.advance(50)  # the window (if any) is due, waiting for A
        for message in "BCDEF":
            driver.system.append("in", 0, message)
        driver.settle()
        driver.pending[0].complete()  # A done: the window runs, then B; B's timer is due at once
        assert log == ["A", "window", "B"] if window else ["A", "B"]
        driver.pending[0].complete()  # B done: the timer runs, then C, D, E, F
        assert log[-5:] == ["timer", "C", "D", "E", "F"]


def test_a_timer_set_for_now_by_a_timer_runs_before_the_next_task_s_timers(engine: str) -> None:
    # docs/testing.md: what falls due within one advance runs task by task; a timer function
    # that sets its own key again for context.now() fell due then, so it runs before the next
    # task's timers (and before a shutdown ALL those ask for). The reference engine deferred
    # it to its next pass: the tasks' timers interleaved, and a shutdown of the second task
    # left the first task's second firing out
    log: list[str] = []

    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.context = context
            self.n = 0
            context.schedule("a", context.now() + 0.1, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            p = self.context.partitions[0].partition
            log.append(f"t{p}:{self.n}")
            self.n += 1
            if p == 0 and self.n < 3:
                self.context.schedule("a", self.context.now(), self.fire)
            if p == 1:
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    with TestDriver(Task, inputs={"in": 2}, engine=engine) as driver:
        driver.advance(100)
        assert driver.result is not None and driver.result.reason == "shutdown"
    assert log == ["t0:0", "t0:1", "t0:2", "t1:0"]


@pytest.mark.parametrize("stop", [False, True])
def test_a_commit_asked_by_a_timer_runs_before_the_other_tasks_hooks_on_both_engines(
    engine: str, stop: bool
) -> None:
    # one order on both engines: task 0's timer asks a commit; its commit runs first, then the
    # hooks due go on in task order from task 0 again, as the C loop builds them: task 1's
    # window (which may stop the container), then task 0's. The reference engine ran task 0's
    # window before task 1's after this session's first change (task by task), unlike C
    order: list[str] = []

    class Task(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.p = int(context.task_name[-1])
            if self.p == 0:
                context.schedule("b", context.now() + 0.11, self.timer)

        def timer(self, key: Any, collector: Any, coordinator: Any) -> None:
            order.append(f"timer{self.p}")
            coordinator.commit(Scope.CURRENT_TASK)

        def window(self, collector: Any, coordinator: Any) -> None:
            order.append(f"window{self.p}")
            if self.p == 1 and stop:
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    with TestDriver(Task, inputs={"in": 2}, config={"task.window.ms": 150}, engine=engine) as driver:
        driver.advance(150)
        assert order == (["timer0", "window1"] if stop else ["timer0", "window1", "window0"])
        assert driver.running is not stop
