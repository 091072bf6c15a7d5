"""Completion, the low watermark and coordinator requests (rules 12-15)."""

from __future__ import annotations

from typing import Any

import pytest

from tailrace import AsyncStreamTask, MemoryCheckpointStore, MemorySystem, Scope, StreamTask

from .helpers import HeldCallbacks, bounded, history_of, live_metric, run_job, ssp, start, wait_until


def test_out_of_order_completion_is_held_and_released_in_order(engine: str) -> None:
    # rule 12: only released completions move the low watermark
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            held.add(0, envelope.offset, callback)

    system = MemorySystem().add_live_stream("in", 1)
    for i in range(3):
        system.append("in", 0, i)
    bg, _store = start(engine, Task, system, task_max_concurrency=3)
    held.wait_for((0, 0), (0, 1), (0, 2))
    held.complete(0, 2)
    held.complete(0, 1)
    assert live_metric(bg, "Partition 0", "low_watermark") == {}
    assert live_metric(bg, "Partition 0", "completed") == 0
    held.complete(0, 0)
    wait_until(lambda: live_metric(bg, "Partition 0", "low_watermark") == {ssp(0): 2}, what="watermark 2")
    assert live_metric(bg, "Partition 0", "completed") == 3
    bg.container.stop()
    assert bg.join().committed == {ssp(0): 2}


def test_commit_requested_at_offset_0_commits_exactly_0_although_1_completed_first(engine: str) -> None:
    # rules 12, 14, 15 (Samza: out-of-order completion at concurrency 2 with a commit request)
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.offset == 0:
                coordinator.commit()
            held.add(0, envelope.offset, callback)

    bg, store = start(engine, Task, bounded([[0, 1]]), task_max_concurrency=2)
    held.wait_for((0, 0), (0, 1))
    held.complete(0, 1)
    held.complete(0, 0)
    result = bg.join()
    assert store.history[0] == ("Partition 0", {ssp(0): 0})
    assert store.history[-1] == ("Partition 0", {ssp(0): 1})
    assert result.committed == {ssp(0): 1}


def test_held_tail_is_released_right_after_the_commit(engine: str) -> None:
    # rule 15: after the commit covering offset 0, offsets 1 and 2 (already complete) are
    # released without waiting for another completion (none will come: the input is idle)
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.offset == 0:
                coordinator.commit()
            held.add(0, envelope.offset, callback)

    system = MemorySystem().add_live_stream("in", 1)
    for i in range(3):
        system.append("in", 0, i)
    bg, store = start(engine, Task, system, task_max_concurrency=3)
    held.wait_for((0, 0), (0, 1), (0, 2))
    held.complete(0, 2)
    held.complete(0, 1)
    held.complete(0, 0)
    wait_until(lambda: live_metric(bg, "Partition 0", "low_watermark") == {ssp(0): 2}, what="tail released")
    assert store.history == [("Partition 0", {ssp(0): 0})]
    system.append("in", 0, 3)  # the task keeps going after the tail
    held.complete(0, 3)
    wait_until(lambda: live_metric(bg, "Partition 0", "completed") == 4, what="offset 3 completed")
    bg.container.stop()
    assert bg.join().committed == {ssp(0): 3}


def test_request_takes_effect_only_once_earlier_messages_are_released(engine: str) -> None:
    # rule 14: shutdown ALL requested at offset 2 waits for offsets 0 and 1
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.offset == 2:
                coordinator.commit()
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)
            held.add(0, envelope.offset, callback)

    system = MemorySystem().add_live_stream("in", 1)
    for i in range(3):
        system.append("in", 0, i)
    bg, store = start(engine, Task, system, task_max_concurrency=3)
    held.wait_for((0, 0), (0, 1), (0, 2))
    held.complete(0, 2)
    bg.thread.join(0.2)
    assert bg.alive(), "the shutdown took effect before offsets 0 and 1 completed"
    assert store.history == []
    held.complete(0, 0)
    held.complete(0, 1)
    result = bg.join()
    assert result.reason == "shutdown"
    assert store.history[0] == ("Partition 0", {ssp(0): 2})  # the pending commit ran
    assert result.committed == {ssp(0): 2}


def _two_task_live_job(engine: str, scope: Scope) -> tuple[Any, MemoryCheckpointStore, MemorySystem]:
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.message == "commit":
                coordinator.commit(scope)

    system = MemorySystem().add_live_stream("in", 2)
    bg, store = start(engine, Task, system)
    return bg, store, system


def test_commit_current_task_commits_only_that_task(engine: str) -> None:
    # rule 14 (Samza: commit CURRENT_TASK)
    bg, store, system = _two_task_live_job(engine, Scope.CURRENT_TASK)
    system.append("in", 1, "x")
    wait_until(lambda: live_metric(bg, "Partition 1", "completed") == 1, what="task 1 processed")
    system.append("in", 0, "commit")
    wait_until(lambda: len(store.history) >= 1, what="commit")
    wait_until(lambda: live_metric(bg, "Partition 0", "completed") == 1, what="task 0 processed")
    assert store.history == [("Partition 0", {ssp(0): 0})]
    bg.container.stop()
    bg.join()


def test_commit_all_tasks_in_container_commits_every_task(engine: str) -> None:
    # rule 14 (Samza: commit ALL_TASKS_IN_CONTAINER)
    bg, store, system = _two_task_live_job(engine, Scope.ALL_TASKS_IN_CONTAINER)
    system.append("in", 1, "x")
    wait_until(lambda: live_metric(bg, "Partition 1", "completed") == 1, what="task 1 processed")
    system.append("in", 0, "commit")
    wait_until(lambda: len(store.history) >= 2, what="both tasks committed")
    assert sorted(store.history) == [("Partition 0", {ssp(0): 0}), ("Partition 1", {ssp(1): 0})]
    bg.container.stop()
    bg.join()


def test_shutdown_when_every_task_has_voted(engine: str) -> None:
    # rule 14 (Samza: shutdown CURRENT_TASK is a vote; the container stops once all voted)
    processed: list[tuple[int, Any]] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            processed.append((envelope.partition, envelope.message))
            if envelope.message == "vote":
                coordinator.shutdown(Scope.CURRENT_TASK)

    system = MemorySystem().add_live_stream("in", 3)
    bg, _ = start(engine, Task, system)
    system.append("in", 0, "vote")
    system.append("in", 1, "vote")
    wait_until(lambda: len(processed) == 2, what="two votes")
    system.append("in", 0, "after vote")  # a voted task keeps processing
    wait_until(lambda: len(processed) == 3, what="processing after a vote")
    assert bg.alive()
    system.append("in", 2, "vote")
    result = bg.join()
    assert result.reason == "shutdown"
    assert result.committed == {ssp(0): 1, ssp(1): 0, ssp(2): 0}


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_no_message_of_any_task_runs_after_a_shutdown_all_released_at_once(
    engine: str, kind: str, ordering: str
) -> None:
    # rules 14, 19: the request is released when its call returns (nothing outstanding before
    # it), and dispatch stops there; the C engine ran another task's run of buffered
    # messages after it (all ten, and committed them), the reference engine one more
    log: list[str] = []

    def note(envelope: Any, coordinator: Any) -> None:
        log.append(f"{envelope.partition}:{envelope.offset}")
        if (envelope.partition, envelope.offset) == (0, 2):
            log.append("shutdown")
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    class Sync(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            note(envelope, coordinator)

    class Async(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            note(envelope, coordinator)
            callback.complete()

    result, _ = run_job(
        engine,
        Sync if kind == "sync" else Async,
        bounded([list(range(10)), list(range(10))]),
        task_ordering=ordering,
        task_max_concurrency=4,
    )
    assert result.reason == "shutdown"
    assert log[-1] == "shutdown", log
    assert result.committed[ssp(0)] == 2
    assert result.committed.get(ssp(1), -1) < 9


def test_restart_resumes_after_the_committed_offset_and_never_goes_back(engine: str) -> None:
    # rule 13: at-least-once restart from the committed offset; committed offsets never go backwards
    seen: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append(envelope.offset)
            if envelope.offset % 4 == 3:
                coordinator.commit()
            if envelope.offset == 9:
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    store = MemoryCheckpointStore()
    system = bounded([list(range(20))])
    first, _ = run_job(engine, Task, system, store=store)
    assert first.reason == "shutdown"
    assert first.committed == {ssp(0): 9}
    second, _ = run_job(engine, Task, system, store=store)
    assert second.reason == "end_of_stream"
    assert seen == list(range(20))
    offsets = [o[ssp(0)] for o in history_of(store, "Partition 0")]
    assert offsets == sorted(offsets) and offsets[0] == 3 and offsets[-1] == 19


def test_pending_commit_runs_before_shutdown_all(engine: str) -> None:
    # rule 14: shutdown ALL stops the container after pending commit requests ran
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 4:
                coordinator.commit()
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    result, store = run_job(engine, Task, bounded([list(range(10)), list(range(10))]))
    assert result.reason == "shutdown"
    assert ("Partition 0", {ssp(0): 4}) in store.history
    for _task, offsets in store.history:
        for part, off in offsets.items():
            assert off <= result.committed[part]
    assert result.committed[ssp(0)] == 4
