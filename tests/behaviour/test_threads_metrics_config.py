"""Thread-safety and visibility (rules 21, 22), bounded output (rule 24), metrics, config errors."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    ConfigError,
    Container,
    FileSystem,
    MemoryCheckpointStore,
    MemorySystem,
    Producer,
    Scope,
    StreamTask,
    SystemStreamPartition,
)

from .helpers import WAIT, bounded, live_metric, run_job, ssp, start, wait_until


def test_process_window_commit_never_overlap_at_concurrency_1(engine: str) -> None:
    # rule 21: on a thread pool, one task's process/window/commit are mutually exclusive and
    # each sees the state the previous one wrote (plain attributes, no locks in the task)
    tasks: dict[str, Any] = {}

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.count = 0
            self.busy = False
            self.overlaps = 0
            self.window_counts: list[int] = []
            tasks[context.task_name] = self

        def _enter(self) -> None:
            self.overlaps += self.busy
            self.busy = True

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self._enter()
            assert self.count == envelope.offset  # every earlier process is visible
            self.count += 1
            self.busy = False

        def window(self, collector: Any, coordinator: Any) -> None:
            self._enter()
            self.window_counts.append(self.count)
            self.busy = False

    class Store(MemoryCheckpointStore):
        def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Any]) -> None:
            task = tasks[task_name]
            task.overlaps += task.busy
            assert task.count == max(offsets.values()) + 1  # commit sees every completed process
            super().write(task_name, offsets)

    result, store = run_job(
        engine,
        Task,
        bounded([list(range(400)) for _ in range(3)]),
        store=Store(),
        job_container_thread_pool_size=2,
        task_window_ms=1,
        task_commit_ms=1,
    )
    assert result.processed == 1200
    for t in tasks.values():
        assert t.overlaps == 0
        assert t.window_counts == sorted(t.window_counts)
        assert t.count == 400
    assert len(store.history) >= 3


def test_requested_commit_runs_before_the_next_message_on_the_pool(engine: str) -> None:
    # rules 9, 14, 15 on a thread pool: a commit requested while processing message k covers
    # exactly 0..k and runs before message k+1 of that task is processed (sync commit blocks
    # new dispatch), even though the pool may hold that task's later messages already
    tasks: dict[str, Any] = {}
    every = 7

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.count = 0
            self.commits: list[tuple[int, int]] = []
            tasks[context.task_name] = self

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            assert self.count == envelope.offset
            self.count += 1
            if envelope.offset % every == every - 1:
                coordinator.commit(Scope.CURRENT_TASK)

    class Store(MemoryCheckpointStore):
        def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Any]) -> None:
            task = tasks[task_name]
            (offset,) = offsets.values()
            task.commits.append((offset, task.count))
            super().write(task_name, offsets)

    n = 300
    result, _ = run_job(
        engine,
        Task,
        bounded([list(range(n)) for _ in range(3)]),
        store=Store(),
        job_container_thread_pool_size=2,
        task_commit_ms=-1,
    )
    assert result.processed == 3 * n
    requested = [k for k in range(n) if k % every == every - 1]
    for t in tasks.values():
        assert t.count == n
        # each requested commit: exactly its offset, with nothing after it processed yet
        assert t.commits[: len(requested)] == [(k, k + 1) for k in requested]
        assert t.commits[len(requested) :] in ([], [(n - 1, n)])  # the final commit


def test_callbacks_from_foreign_threads_and_an_asyncio_loop(engine: str) -> None:
    # rule 22: callbacks completed by threads tailrace did not create and by an asyncio loop
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if envelope.partition == 0:

                async def later() -> None:
                    await asyncio.sleep(0.0005 * (envelope.offset % 3))
                    collector.send("mem.out", envelope.offset)
                    callback.complete()

                asyncio.run_coroutine_threadsafe(later(), loop)
            else:
                threading.Thread(target=callback.complete).start()

    try:
        system = bounded([list(range(100)), list(range(100))])
        result, _ = run_job(engine, Task, system, task_max_concurrency=8)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
    assert result.committed == {ssp(0): 99, ssp(1): 99}
    assert sorted(system.messages("out")) == list(range(100))


class _BoundedProducer(Producer):
    """An output with room for ``capacity`` undelivered messages; send blocks while full."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.cond = threading.Condition()
        self.queue: deque[Any] = deque()
        self.delivered: list[Any] = []
        self.max_queued = 0
        self.blocked = 0

    def partitions(self, stream: str) -> int:
        return 1

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        with self.cond:
            if len(self.queue) >= self.capacity:
                self.blocked += 1
            self.cond.wait_for(lambda: len(self.queue) < self.capacity)
            self.queue.append(message)
            self.max_queued = max(self.max_queued, len(self.queue))
            self.cond.notify_all()

    def drain_one(self, timeout: float) -> bool:
        with self.cond:
            if not self.cond.wait_for(lambda: bool(self.queue), timeout):
                return False
            self.delivered.append(self.queue.popleft())
            self.cond.notify_all()
            return True

    def flush(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: not self.queue)


class _OutputSystem(MemorySystem):
    def __init__(self, producer: _BoundedProducer) -> None:
        super().__init__("out")
        self._producer = producer

    def producer(self) -> Producer:
        return self._producer


def test_bounded_output_blocks_send_and_drops_nothing(engine: str) -> None:
    # rule 24: a full output makes collector.send wait; nothing is dropped or reordered
    producer = _BoundedProducer(capacity=4)
    stop = threading.Event()

    def consumer() -> None:
        while not stop.is_set():
            if producer.drain_one(0.05):
                threading.Event().wait(0.0002)

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            collector.send("out.results", envelope.message)

    drainer = threading.Thread(target=consumer, daemon=True)
    drainer.start()
    try:
        container = Container(
            Task,
            inputs=["mem.in"],
            systems=[bounded([list(range(300))]), _OutputSystem(producer)],
            engine=engine,
            task_commit_ms=5,
        )
        result = container.run()
    finally:
        stop.set()
        drainer.join(5)
    while producer.drain_one(0):
        pass
    assert producer.delivered == list(range(300))
    assert producer.max_queued <= 4
    assert producer.blocked > 0
    assert result.committed == {ssp(0): 299}


def test_metrics_after_a_run(engine: str) -> None:
    # "Metrics that must exist": per task and per container
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 4:
                coordinator.commit()

        def window(self, collector: Any, coordinator: Any) -> None:
            pass

    result, _store = run_job(engine, Task, bounded([list(range(10)), list(range(3))]), task_window_ms=600000)
    m0, m1 = result.tasks["Partition 0"], result.tasks["Partition 1"]
    assert (m0.processed, m0.completed, m0.failed, m0.outstanding) == (10, 10, 0, 0)
    assert (m1.processed, m1.completed) == (3, 3)
    assert m0.commits == 2 and m1.commits == 1  # request + final / final
    assert m0.committed == {ssp(0): 9} and m0.low_watermark == {ssp(0): 9}
    assert m0.newest_read == {ssp(0): 9}
    assert m0.lag == {ssp(0): 0}
    assert m0.windows == 0
    assert result.container.envelopes_chosen == 13
    assert result.container.loop_iterations >= 1
    assert result.processed == 13


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_lag_is_the_newest_offset_read_minus_the_committed_one(
    engine: str, kind: str, tmp_path: Path
) -> None:
    # "Metrics that must exist": watermark lag = newest offset read minus committed. A file's
    # offsets are the byte offsets of line starts, so its lag is in bytes (it was a count of
    # messages); before the first commit, nothing committed counts as offset -1
    seen: list[tuple[Any, Any, int]] = []
    box: dict[str, Container] = {}

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.message["n"] in (3, 5, 20):
                snap = box["c"].metrics()
                assert snap is not None
                m = snap[0]["Partition 0"]
                (part,) = m.newest_read
                seen.append((m.newest_read[part], m.committed.get(part), m.lag[part]))
            if envelope.message["n"] == 5:
                coordinator.commit()

    messages = [{"n": i} for i in range(30)]
    if kind == "file":
        (tmp_path / "in").mkdir()
        lines = "".join(json.dumps(m, separators=(",", ":")) + "\n" for m in messages)
        (tmp_path / "in" / "partition-0.jsonl").write_text(lines)
        system: Any = FileSystem("files", str(tmp_path))
        inputs = ["files.in"]
    else:
        system = MemorySystem("mem").add_stream("in", [messages])
        inputs = ["mem.in"]
    box["c"] = c = Container(
        Task, inputs=inputs, systems=[system], checkpoints=MemoryCheckpointStore(), engine=engine
    )
    result = c.run()
    assert result.processed == 30
    assert len(seen) == 3
    for newest, committed, lag in seen:
        assert lag == newest - (-1 if committed is None else committed)
    assert seen[0][1] is None and seen[2][1] is not None and seen[2][2] > 0
    if kind == "file":
        assert seen[2][1] == 5 * len('{"n":0}\n')  # the byte offset of line 5, committed
        assert seen[2][2] > 15  # more than the messages read ahead of the commit: bytes


@pytest.mark.parametrize("scope", [Scope.ALL_TASKS_IN_CONTAINER, Scope.CURRENT_TASK])
@pytest.mark.parametrize("pool", [1, 2])
def test_a_stop_on_the_pool_counts_only_the_messages_process_ran_for(
    engine: str, scope: Scope, pool: int, caplog: pytest.LogCaptureFixture
) -> None:
    # metrics: messages the pool had queued when a shutdown request stopped the task were
    # never processed; nothing is outstanding, so the stop waits for nothing (rule 19)
    calls: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            calls.append(envelope.offset)
            if envelope.offset == 3:
                coordinator.shutdown(scope)

    caplog.set_level("WARNING", logger="tailrace")
    result, store = run_job(engine, Task, bounded([list(range(10))]), job_container_thread_pool_size=pool)
    m = result.tasks["Partition 0"]
    assert calls == [0, 1, 2, 3]
    assert (m.processed, m.completed, m.outstanding, m.failed) == (4, 4, 0, 0)
    assert result.processed == 4 and result.container.envelopes_chosen == 4 and result.reason == "shutdown"
    assert store.committed("tailrace-job") == {ssp(0): 3}
    assert not [r for r in caplog.records if "outstanding" in r.getMessage()]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_outstanding_gauge_of_a_pool_task_counts_only_invoked_messages(
    engine: str, concurrency: int
) -> None:
    # rule 2 / metrics: messages queued for a pool thread are not invoked, so not outstanding
    # (the C engine counted its whole queue: 128 at max concurrency 1)
    started = threading.Event()
    release = threading.Event()

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 0:
                started.set()
                release.wait(WAIT)

    bg, _store = start(
        engine,
        Task,
        bounded([list(range(500))]),
        job_container_thread_pool_size=2,
        task_max_concurrency=concurrency,
    )
    try:
        assert started.wait(WAIT)
        time.sleep(0.05)  # the loop hands the pool thread whatever it may queue
        assert live_metric(bg, "Partition 0", "outstanding") == 1
        assert live_metric(bg, "Partition 0", "processed") == 1
    finally:
        release.set()
    result = bg.join(WAIT)
    assert result.tasks["Partition 0"].processed == 500


def test_loop_iterations_count_the_scheduling_passes_of_a_run(engine: str) -> None:
    # metrics (SEMANTICS: per container, loop iterations): a run that dispatches thousands
    # of messages across commits counts more than one pass (the C engine counted 1: its
    # passes inside a batch were not counted)
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset % 100 == 99:
                coordinator.commit(Scope.CURRENT_TASK)

    result, _store = run_job(engine, Task, bounded([list(range(2000)), list(range(2000))]))
    assert result.processed == 4000
    assert result.container.loop_iterations > 10, result.container


def test_live_metrics_show_lag_and_outstanding(engine: str) -> None:
    # metrics: watermark lag (read but not committed) and the outstanding gauge, while running
    release = threading.Event()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            threading.Thread(target=lambda: (release.wait(20), callback.complete())).start()

    system = MemorySystem().add_live_stream("in", 1)
    for i in range(5):
        system.append("in", 0, i)
    bg, _ = start(engine, Task, system, task_max_concurrency=2)
    wait_until(lambda: live_metric(bg, "Partition 0", "outstanding") == 2, what="two outstanding")
    wait_until(lambda: live_metric(bg, "Partition 0", "newest_read") == {ssp(0): 4}, what="all read")
    assert live_metric(bg, "Partition 0", "lag") == {ssp(0): 5}
    assert live_metric(bg, "Partition 0", "processed") == 2
    release.set()
    wait_until(lambda: live_metric(bg, "Partition 0", "completed") == 5, what="all completed")
    bg.container.stop()
    result = bg.join()
    assert result.tasks["Partition 0"].lag == {ssp(0): 0}


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"task.max.concurrency": 0}, "task.max.concurrency"),
        ({"task.max.concurrency": "two"}, "task.max.concurrency"),
        ({"job.container.thread.pool.size": -1}, "job.container.thread.pool.size"),
        ({"task.async.commit": "maybe"}, "task.async.commit"),
        ({"task.commit.ms": 1.5}, "task.commit.ms"),
        ({"task.max.concurency": 2}, "task.max.concurency"),
        ({"task.ignored.exceptions": "not a name"}, "task.ignored.exceptions"),
    ],
)
def test_config_errors_name_the_key(engine: str, config: dict[str, Any], key: str) -> None:
    # config table: rejected at start-up, naming the key and the allowed values
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            raise AssertionError("must not start")

    with pytest.raises(ConfigError) as info:
        Container(Task, inputs=["mem.in"], systems=[bounded([[1]])], config=config, engine=engine).run()
    assert info.value.key == key
    assert key in str(info.value)


@pytest.mark.parametrize("pool", [1, 2])
def test_pool_threads_keep_threading_local_for_their_lifetime(engine: str, pool: int) -> None:
    # rule 21 / issue 13 defect 6: a per-thread resource in threading.local (a DB connection
    # per worker) is made once per pool thread, not once per batch of messages
    local = threading.local()
    opened: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if getattr(local, "conn", None) is None:
                local.conn = object()
                opened.append(threading.get_ident())

    system = MemorySystem().add_stream("in", [list(range(5000)) for _ in range(4)])
    result, _ = run_job(engine, Task, system, **{"job.container.thread.pool.size": pool})
    assert result.processed == 20000
    assert len(opened) == len(set(opened)) <= pool, f"{len(opened)} connections for {pool} threads"


def test_a_large_pool_stops_without_calling_idle_threads_stuck(
    engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    # rule 19: idle pool threads are not "still inside process", however many there are
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    caplog.set_level("WARNING", logger="tailrace")
    result, _ = run_job(engine, Task, bounded([[1, 2, 3]]), job_container_thread_pool_size=1024)
    assert result.processed == 3
    assert not [r for r in caplog.records if "pool thread" in r.getMessage()]


def test_processed_counts_are_live_while_a_slow_task_runs(engine: str) -> None:
    # metrics (and the progress line built on them): a task's messages run in turns of up to
    # 64, and its counters were brought up to date at the end of each: with 20 ms a message,
    # `processed` read 0 for 1.3 s. A turn now reports at least every 100 ms

    class Slow(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            time.sleep(0.02)

    bg, _ = start(engine, Slow, bounded([list(range(200))]))
    try:
        wait_until(lambda: bg.container.metrics() is not None, what="engine started")
        t0 = time.monotonic()
        wait_until(lambda: (live_metric(bg, "Partition 0", "processed") or 0) >= 5, what="5 processed")
        assert time.monotonic() - t0 < 0.9  # 64 messages take 1.3 s
    finally:
        bg.container.stop()
        bg.join()
