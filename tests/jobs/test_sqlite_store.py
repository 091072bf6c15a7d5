"""The SQLite checkpoint store: typed offsets, atomic writes, one container per job, corruption."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tailrace.errors import CheckpointError
from tailrace.sqlite import SqliteCheckpointStore, connect
from tailrace.types import SystemStreamPartition as SSP

A0 = SSP("files", "a", 0)
A1 = SSP("files", "a", 1)
R0 = SSP("redis", "r", 0)


def test_offsets_round_trip_with_their_type(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = SqliteCheckpointStore(db)
    s.open("job")
    assert s.load("Partition 0") == {}
    s.write("Partition 0", {A0: 10, R0: "1700000000000-3"})
    s.write("Partition 1", {A1: 0})
    s.write("Partition 0", {A0: 2**40})  # partitions not named keep theirs
    s.close()
    s2 = SqliteCheckpointStore(db)
    s2.open("job")
    got = s2.load("Partition 0")
    assert got == {A0: 2**40, R0: "1700000000000-3"}
    assert type(got[A0]) is int and type(got[R0]) is str
    assert s2.load("Partition 1") == {A1: 0}
    s2.close()
    # other jobs in the same file are separate
    s3 = SqliteCheckpointStore(db)
    s3.open("other")
    assert s3.load("Partition 0") == {}
    s3.close()


def test_write_is_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = SqliteCheckpointStore(db)
    s.open("job")
    s.write("t", {A0: 1, A1: 1})
    with pytest.raises(CheckpointError, match="must be an int or a str"):
        s.write("t", {A0: 2, A1: 2.5})  # type: ignore[dict-item]
    assert s.load("t") == {A0: 1, A1: 1}
    s.close()


def test_second_container_on_the_same_job_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    first = SqliteCheckpointStore(db)
    first.open("job")
    second = SqliteCheckpointStore(db)
    with pytest.raises(CheckpointError, match=r"in use by another container for job 'job' \(pid \d+"):
        second.open("job")
    other_job = SqliteCheckpointStore(db)
    other_job.open("another job")  # a different job may share the file
    other_job.close()
    first.close()
    second.open("job")  # released by close
    second.close()


def test_a_killed_holder_does_not_block_the_next_container(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    code = textwrap.dedent(
        f"""
        import sys, time
        from tailrace.sqlite import SqliteCheckpointStore
        s = SqliteCheckpointStore({str(db)!r}); s.open("job")
        print("locked", flush=True); time.sleep(60)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "locked"
        with pytest.raises(CheckpointError, match=f"pid {p.pid}"):
            SqliteCheckpointStore(db).open("job")
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        p.kill()
        p.wait()
    s = SqliteCheckpointStore(db)
    s.open("job")
    s.close()


def _store_with_data(db: Path, rows: int = 300) -> None:
    s = SqliteCheckpointStore(db)
    s.open("job")
    for i in range(rows):
        s.write(f"task {i}", {SSP("files", f"stream-{i}", p): i * 1000 + p for p in range(8)})
    s.close()
    with sqlite3.connect(db) as c:  # fold the WAL into the main file
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def test_truncated_store_stops_start_up(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _store_with_data(db)
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError, match=r"c.db is corrupt"):
        SqliteCheckpointStore(db).open("job")


def test_garbage_file_stops_start_up(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    db.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(CheckpointError, match=r"corrupt or not a SQLite database"):
        SqliteCheckpointStore(db).open("job")


def test_overwritten_pages_stop_start_up(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _store_with_data(db)
    with open(db, "r+b") as f:
        f.seek(4096 * 20)  # whole pages in the middle of the table and its index
        f.write(b"\x07" * 4096 * 4)
    with pytest.raises(CheckpointError, match=r"corrupt"):
        SqliteCheckpointStore(db).open("job")


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _store_with_data(db, rows=1)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(CheckpointError, match=r"schema version 99; this tailrace reads version 1"):
        SqliteCheckpointStore(db).open("job")


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE users (name TEXT)")
    with pytest.raises(CheckpointError, match="not a tailrace checkpoint store"):
        SqliteCheckpointStore(db).open("job")


def test_committed_and_reset(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    s = SqliteCheckpointStore(db)
    s.open("job")
    s.write("Partition 0", {A0: 5})
    s.write("Partition 1", {A1: 7})
    # readable without the lock while the job runs
    assert SqliteCheckpointStore(db).committed("job") == {"Partition 0": {A0: 5}, "Partition 1": {A1: 7}}
    assert s.reset() == 2
    assert s.load("Partition 0") == {}
    s.close()
    assert SqliteCheckpointStore(tmp_path / "missing.db").committed("job") == {}
    conn = connect(db, create=False)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_store_killed_before_its_schema_was_written_has_no_checkpoints(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with sqlite3.connect(db) as c:  # what a kill between creating the file and the schema leaves
        c.execute("PRAGMA journal_mode = WAL")
    assert SqliteCheckpointStore(db).committed("job") == {}
    s = SqliteCheckpointStore(db)
    s.open("job")
    s.write("t", {A0: 3})
    s.close()
    assert SqliteCheckpointStore(db).committed("job") == {"t": {A0: 3}}
