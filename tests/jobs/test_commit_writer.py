"""Commits written off the loop thread (issue 34; rules 13, 26, 27 unchanged): the loop goes on
processing while a commit is made durable; a commit carries exactly the state and offsets of
its moment; a task's next commit waits for its previous one; a failed write stops the job
with the task named, and nothing is committed past it. Both engines."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import tailrace
from tailrace.errors import TaskError
from tailrace.interfaces import StateChanges
from tailrace.serdes import SerdeError
from tailrace.sqlite import SqliteCheckpointStore
from tailrace.types import Offset, SystemStreamPartition

ENGINES = ["c", "python"]


class _SlowWrites(SqliteCheckpointStore):
    """SQLite checkpoints whose writes take 0.3 s with the GIL released (a slow disk); records
    the threads they ran on and when."""

    def __init__(self, path: Path, delay: float = 0.3) -> None:
        super().__init__(path)
        self.delay = delay
        self.writes: list[tuple[float, float, str, dict[SystemStreamPartition, Offset]]] = []
        self.fail_at: int | None = None
        self.fail_once = False  # only the write at fail_at fails (later ones would succeed)
        self.attempts = 0

    def write(
        self,
        task_name: str,
        offsets: Any,
        state: StateChanges | None = None,
    ) -> None:
        started = time.monotonic()
        time.sleep(self.delay)
        self.attempts += 1
        if self.fail_once:
            if self.attempts - 1 == self.fail_at:
                raise OSError("disk on fire")
        elif self.fail_at is not None and len(self.writes) >= self.fail_at:
            raise OSError("disk on fire")
        super().write(task_name, offsets, state)
        self.writes.append((started, time.monotonic(), threading.current_thread().name, dict(offsets)))


class Paced(tailrace.StreamTask):
    """Counts per key in a store; records when each message ran; asks for a commit at 100."""

    seen: list[float]

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")
        Paced.seen = []

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        n = envelope.message
        self.counts[f"k{n % 7}"] = self.counts.get(f"k{n % 7}", 0) + 1
        Paced.seen.append(time.monotonic())
        if n == 100:
            coordinator.commit()
        time.sleep(0.001)


_COUNTS = {"counts": {"key.serde": "str", "value.serde": "int"}}


def _run(
    engine: str,
    store: SqliteCheckpointStore,
    messages: int,
    task: type = Paced,
    stores: Any = _COUNTS,
    partitions: int = 1,
) -> tailrace.RunResult:
    mem = tailrace.MemorySystem("mem").add_stream("in", [list(range(messages)) for _ in range(partitions)])
    c = tailrace.Container(
        task,
        inputs=["mem.in"],
        systems=[mem],
        checkpoints=store,
        engine=engine,
        stores=stores,
        config={"task.commit.ms": -1},
    )
    return c.run()


@pytest.mark.parametrize("engine", ENGINES)
def test_the_loop_processes_while_a_commit_is_written(tmp_path: Path, engine: str) -> None:
    store = _SlowWrites(tmp_path / "c.db")
    result = _run(engine, store, 400)
    first = store.writes[0]
    started, ended, thread, offsets = first
    assert thread == "tailrace-commit-writer"  # not the loop thread
    during = [t for t in Paced.seen if started < t < ended]
    # the commit took 0.3 s: the loop ran messages meanwhile (1 ms each); on the loop thread
    # no message could run while the write waited
    assert len(during) >= 50, len(during)
    ssp = SystemStreamPartition("mem", "in", 0)
    assert offsets[ssp] == 100  # the commit's own moment, not where the loop was when it was written
    assert result.committed[ssp] == 399  # the final commit is durable when run() returns
    check = SqliteCheckpointStore(tmp_path / "c.db")
    check.open("tailrace-job")
    try:
        assert check.load("Partition 0") == {ssp: 399}
        assert _counts(check) == _fold(range(400))
    finally:
        check.close()


def _counts(store: SqliteCheckpointStore) -> dict[str, int]:
    """The committed counts of Partition 0 (int serde: big-endian value + 2**63)."""
    return {
        k.decode(): int.from_bytes(v, "big") ^ (1 << 63) for k, v in store.state_scan("Partition 0", "counts")
    }


def _fold(ns: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in ns:
        counts[f"k{n % 7}"] = counts.get(f"k{n % 7}", 0) + 1
    return counts


@pytest.mark.parametrize("engine", ENGINES)
def test_a_commit_carries_the_state_of_its_moment(tmp_path: Path, engine: str) -> None:
    # the first commit is at offset 100 (messages 0..100); the state written with it is the
    # fold of exactly those, whatever the loop did during the slow write (rule 26)
    store = _SlowWrites(tmp_path / "c.db")
    _run(engine, store, 400)
    assert [w[3][SystemStreamPartition("mem", "in", 0)] for w in store.writes] == [100, 399]
    # what the first write left: the same run with its final commit failing
    store3 = _SlowWrites(tmp_path / "d.db", delay=0.3)
    store3.fail_at = 1  # the final commit fails: what stays is the commit at 100
    with pytest.raises(TaskError, match="disk on fire") as info:
        _run(engine, store3, 400)
    assert info.value.phase == "commit"
    assert info.value.task == "Partition 0"
    check = SqliteCheckpointStore(tmp_path / "d.db")
    check.open("tailrace-job")
    try:
        assert check.load("Partition 0") == {SystemStreamPartition("mem", "in", 0): 100}
        # the fold of exactly messages 0..100, though the loop ran on during the write
        assert _counts(check) == _fold(range(101))
    finally:
        check.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failed_background_write_stops_the_job_naming_the_task(tmp_path: Path, engine: str) -> None:
    store = _SlowWrites(tmp_path / "c.db", delay=0.05)
    store.fail_at = 0  # the first commit (at 100) fails
    started = time.monotonic()
    with pytest.raises(TaskError, match="disk on fire") as info:
        _run(engine, store, 5000)
    assert info.value.phase == "commit" and info.value.task == "Partition 0"
    # the job stopped on it, long before its 5,000 messages (5 s) were done
    assert time.monotonic() - started < 4.0
    check = SqliteCheckpointStore(tmp_path / "c.db")
    check.open("tailrace-job")
    try:
        assert check.load("Partition 0") == {}  # nothing committed past the failure
        assert list(check.state_scan("Partition 0", "counts")) == []
    finally:
        check.close()


def test_a_str_value_with_a_lone_surrogate_is_refused_at_the_put(tmp_path: Path) -> None:
    # rule 39: a store write that cannot be encoded fails at the write itself, never at the
    # commit (the task can catch it); serdes that can encode it (pickle) take it
    from tailrace.config import StoreSpec
    from tailrace.memory import MemoryCheckpointStore
    from tailrace.stores import KeyValueStore, TaskStores, _PyKeyValueStore

    backend = MemoryCheckpointStore()
    backend.open("job")
    # msgpack where it is installed (the extra; the lanes of the other Pythons lack it)
    serdes = ["json", "str"] + (["msgpack"] if importlib.util.find_spec("msgpack") else [])
    for cls in (KeyValueStore, _PyKeyValueStore):
        for serde in serdes:
            stores = TaskStores("t", {"s": StoreSpec("str", serde)}, backend, cls)
            s = stores.get("s")
            with pytest.raises(SerdeError, match=r"store 's' of task 't', key 'k'"):
                s["k"] = "a\ud800b"
            with pytest.raises(SerdeError, match=r"key 'k2'"):
                s.put_all({"k2": "\udfff"})
            s["ok"] = "é\u20ac"  # non-ASCII with a UTF-8 encoding is fine
            assert s["ok"] == "é\u20ac"
            assert "k" not in s and s.dirty() == 1
            assert stores.begin_commit()["s"] == {b"ok": s._vserde.encode("é\u20ac")}
            stores.end_commit(True)
        stores = TaskStores("t", {"s": StoreSpec("str", "pickle")}, backend, cls)
        stores.get("s")["k"] = "a\ud800b"
        assert stores.get("s")["k"] == "a\ud800b"


class _CountingReads(SqliteCheckpointStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gets = 0

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        self.gets += 1
        return super().state_get(task_name, store, key)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_restarted_task_whose_state_fits_its_cache_reads_nothing_on_a_miss(
    tmp_path: Path, engine: str
) -> None:
    # issue 34: the committed state is read whole at the start when it fits the cache; a
    # key it does not hold cannot exist, so a miss reads nothing
    _run(engine, SqliteCheckpointStore(tmp_path / "c.db"), 50)
    store = _CountingReads(tmp_path / "c.db")

    class More(Paced):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            n = envelope.message
            key = f"k{n % 7}" if n < 65 else f"new{n}"  # new keys from 65 on
            self.counts[key] = self.counts.get(key, 0) + 1

    _run(engine, store, 80, More)
    assert store.gets == 0
    check = SqliteCheckpointStore(tmp_path / "c.db")
    check.open("tailrace-job")
    try:
        got = _counts(check)
    finally:
        check.close()
    expected = _fold(range(65))
    expected.update({f"new{n}": 1 for n in range(65, 80)})
    assert got == expected


class Stateless(tailrace.StreamTask):
    """No stores; asks for a commit after every 50th message; records when each ran."""

    seen: list[float]

    def init(self, context: Any) -> None:
        Stateless.seen = []

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        Stateless.seen.append(time.monotonic())
        if envelope.message % 50 == 49:
            coordinator.commit()
        time.sleep(0.001)


def _run_stateless(engine: str, store: SqliteCheckpointStore, messages: int) -> tailrace.RunResult:
    return _run(engine, store, messages, Stateless, stores=None)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_task_without_stores_goes_on_past_several_commits_in_flight_written_in_order(
    tmp_path: Path, engine: str
) -> None:
    store = _SlowWrites(tmp_path / "c.db", delay=0.5)
    result = _run_stateless(engine, store, 400)
    ssp = SystemStreamPartition("mem", "in", 0)
    assert [w[3][ssp] for w in store.writes] == [49, 99, 149, 199, 249, 299, 349, 399]
    # while the first commit (at 49) was written, the loop passed the commits at 99, 149 and
    # 199 (each waiting for the one before would have held message 100 until it was durable)
    first_written = store.writes[0][1]
    assert sum(t < first_written for t in Stateless.seen) >= 200
    assert result.committed[ssp] == 399


@pytest.mark.parametrize("engine", ENGINES)
def test_no_commit_after_a_failed_one_in_flight_is_written(tmp_path: Path, engine: str) -> None:
    store = _SlowWrites(tmp_path / "c.db", delay=0.1)
    store.fail_at, store.fail_once = 0, True  # the first commit (at 49) fails, no other would
    with pytest.raises(TaskError, match="disk on fire") as info:
        _run_stateless(engine, store, 2000)
    assert info.value.phase == "commit" and info.value.task == "Partition 0"
    assert store.writes == []
    check = SqliteCheckpointStore(tmp_path / "c.db")
    check.open("tailrace-job")
    try:
        assert check.load("Partition 0") == {}  # nothing committed past the failure
    finally:
        check.close()


def test_a_store_that_asks_for_a_short_switch_interval_has_it_while_its_writer_runs(tmp_path: Path) -> None:
    import sys

    from tailrace.container import CommitWriter

    before = sys.getswitchinterval()
    quick = SqliteCheckpointStore(tmp_path / "a.db")
    quick.writer_switch_interval_s = before / 10  # as a Redis store with exactly-once outputs asks
    plain = SqliteCheckpointStore(tmp_path / "b.db")  # asks nothing: its writes hold the GIL long
    w1 = CommitWriter(plain)
    assert sys.getswitchinterval() == before
    w2 = CommitWriter(quick)
    assert sys.getswitchinterval() == pytest.approx(before / 10)
    w3 = CommitWriter(quick)
    w2.close()
    assert sys.getswitchinterval() == pytest.approx(before / 10)  # w3 still runs
    w3.close()
    assert sys.getswitchinterval() == before
    w1.close()
    w3.close()  # idempotent: releases nothing twice
    assert sys.getswitchinterval() == before


class _GroupedWrites(SqliteCheckpointStore):
    """SQLite checkpoints that take several tasks' commits at once (``groups_writes``, as the
    Redis store does under exactly-once outputs); every call takes 0.2 s with the GIL released
    (a round trip) and is recorded: the (task, offsets) of each commit it wrote."""

    groups_writes = True

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: list[list[tuple[str, dict[SystemStreamPartition, Offset]]]] = []
        self._grouped = False

    def write_many(self, writes: Any) -> list[BaseException | None]:
        time.sleep(0.2)
        self.calls.append([(task, dict(offsets)) for task, offsets, _, _ in writes])
        self._grouped = True
        try:
            return super().write_many(writes)  # one write after the other, as the base does
        finally:
            self._grouped = False

    def write(
        self, task_name: str, offsets: Any, state: StateChanges | None = None, outputs: Any = None
    ) -> None:
        if not self._grouped:
            time.sleep(0.2)
            self.calls.append([(task_name, dict(offsets))])
        super().write(task_name, offsets, state)


@pytest.mark.parametrize("engine", ENGINES)
def test_commits_queued_behind_a_write_go_to_a_grouping_store_together_one_of_each_task(
    tmp_path: Path, engine: str
) -> None:
    store = _GroupedWrites(tmp_path / "c.db")
    result = _run(engine, store, 300, Stateless, stores=None, partitions=4)
    assert max(len(call) for call in store.calls) > 1  # tasks' commits queued, written in one call
    order: dict[str, list[int]] = {}
    for call in store.calls:
        tasks = [task for task, _ in call]
        assert len(tasks) == len(set(tasks))  # at most one commit of a task in a call
        for task, offsets in call:
            order.setdefault(task, []).extend(offsets.values())
    # each task's commits written in its order, the last one at its end
    assert order == {f"Partition {p}": [49, 99, 149, 199, 249, 299] for p in range(4)}
    assert result.committed == {SystemStreamPartition("mem", "in", p): 299 for p in range(4)}
    # one task: its commits queue up behind each other, and are written one call each
    alone = _GroupedWrites(tmp_path / "d.db")
    _run_stateless(engine, alone, 300)
    assert [[o for _, o in call] for call in alone.calls] == [
        [{SystemStreamPartition("mem", "in", 0): n}] for n in (49, 99, 149, 199, 249, 299)
    ]
