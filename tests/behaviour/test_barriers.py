"""Window, commit, end of stream and timers: barriers (rules 8-11, 23)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    MemoryCheckpointStore,
    MemorySystem,
    Scope,
    StreamTask,
    SystemStreamPartition,
    TaskError,
)

from .helpers import HeldCallbacks, bounded, history_of, run_job, ssp, start, wait_until


class InflightStore(MemoryCheckpointStore):
    """A memory store that records, at each write, what the test says is in flight."""

    def __init__(self, inflight: Any) -> None:
        super().__init__()
        self.inflight = inflight
        self.at_write: list[tuple[str, dict[SystemStreamPartition, Any], Any]] = []

    def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Any]) -> None:
        self.at_write.append((task_name, dict(offsets), self.inflight()))
        super().write(task_name, offsets)


def test_window_called_exactly_n_times_then_shutdown_from_window(engine: str) -> None:
    # rule 8 (Samza: window N times, then shutdown requested from the window)
    class Task(StreamTask):
        windows = 0

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def window(self, collector: Any, coordinator: Any) -> None:
            Task.windows += 1
            if Task.windows == 5:
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    system = MemorySystem().add_live_stream("in", 1)
    result, _ = run_job(engine, Task, system, task_window_ms=1)
    assert Task.windows == 5
    assert result.reason == "shutdown"
    assert result.tasks["Partition 0"].windows == 5


def test_window_runs_only_with_nothing_outstanding(engine: str) -> None:
    # rule 8: every earlier process happens-before window; window happens-before later ones
    lock = threading.Lock()
    state = {"outstanding": 0, "bad": 0, "windows": 0, "in_window": False}

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            with lock:
                state["bad"] += state["in_window"]
                state["outstanding"] += 1

            def done() -> None:
                with lock:
                    state["outstanding"] -= 1
                callback.complete()

            threading.Timer(0.0005, done).start()

        def window(self, collector: Any, coordinator: Any) -> None:
            with lock:
                state["in_window"] = True
                state["bad"] += state["outstanding"] != 0
                state["windows"] += 1
            time.sleep(0.001)
            with lock:
                state["in_window"] = False

    result, _ = run_job(engine, Task, bounded([list(range(300))]), task_window_ms=2, task_max_concurrency=4)
    assert result.processed == 300
    assert state["windows"] >= 1
    assert state["bad"] == 0


def test_timer_commits_only_with_nothing_outstanding(engine: str) -> None:
    # rule 9: without async commit, a commit runs only when the task has nothing outstanding
    lock = threading.Lock()
    pending: set[int] = set()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            with lock:
                pending.add(envelope.offset)

            def done() -> None:
                with lock:
                    pending.discard(envelope.offset)
                callback.complete()

            threading.Timer(0.0005 * (envelope.offset % 4), done).start()

    def snapshot() -> frozenset[int]:
        with lock:
            return frozenset(pending)

    store = InflightStore(snapshot)
    result, _ = run_job(
        engine, Task, bounded([list(range(400))]), store=store, task_commit_ms=1, task_max_concurrency=4
    )
    assert len(store.at_write) >= 2
    last = -1
    for _, offsets, inflight in store.at_write:
        assert not inflight
        assert offsets[ssp(0)] >= last  # rule 13: never backwards
        last = offsets[ssp(0)]
    assert result.committed[ssp(0)] == 399


def test_async_commit_runs_while_a_message_is_in_flight(engine: str) -> None:
    # rule 10 (Samza: async commit while a callback is outstanding writes the low watermark)
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.offset == 0:
                coordinator.commit()
            held.add(0, envelope.offset, callback)

    store = MemoryCheckpointStore()
    bg, _ = start(
        engine, Task, bounded([[0, 1]]), store=store, task_max_concurrency=2, task_async_commit=True
    )
    held.wait_for((0, 1))
    held.complete(0, 0)
    wait_until(lambda: len(store.history) >= 1, what="commit while offset 1 is in flight")
    assert store.history[0] == ("Partition 0", {ssp(0): 0})
    held.complete(0, 1)
    result = bg.join()
    assert result.committed == {ssp(0): 1}


def test_end_of_stream_several_tasks_several_partitions(engine: str) -> None:
    # rule 11: every partition of a task exhausted -> end_of_stream once -> task done -> container stops
    eos: list[tuple[str, int]] = []
    lock = threading.Lock()

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.name = context.task_name
            self.count = 0

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            assert isinstance(envelope.offset, int)
            self.count += 1

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            with lock:
                eos.append((self.name, self.count))

    system = MemorySystem().add_stream("a", [list(range(n)) for n in (10, 20, 0)])
    system.add_stream("b", [list(range(n)) for n in (5, 0, 7)])
    result, _ = run_job(engine, Task, system, inputs=["mem.a", "mem.b"])
    assert result.reason == "end_of_stream"
    assert sorted(eos) == [("Partition 0", 15), ("Partition 1", 20), ("Partition 2", 7)]
    assert result.committed == {
        ssp(0, "a"): 9,
        ssp(1, "a"): 19,
        ssp(0, "b"): 4,
        ssp(2, "b"): 6,
    }


def test_end_of_stream_waits_for_in_flight_messages(engine: str) -> None:
    # rule 11: the hook runs only when nothing is outstanding
    lock = threading.Lock()
    state = {"outstanding": 0, "completed": 0, "at_eos": -1}

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            with lock:
                state["outstanding"] += 1

            def done() -> None:
                with lock:
                    state["outstanding"] -= 1
                    state["completed"] += 1
                callback.complete()

            threading.Timer(0.002 * (3 - envelope.offset % 3), done).start()

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            with lock:
                state["at_eos"] = state["outstanding"] * 1000 + state["completed"]

    result, _ = run_job(engine, Task, bounded([list(range(30))]), task_max_concurrency=5)
    assert state["at_eos"] == 30  # nothing outstanding, all 30 completed
    assert result.committed == {ssp(0): 29}


def test_end_of_stream_hook_runs_before_its_requested_commit(engine: str) -> None:
    # rules 11, 14: the hook's output and commit request; the commit follows the hook
    order: list[str] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            order.append("eos")
            collector.send("mem.out", "summary")
            coordinator.commit()

    class Store(MemoryCheckpointStore):
        def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Any]) -> None:
            order.append(f"commit {dict(offsets)[ssp(0)]}")
            super().write(task_name, offsets)

    system = bounded([list(range(3))])
    result, _store = run_job(engine, Task, system, store=Store())
    assert order == ["eos", "commit 2"]
    assert system.messages("out") == ["summary"]
    assert result.committed == {ssp(0): 2}


def test_timers_fire_in_time_order_replace_cancel_and_wake_the_loop(engine: str) -> None:
    # rule 23: one-shot timers by key, re-registering replaces, cancel removes, due in time order
    fired: list[str] = []

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            now = time.time()
            context.schedule("late", now + 0.06, self.fire)
            context.schedule("early", now + 0.04, self.fire)
            context.schedule("gone", now + 0.01, self.fire)
            assert context.cancel("gone") is True
            assert context.cancel("never") is False
            context.schedule("replaced", now + 0.01, self.fire)
            context.schedule("replaced", now + 0.05, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            fired.append(key)
            collector.send("mem.out", key)
            if key == "late":
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    system = MemorySystem().add_live_stream("in", 1)
    # a huge idle wait: only the timer itself can wake the loop
    result, _ = run_job(engine, Task, system, task_max_idle_ms=600000)
    assert fired == ["early", "replaced", "late"]
    assert system.messages("out") == fired
    assert result.reason == "shutdown"
    assert result.tasks["Partition 0"].timers == 3


def test_timer_runs_only_with_nothing_outstanding(engine: str) -> None:
    # rule 23: a due timer waits for outstanding callbacks, like window
    held = HeldCallbacks()
    fired = threading.Event()
    at_fire: list[int] = []

    class Task(AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.offset == 1:  # due at once: blocks dispatch of offset 2
                self.context.schedule("t", time.time(), self.fire)
            held.add(0, envelope.offset, callback)

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            at_fire.append(len(held.invoked))
            fired.set()
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    bg, _ = start(engine, Task, bounded([list(range(5))]), task_max_concurrency=2)
    held.wait_for((0, 0), (0, 1))
    assert not fired.wait(0.2)
    held.complete(0, 1)
    assert not fired.wait(0.1)
    held.complete(0, 0)
    assert fired.wait(20)
    result = bg.join()
    assert at_fire == [2]  # no message dispatched while the timer was due
    assert result.reason == "shutdown"
    assert result.committed == {ssp(0): 1}
    assert history_of(bg.container._store, "Partition 0")[-1] == {ssp(0): 1}  # type: ignore[attr-defined]


def test_timer_at_infinity_or_centuries_ahead_never_fires_and_runs(engine: str) -> None:
    # rule 23 / issue 13 defect 8: both engines accept a timer at inf or far beyond the clock's
    # range (the C engine used to raise OverflowError converting it to nanoseconds); one at
    # -inf is past and fires at once; NaN is neither past nor future and is refused (one
    # engine fired it at once, the other never)
    fired: list[str] = []
    refused: list[str] = []

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            context.schedule("never", float("inf"), self.fire)
            context.schedule("centuries", time.time() + 300 * 365 * 86400.0, self.fire)
            context.schedule("soon", time.time() + 0.02, self.fire)
            context.schedule("past", float("-inf"), self.fire)
            try:
                context.schedule("nan", float("nan"), self.fire)
            except ValueError as e:
                refused.append(str(e))

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            fired.append(key)
            if key == "soon":
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    system = MemorySystem().add_live_stream("in", 1)
    result, _ = run_job(engine, Task, system, task_max_idle_ms=600000)
    assert refused and "'nan'" in refused[0] and "NaN" in refused[0]
    assert fired == ["past", "soon"]
    assert result.reason == "shutdown" and result.tasks["Partition 0"].timers == 2


@pytest.mark.parametrize("commit", [None, Scope.CURRENT_TASK, Scope.ALL_TASKS_IN_CONTAINER])
def test_end_of_stream_hooks_due_together_all_run_before_a_shutdown_all(engine: str, commit: Any) -> None:
    # rules 11, 14: both tasks reach end of stream at once; task 0's hook asks shutdown ALL
    # (after a commit request). Task 1's hook, due with it, runs too, and the run ends as
    # end_of_stream (with a commit ALL the reference engine skipped task 1: its commit request
    # held it back, then the shutdown drained the container)
    ran: list[str] = []

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.name = context.task_name

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            ran.append(self.name)
            if self.name == "Partition 0":
                if commit is not None:
                    coordinator.commit(commit)
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    result, _ = run_job(engine, Task, bounded([[1], [2]]))
    assert ran == ["Partition 0", "Partition 1"]
    assert result.reason == "end_of_stream"
    assert result.committed == {ssp(0): 0, ssp(1): 0}


def test_no_end_of_stream_runs_after_a_timer_failed(engine: str) -> None:
    # rule 16: a timer that raises stops the run; the end of stream that fell due with it does
    # not run (the reference engine ran it)
    ran: list[str] = []
    release: list[Any] = []

    class Task(AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            self.context.schedule("t", self.context.now(), self.fire)
            release.append(callback)
            threading.Timer(0.05, callback.complete).start()

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            ran.append("timer")
            raise RuntimeError("timer broke")

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            ran.append("end_of_stream")

    with pytest.raises(TaskError, match="timer broke"):
        run_job(engine, Task, bounded([[1]]), task_max_concurrency=2)
    assert ran == ["timer"]


@pytest.mark.parametrize("kind", ["sync", "callback", "coroutine"])
def test_a_window_longer_than_its_period_does_not_starve_the_task(engine: str, kind: str) -> None:
    # rules 5, 8: a window that takes longer than task.window.ms ran past the next window's
    # time; that one comes a period later, and the task's messages run in between. Both
    # engines ran windows back to back: the reference engine's async task processed about
    # one message in thirty windows, the C engine's sync task one in seven hundred
    import asyncio

    done = threading.Event()

    class Sync(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            time.sleep(0.0002)

        def window(self, collector: Any, coordinator: Any) -> None:
            time.sleep(0.01)

    class Callback(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            callback.complete()

        def window(self, collector: Any, coordinator: Any) -> None:
            time.sleep(0.01)

    class Coroutine(AsyncStreamTask):
        async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        async def window(self, collector: Any, coordinator: Any) -> None:
            await asyncio.sleep(0.01)

    outcome: list[Any] = []

    def run() -> None:
        task = {"sync": Sync, "callback": Callback, "coroutine": Coroutine}[kind]
        outcome.append(run_job(engine, task, bounded([list(range(60))]), task_window_ms=1)[0])
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(20), "the task starved: its windows ran back to back"
    assert outcome[0].reason == "end_of_stream" and outcome[0].processed == 60
