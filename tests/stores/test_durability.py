"""Stores across stops, failures and restarts, both engines, SQLite (rules 19, 25-27):
a graceful stop loses no open window aggregate; a failure in one partition keeps every
task's state exact on the rerun; state written in window and end_of_stream commits
although no offset moved; a commit never carries a message above the low watermark."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tailrace import AsyncStreamTask, Container, MemorySystem, Scope, StreamTask, TaskError
from tailrace.serdes import serde
from tailrace.sqlite import SqliteCheckpointStore


def _run(
    task: Any, data: list[list[Any]], db: Path, engine: str, *, stores: Any, **config: Any
) -> tuple[MemorySystem, Any]:
    system = MemorySystem("mem").add_stream("in", data)
    c = Container(
        task,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=SqliteCheckpointStore(db),
        engine=engine,
        stores=stores,
        **config,
    )
    return system, c.run()


def _state(db: Path, task: str, store: str) -> dict[bytes, bytes]:
    s = SqliteCheckpointStore(db)
    s.open("tailrace-job")
    try:
        return dict(s.state_scan(task, store))
    finally:
        s.close()


class WindowSum(StreamTask):
    """Sums values into an open window aggregate (a store) and emits it on window."""

    stop_after: int | None = None

    def init(self, context: Any) -> None:
        self.agg = context.store("agg")
        self.seen = 0

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.agg["sum"] = self.agg.get("sum", 0) + envelope.message
        self.agg["n"] = self.agg.get("n", 0) + 1
        self.seen += 1
        if self.stop_after is not None and self.seen == self.stop_after:
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    def _emit(self, collector: Any) -> None:
        if self.agg.get("n", 0):
            collector.send("mem.out", {"sum": self.agg["sum"], "n": self.agg["n"]})
            self.agg.delete_all(["sum", "n"])

    def window(self, collector: Any, coordinator: Any) -> None:
        self._emit(collector)

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        self._emit(collector)


@pytest.mark.parametrize("stops", [1, 3])
def test_graceful_stop_loses_no_window_aggregate(engine: str, tmp_path: Path, stops: int) -> None:
    # rules 19, 26: the open window's aggregate is committed with the offsets at the stop
    data = [list(range(1, 401))]
    db = tmp_path / "c.db"
    emitted: list[dict[str, int]] = []
    for run in range(stops + 1):

        class Task(WindowSum):
            stop_after = 97 if run < stops else None

        system, result = _run(Task, data, db, engine, stores=["agg"], task_window_ms=3600_000)
        emitted += system.messages("out")
        assert result.reason == ("shutdown" if run < stops else "end_of_stream")
    assert sum(e["n"] for e in emitted) == 400
    assert sum(e["sum"] for e in emitted) == sum(range(1, 401))
    assert len(emitted) == 1  # the aggregate spanned every stop: one window, emitted at the end


class CountThenReport(StreamTask):
    """Counts per key; end_of_stream reports the partition's counts (the newest report is
    the answer). Record "bad" raises after its store write (a partial effect)."""

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")
        self.partition = context.partitions[0].partition

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        k = envelope.message
        self.counts[k] = self.counts.get(k, 0) + 1
        if k == "bad":
            raise ValueError("bad record")

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", {"p": self.partition, "counts": dict(self.counts.items())})


def test_failed_partition_then_fixed_rerun_is_exact(engine: str, tmp_path: Path) -> None:
    # rules 18, 19, 26: the failure commits others' watermarks with their state; the failed
    # task commits nothing past its last commit (its partial write is never durable)
    good = [[f"k{(i * 7 + p) % 5}" for i in range(300)] for p in range(3)]
    broken = [list(part) for part in good]
    broken[1][150] = "bad"
    db = tmp_path / "c.db"
    system = MemorySystem("mem").add_stream("in", broken)
    c = Container(
        CountThenReport,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=SqliteCheckpointStore(db),
        engine=engine,
        stores=["counts"],
        task_commit_ms=1,
    )
    with pytest.raises(TaskError, match="Partition 1"):
        c.run()
    assert b'"bad"' not in _state(db, "Partition 1", "counts")
    reports: dict[int, Any] = {r["p"]: r["counts"] for r in system.messages("out")}
    system, _ = _run(CountThenReport, good, db, engine, stores=["counts"])
    reports.update({r["p"]: r["counts"] for r in system.messages("out")})
    assert reports == {p: dict(Counter(good[p])) for p in range(3)}


class WriteInHooks(StreamTask):
    def init(self, context: Any) -> None:
        self.s = context.store("s")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass

    def window(self, collector: Any, coordinator: Any) -> None:
        self.s["windows"] = self.s.get("windows", 0) + 1

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        self.s["eos"] = True


def test_writes_in_end_of_stream_commit_without_offset_moves(engine: str, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _run(WriteInHooks, [[1, 2, 3]], db, engine, stores=["s"])
    assert _state(db, "Partition 0", "s") == {b'"eos"': b"true"}
    # second run: no input left, no offset moves; the end_of_stream write still commits
    store = SqliteCheckpointStore(db)
    store.open("tailrace-job")
    store.write("Partition 0", {}, {"s": {b'"eos"': None}})
    store.close()
    _run(WriteInHooks, [[1, 2, 3]], db, engine, stores=["s"])
    assert _state(db, "Partition 0", "s") == {b'"eos"': b"true"}


class AsyncCommitRequest(AsyncStreamTask):
    """Max concurrency 4; message 5 requests a commit while later messages may have
    completed (held behind it, rule 15) and written state."""

    def init(self, context: Any) -> None:
        self.s = context.store("s")
        self.lock = threading.Lock()

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        with self.lock:
            self.s[envelope.offset] = envelope.message
        if envelope.offset == 5:
            coordinator.commit(Scope.CURRENT_TASK)
        threading.Timer(0.002 if envelope.offset == 5 else 0.0, callback.complete).start()


def test_commit_never_carries_state_above_the_watermark(engine: str, tmp_path: Path) -> None:
    # rule 27: a store commit holds exactly the messages at or below the committed offsets
    db = tmp_path / "c.db"
    seen: list[tuple[int, set[int]]] = []
    real_write = SqliteCheckpointStore.write

    def spy(self: SqliteCheckpointStore, task: str, offsets: Any, state: Any = None) -> None:
        real_write(self, task, offsets, state)
        committed = {serde("int").decode(k) for k, _ in self.state_scan(task, "s")}
        seen.append((max(offsets.values(), default=-1), committed))

    SqliteCheckpointStore.write = spy  # type: ignore[method-assign]
    try:
        _run(
            AsyncCommitRequest,
            [list(range(40))],
            db,
            engine,
            stores={"s": {"key.serde": "int"}},
            task_max_concurrency=4,
            task_commit_ms=-1,
        )
    finally:
        SqliteCheckpointStore.write = real_write  # type: ignore[method-assign]
    assert seen, "nothing committed"
    for offset, keys in seen:
        assert keys == set(range(offset + 1)), (offset, sorted(keys))
    assert seen[-1][0] == 39
