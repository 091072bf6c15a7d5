"""One SqliteCheckpointStore object used for several runs (rules 25, 26): each open sees the
state of its own job as committed now, whatever ran or was reset in between, and a scope
id once given never names another job's store."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tailrace import Container, MemorySystem, StreamTask
from tailrace.errors import CheckpointError
from tailrace.serdes import serde
from tailrace.sqlite import SqliteCheckpointStore

TASK = "Partition 0"
JSON = serde("json")


class Count(StreamTask):
    """Counts messages in store ``counts``; records what the store held at start."""

    found: dict[str, Any] = {}

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")
        Count.found[context.config.job_name] = self.counts.get("n")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.counts["n"] = self.counts.get("n", 0) + 1


def _run(store: SqliteCheckpointStore, job: str, messages: int, engine: str) -> None:
    system = MemorySystem("mem").add_stream("in", [list(range(messages))])
    Container(
        Count,
        inputs=["mem.in"],
        systems=[system],
        engine=engine,
        config={"job.name": job},
        checkpoints=store,
        stores={"counts": {}},
    ).run()


def _committed(db: Path, job: str) -> tuple[dict[str, Any], dict[Any, Any]]:
    """(offsets, decoded state) of ``job`` read by a fresh store object."""
    s = SqliteCheckpointStore(db)
    s.open(job)
    try:
        offsets = {str(k): v for k, v in s.load(TASK).items()}
        return offsets, {JSON.decode(k): JSON.decode(v) for k, v in s.state_scan(TASK, "counts")}
    finally:
        s.close()


def test_one_store_object_runs_two_jobs_in_turn(engine: str, tmp_path: Path) -> None:
    # the scope cache was keyed by (task, store) and outlived close: job-b started with
    # job-a's count and committed its state into job-a's scope
    db = tmp_path / "c.db"
    store = SqliteCheckpointStore(db)
    Count.found = {}
    _run(store, "job-a", 5, engine)
    _run(store, "job-b", 3, engine)
    assert Count.found == {"job-a": None, "job-b": None}
    assert _committed(db, "job-a") == ({"mem.in[0]": 4}, {"n": 5})
    assert _committed(db, "job-b") == ({"mem.in[0]": 2}, {"n": 3})
    _run(store, "job-a", 7, engine)  # back to job-a: it resumes after offset 4 with its own count
    assert Count.found["job-a"] == 5
    assert _committed(db, "job-a") == ({"mem.in[0]": 6}, {"n": 7})
    assert _committed(db, "job-b") == ({"mem.in[0]": 2}, {"n": 3})


def test_a_run_after_a_reset_from_another_store_object_keeps_its_state(engine: str, tmp_path: Path) -> None:
    # `tailrace checkpoints reset` opens its own store: the first object's next run must
    # commit its state where a fresh reader finds it (it wrote to a deleted scope id)
    db = tmp_path / "c.db"
    store = SqliteCheckpointStore(db)
    Count.found = {}
    _run(store, "job-a", 5, engine)
    other = SqliteCheckpointStore(db)
    other.open("job-a")
    assert other.reset() == 1
    other.close()
    _run(store, "job-a", 4, engine)  # from the beginning, from empty stores
    assert Count.found["job-a"] is None
    assert _committed(db, "job-a") == ({"mem.in[0]": 3}, {"n": 4})


def test_a_scope_id_is_never_given_to_another_job(tmp_path: Path) -> None:
    # a reset used to delete the job's scope rows, and INTEGER PRIMARY KEY hands the
    # highest freed id out again: a store object still holding it read another job's rows
    db = tmp_path / "c.db"
    a = SqliteCheckpointStore(db)
    a.open("a")
    a.write(TASK, {}, {"counts": {b"x": b"1"}})
    # while a is open nobody else can reset job a (the job's lock): the reset below can
    # only come between two opens of a
    blocked = SqliteCheckpointStore(db)
    with pytest.raises(CheckpointError, match="in use by another container for job 'a'"):
        blocked.open("a")
    a.close()
    other = SqliteCheckpointStore(db)
    other.open("a")
    other.reset()
    other.close()
    b = SqliteCheckpointStore(db)
    b.open("b")
    b.write(TASK, {}, {"counts": {b"y": b"2"}})
    b.close()
    with sqlite3.connect(db) as conn:
        scopes = dict(conn.execute("SELECT job, id FROM state_scopes"))
    assert scopes["a"] != scopes["b"]
    a.open("a")  # the same object again: job a is empty, job b's rows stay b's
    assert a.state_get(TASK, "counts", b"y") is None
    assert list(a.state_scan(TASK, "counts")) == []
    a.write(TASK, {}, {"counts": {b"z": b"3"}})
    assert list(a.state_scan(TASK, "counts")) == [(b"z", b"3")]
    a.close()
    b.open("b")
    assert list(b.state_scan(TASK, "counts")) == [(b"y", b"2")]
    b.close()
