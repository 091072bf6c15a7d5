"""Runs: a sync task on the loop thread gets its buffered messages in a row (issue 18).

Both engines hand an inline sync task (no pool, no key ordering) a run of buffered
messages processed one after the other without going back to the loop: the C loop's
RUN op, the reference engine's ``_run``. A run must keep every rule a message-by-
message dispatch keeps: whatever happens inside message k (a timer set, a commit or
shutdown request, an ignored or a failing exception) takes effect before message
k + 1 starts, and the counters and watermarks after the run are those of k.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from tailrace import MemoryCheckpointStore, MemorySystem, Scope, StreamTask, SystemStreamPartition, TaskError

from .helpers import bounded, history_of, run_job, ssp


class Boom(Exception):
    pass


class RecordingStore(MemoryCheckpointStore):
    """Appends each checkpoint write to a shared event list (between the process calls)."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__()
        self.events = events

    def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Any], state: Any = None) -> None:
        self.events.append(("commit", dict(offsets)))
        super().write(task_name, offsets, state)


@pytest.mark.parametrize("pool", [0, 1])
def test_timer_set_by_process_runs_before_the_next_message(engine: str, pool: int) -> None:
    # rules 8, 23: a timer due at once holds back the task's next message until it ran
    events: list[Any] = []

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            events.append(envelope.offset)
            if envelope.offset in (10, 20):
                self.context.schedule(envelope.offset, self.context.now(), self.fire)

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            events.append(("timer", key))

    result, _ = run_job(engine, Task, bounded([list(range(30))]), job_container_thread_pool_size=pool)
    assert events == [*range(11), ("timer", 10), *range(11, 21), ("timer", 20), *range(21, 30)]
    assert result.tasks["Partition 0"].timers == 2
    assert result.committed == {ssp(0): 29}


def test_timer_coming_due_during_a_run_ends_it(engine: str) -> None:
    # rules 8, 23: once a timer is due, at most the message in progress may still start
    events: list[tuple[Any, float]] = []
    due: list[float] = []

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            due.append(time.monotonic() + 0.05)
            context.schedule("soon", context.now() + 0.05, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            events.append((envelope.offset, time.monotonic()))
            time.sleep(0.005)

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            events.append((key, time.monotonic()))

    run_job(engine, Task, bounded([list(range(40))]))
    keys = [key for key, _ in events]
    assert sorted(k for k in keys if k != "soon") == list(range(40))
    i = keys.index("soon")
    assert i < 40, "the timer waited for the end of the input"
    started_late = [key for key, at in events[:i] if at > due[0] + 0.002]
    assert len(started_late) <= 1, f"{started_late} started after the timer was due"


@pytest.mark.parametrize("async_commit", [False, True])
def test_commit_request_in_a_run_commits_exactly_its_prefix(engine: str, async_commit: bool) -> None:
    # rules 14, 15, 9, 10: the commit covers messages up to the requesting one and runs
    # before the next message starts (with task.async.commit too: nothing is outstanding)
    events: list[Any] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            events.append(envelope.offset)
            if envelope.offset in (20, 57):
                coordinator.commit()

    store = RecordingStore(events)
    result, _ = run_job(
        engine, Task, bounded([list(range(100))]), store=store, task_async_commit=async_commit
    )
    assert events == [
        *range(21),
        ("commit", {ssp(0): 20}),
        *range(21, 58),
        ("commit", {ssp(0): 57}),
        *range(58, 100),
        ("commit", {ssp(0): 99}),  # the final commit (rule 19)
    ]
    assert history_of(store, "Partition 0") == [{ssp(0): 20}, {ssp(0): 57}, {ssp(0): 99}]
    assert result.tasks["Partition 0"].commits == 3


def test_request_from_a_message_that_raised_an_ignored_exception_takes_effect(engine: str) -> None:
    # rules 14, 16: an ignored exception counts as completed, its requests as well
    events: list[Any] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            events.append(envelope.offset)
            if envelope.offset == 5:
                coordinator.commit()
                raise Boom(5)

    store = RecordingStore(events)
    result, _ = run_job(engine, Task, bounded([list(range(10))]), store=store, task_ignored_exceptions="*")
    assert events == [*range(6), ("commit", {ssp(0): 5}), *range(6, 10), ("commit", {ssp(0): 9})]
    m = result.tasks["Partition 0"]
    assert (m.processed, m.completed, m.ignored, m.failed) == (10, 10, 1, 0)


def test_failure_in_a_run_stops_there_and_drops_its_requests(engine: str) -> None:
    # rules 16, 18: nothing after the failed message starts; its commit request is void;
    # the final commit stores the message before it
    events: list[Any] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            events.append(envelope.offset)
            if envelope.offset == 33:
                coordinator.commit()
                raise Boom(33)

    store = RecordingStore(events)
    with pytest.raises(TaskError) as info:
        run_job(engine, Task, bounded([list(range(50))]), store=store)
    assert isinstance(info.value.__cause__, Boom)
    assert (info.value.ssp, info.value.offset) == (ssp(0), 33)
    assert "offset 33" in str(info.value)
    assert events == [*range(34), ("commit", {ssp(0): 32})]


def test_shutdown_vote_in_a_run_stops_before_the_next_message(engine: str) -> None:
    # rules 14, 19: with one task, its vote stops the container; nothing after it starts
    seen: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append(envelope.offset)
            if envelope.offset == 17:
                coordinator.shutdown(Scope.CURRENT_TASK)

    result, _ = run_job(engine, Task, bounded([list(range(60))]))
    assert seen == list(range(18))
    assert result.reason == "shutdown"
    assert result.committed == {ssp(0): 17}
    m = result.tasks["Partition 0"]
    assert (m.processed, m.completed, m.outstanding) == (18, 18, 0)


def test_run_over_two_partitions_keeps_each_watermark(engine: str) -> None:
    # rules 5, 12, 13, 16, 18: a task with two partitions is served round robin inside a
    # run; a failure in one names it and stops there, the other keeps its own watermark
    seen: list[tuple[str, int]] = []
    events: list[Any] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append((envelope.stream, envelope.offset))
            if (envelope.stream, envelope.offset) == ("b", 3):
                coordinator.commit()
            if (envelope.stream, envelope.offset) == ("b", 7):
                raise Boom(7)

    system = MemorySystem().add_stream("a", [list(range(20))])
    system.add_stream("b", [list(range(20))])
    store = RecordingStore(events)
    with pytest.raises(TaskError) as info:
        run_job(engine, Task, system, inputs=["mem.a", "mem.b"], store=store)
    assert (info.value.ssp, info.value.offset) == (ssp(0, "b"), 7)
    assert seen[-1] == ("b", 7)
    for stream in ("a", "b"):  # each partition in offset order
        offsets = [o for s, o in seen if s == stream]
        assert offsets == list(range(len(offsets)))
    # round robin: neither partition ran far ahead of the other (rule 5)
    assert abs(sum(s == "a" for s, _ in seen) - sum(s == "b" for s, _ in seen)) <= 1
    # the requested commit covers exactly the messages before it (rule 15)
    at = seen.index(("b", 3))
    a_before = max(o for s, o in seen[:at] if s == "a")
    commits = [e[1] for e in events]
    assert commits[0] == {ssp(0, "a"): a_before, ssp(0, "b"): 3}
    # the final commit: every message of a seen, b up to the one before the failure (rule 18)
    a_last = max(o for s, o in seen if s == "a")
    assert commits[-1] == {ssp(0, "a"): a_last, ssp(0, "b"): 6}
