"""Graceful stop, Ctrl-C/SIGTERM in a real process, hard kill and restart (rules 19, 20)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tailrace import AsyncStreamTask, MemoryCheckpointStore, MemorySystem, Scope, StreamTask

from .helpers import WAIT, HeldCallbacks, bounded, run_job, ssp, start, wait_until
from .live_job import CRASH_MESSAGES, PARTITIONS

SCRIPT = Path(__file__).with_name("live_job.py")


def _env() -> dict[str, str]:
    """The child imports the same installed tailrace as this process (pysrc only when it
    is where this process found a complete package, e.g. an editable install)."""
    import tailrace

    env = dict(os.environ)
    pkg_parent = str(Path(tailrace.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH", "")) if p)
    return env


def test_external_stop_while_every_task_is_saturated(engine: str) -> None:
    # rule 19 (Samza: stop while all tasks are at max concurrency): dispatch stops, outstanding
    # callbacks are awaited, the final commit covers everything processed: nothing is replayed
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            held.add(envelope.partition, envelope.offset, callback)

    system = MemorySystem().add_live_stream("in", 2)
    for i in range(5):
        system.append("in", 0, i)
        system.append("in", 1, i)
    bg, store = start(engine, Task, system, task_max_concurrency=2)
    held.wait_for((0, 0), (0, 1), (1, 0), (1, 1))
    bg.container.stop()
    bg.thread.join(0.2)
    assert bg.alive(), "stopped without waiting for outstanding callbacks"
    for key in [(1, 1), (0, 0), (1, 0), (0, 1)]:
        held.complete(*key)
    result = bg.join()
    assert result.reason == "stop"
    assert sorted(held.invoked) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # nothing dispatched after stop
    assert result.committed == {ssp(0): 1, ssp(1): 1}
    assert store.committed("tailrace-job") == result.committed


def test_shutdown_wait_is_bounded_by_task_shutdown_ms(engine: str) -> None:
    # rule 19: outstanding callbacks are awaited up to task.shutdown.ms, then the low watermark is committed
    held = HeldCallbacks()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            held.add(0, envelope.offset, callback)

    bg, _ = start(engine, Task, bounded([list(range(5))]), task_max_concurrency=3, task_shutdown_ms=100)
    held.wait_for((0, 0), (0, 1), (0, 2))
    held.complete(0, 0)
    held.complete(0, 2)
    wait_until(lambda: bg.container.metrics()[0]["Partition 0"].completed == 1, what="offset 0 released")  # type: ignore[index]
    bg.container.stop()
    result = bg.join()
    assert result.reason == "stop"
    assert result.committed == {ssp(0): 0}


def test_close_runs_on_every_task_after_the_final_commit(engine: str) -> None:
    # rule 19: final commit, then close() on every task
    store = MemoryCheckpointStore()
    closed: dict[str, Any] = {}

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.name = context.task_name

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def close(self) -> None:
            closed[self.name] = store.committed("tailrace-job")

    run_job(engine, Task, bounded([list(range(3)), list(range(4)), []]), store=store)
    final = {ssp(0): 2, ssp(1): 3}
    assert store.committed("tailrace-job") == final
    # every close() saw every task's final commit already written
    assert closed == dict.fromkeys(["Partition 0", "Partition 1", "Partition 2"], final)


def test_stop_before_run_processes_nothing(engine: str) -> None:
    # rule 19: a stop requested before the loop starts is honoured
    from tailrace import Container

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            raise AssertionError("processed after stop")

    container = Container(Task, inputs=["mem.in"], systems=[bounded([[1, 2, 3]])], engine=engine)
    container.stop()
    result = container.run()
    assert result.reason == "stop"
    assert result.processed == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_gracefully_and_replays_nothing(engine: str, signum: int, tmp_path: Path) -> None:
    # rule 19: Ctrl-C / SIGTERM in a real process: the final commit equals everything processed
    out = tmp_path / "out.json"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), engine, "signal", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    report = json.loads(out.read_text())
    assert report["reason"] == "stop"
    for p, offsets in report["processed"].items():
        assert offsets, f"partition {p} processed nothing"
        assert sorted(offsets) == list(range(len(offsets)))  # no gap, no duplicate
        assert report["committed"][p] == len(offsets) - 1  # replay nothing
    last: dict[str, int] = {}
    for _, offsets in report["history"]:
        for p, off in offsets.items():
            assert off >= last.get(p, -1)  # rule 13
            last[p] = off


def test_hard_kill_loses_nothing(engine: str, tmp_path: Path) -> None:
    # rule 20: kill -9, then restart: everything after the last commit is processed again
    store, log = tmp_path / "store.json", tmp_path / "log.txt"
    cmd = [sys.executable, str(SCRIPT), engine, "crash", str(store), str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        deadline = time.monotonic() + 30
        while not (store.exists() and log.exists() and len(log.read_text().splitlines()) >= 300):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    first = [tuple(map(int, line.split())) for line in log.read_text().splitlines() if line.strip()]
    saved = json.loads(store.read_text())
    committed = {int(k.split("|")[2]): v for task in saved.values() for k, v in task.items()}
    log.write_text("")
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "end_of_stream"
    second = [tuple(map(int, line.split())) for line in log.read_text().splitlines() if line.strip()]
    for p in range(PARTITIONS):
        before = [o for q, o in first if q == p]
        after = [o for q, o in second if q == p]
        start_at = committed.get(p, -1) + 1
        assert after == list(range(start_at, CRASH_MESSAGES))  # resumes right after the commit
        assert set(before) | set(after) == set(range(CRASH_MESSAGES))  # nothing lost
        assert set(before) & set(after) == set(range(start_at, max(before, default=-1) + 1))


def test_stop_is_bounded_by_shutdown_ms_with_a_stuck_call_on_the_pool(engine: str) -> None:
    # rule 19 / issue 13 defect 4: outstanding callbacks are awaited up to task.shutdown.ms,
    # not until a process call stuck in a pool thread returns; nothing of it is committed
    release = threading.Event()
    entered = threading.Event()

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 0:
                entered.set()
                release.wait(10)  # stuck far beyond the shutdown bound

    bg, _store = start(
        engine,
        Task,
        bounded([list(range(5))]),
        **{"job.container.thread.pool.size": 1, "task.shutdown.ms": 200},
    )
    try:
        assert entered.wait(WAIT)
        t0 = time.monotonic()
        bg.container.stop()
        result = bg.join()
        took = time.monotonic() - t0
    finally:
        release.set()
    assert took < 0.2 + 0.6, f"run() returned {took:.2f} s after stop() with task.shutdown.ms=200"
    assert result.reason == "stop"
    assert result.committed == {}  # the stuck message is not committed, nor anything after it


@pytest.mark.parametrize("scope", [Scope.ALL_TASKS_IN_CONTAINER, Scope.CURRENT_TASK])
@pytest.mark.parametrize("pool", [0, 1])
def test_a_shutdown_requested_by_the_last_end_of_stream_ends_the_run_as_end_of_stream(
    engine: str, scope: Scope, pool: int
) -> None:  # rules 11, 14: every task is done; the request stops nothing more
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            collector.send("mem.out", "eos")
            coordinator.shutdown(scope)

    system = bounded([[1, 2]])
    result, store = run_job(engine, Task, system, job_container_thread_pool_size=pool)
    assert result.reason == "end_of_stream"
    assert system.messages("out") == ["eos"]
    assert store.committed("tailrace-job") == {ssp(0): 1}


class _EndShutsAllDown(StreamTask):
    """Its end_of_stream sends a line and, on partition 0, asks every task to shut down."""

    def init(self, context: Any) -> None:
        self.p = context.partitions[0].partition

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", f"eos {self.p}")
        if self.p == 0:
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)


def test_a_shutdown_requested_by_one_of_the_ends_of_stream_that_fall_due_together(engine: str) -> None:
    # rules 11, 14: both tasks reach end of stream together; task 0's hook asks for a
    # shutdown of all: task 1's hook still runs, and every task is done (end_of_stream)
    for _ in range(10):
        system = bounded([[1], [1]])
        result, _store = run_job(engine, _EndShutsAllDown, system)
        assert sorted(system.messages("out")) == ["eos 0", "eos 1"]
        assert result.reason == "end_of_stream"


class _VotesOnPartitionOne(StreamTask):
    """Partition 1 votes shutdown (CURRENT_TASK) on its message; every end_of_stream says so."""

    def init(self, context: Any) -> None:
        self.p = context.partitions[0].partition

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if self.p == 1:
            coordinator.shutdown(Scope.CURRENT_TASK)

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", f"eos {self.p}")


@pytest.mark.parametrize("first", [["x"], ["x", "y"]])
def test_a_vote_and_ends_of_stream_that_leave_every_task_done_end_the_run_as_end_of_stream(
    engine: str, first: list[str]
) -> None:
    # rules 11, 14: task 1 votes, then every input ends and both end_of_stream hooks run
    # (due together): every task is done, and no task but 1 voted: the run ended at end of
    # stream (the C engine said shutdown, deciding at task 0's hook before task 1's ran)
    for _ in range(5):
        system = bounded([first, ["vote"]])
        result, _store = run_job(engine, _VotesOnPartitionOne, system)
        assert sorted(system.messages("out")) == ["eos 0", "eos 1"]
        assert result.reason == "end_of_stream"


def test_a_vote_after_the_other_task_is_done_ends_the_run_as_shutdown(engine: str) -> None:
    # rules 11, 14: task 0 has nothing and is done; task 1's vote completes the vote, and
    # the run stops before its own end_of_stream
    system = bounded([[], ["vote"]])
    result, _store = run_job(engine, _VotesOnPartitionOne, system)
    assert result.reason == "shutdown"
    assert system.messages("out") == ["eos 0"]


def test_a_shutdown_requested_by_an_end_of_stream_stops_the_tasks_still_running(engine: str) -> None:
    # rule 14: shutdown ALL from task 0's end_of_stream stops task 1, whose input has not ended
    system = MemorySystem().add_live_stream("in", 2)
    system.append("in", 0, "x")
    system.end("in", 0)
    result, _store = run_job(engine, _EndShutsAllDown, system, task_max_idle_ms=600000)
    assert result.reason == "shutdown"
    assert system.messages("out") == ["eos 0"]


def test_no_queued_pool_message_runs_once_a_graceful_stop_began(engine: str) -> None:
    # rule 19: dispatch stops; a message queued on a pool thread behind a slow call is handed
    # back, not invoked: the reference engine invoked it when the slow call returned, after
    # the drain had given up (task.shutdown.ms), after close() and after run() returned
    calls: list[tuple[int, int, float]] = []
    lock = threading.Lock()

    class Task(StreamTask):
        def init(self, context: Any) -> None:
            self.p = context.partitions[0].partition

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            with lock:
                calls.append((self.p, envelope.offset, time.monotonic()))
            if self.p == 0 and envelope.offset == 0:
                time.sleep(0.4)
            if self.p == 1:
                time.sleep(0.05)  # task 0's next messages are queued behind its slow one by now
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    result, store = run_job(
        engine,
        Task,
        bounded([list(range(5)), list(range(5))]),
        job_container_thread_pool_size=2,
        task_max_concurrency=4,
        task_shutdown_ms=100,
    )
    ended = time.monotonic()
    time.sleep(0.6)
    assert result.reason == "shutdown"
    with lock:
        late = [c for c in calls if c[2] > ended]
        task0 = [c[1] for c in calls if c[0] == 0]
    assert late == [], late
    assert task0 == [0]
    assert store.committed("tailrace-job").get(ssp(0), -1) == -1
