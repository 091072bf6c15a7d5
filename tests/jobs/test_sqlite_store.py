"""The SQLite checkpoint store: typed offsets, atomic writes, one container per job, corruption."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tailrace.errors import CheckpointError
from tailrace.sqlite import GenerationMarker, SqliteCheckpointStore, connect, marker_path
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


# -- one container per job, whatever path names the file (issue 13, defect 10) ------------------
def _hold(db: Path, job: str = "job") -> subprocess.Popen[str]:
    """A real second process holding ``job`` in store ``db`` until killed."""
    code = textwrap.dedent(
        f"""
        import time
        from tailrace.sqlite import SqliteCheckpointStore
        s = SqliteCheckpointStore({str(db)!r}); s.open({job!r})
        print("locked", flush=True); time.sleep(60)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


@pytest.mark.parametrize("alias", ["hardlink", "symlink"])
def test_the_same_file_under_another_path_is_refused(tmp_path: Path, alias: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    db = tmp_path / "a" / "c.db"
    s = SqliteCheckpointStore(db)
    s.open("job")
    s.write("t", {A0: 1})
    s.close()
    other = tmp_path / "b" / "other-name.db"
    if alias == "hardlink":
        os.link(db, other)
    else:
        other.symlink_to(db)
    holder = _hold(db)
    try:
        if alias == "hardlink":  # another name of the file: SQLite would keep a second WAL
            for job in ("job", "another job"):
                with pytest.raises(
                    CheckpointError, match=r"other-name.db is open under another name .* one path everywhere"
                ):
                    SqliteCheckpointStore(other).open(job)
        else:  # SQLite resolves symlinks: the same name, so only the same job is refused
            with pytest.raises(
                CheckpointError, match=r"other-name.db is in use by another container for job 'job'"
            ):
                SqliteCheckpointStore(other).open("job")
            different_job = SqliteCheckpointStore(other)
            different_job.open("another job")
            different_job.close()
            mine = SqliteCheckpointStore(other)  # the same process, two store objects
            mine.open("job 2")
            with pytest.raises(CheckpointError, match="in use by another container for job 'job 2'"):
                SqliteCheckpointStore(db).open("job 2")
            mine.close()
    finally:
        holder.kill()
        holder.wait()
    s2 = SqliteCheckpointStore(other)  # released when the holder died
    s2.open("job")
    assert s2.load("t") == {A0: 1}
    s2.close()


# -- a damaged store never looks empty or older (issue 13, defect 9) ----------------------------
def _crashed_store(db: Path, commits: int = 20) -> None:
    """Commit ``commits`` times in a real process and kill -9 it: the WAL keeps the commits."""
    code = textwrap.dedent(
        f"""
        import time
        from tailrace.sqlite import SqliteCheckpointStore
        from tailrace.types import SystemStreamPartition as SSP
        s = SqliteCheckpointStore({str(db)!r}); s.open("job")
        for i in range(1, {commits} + 1):
            s.write("t", {{SSP("files", "a", 0): i * 100}})
        print("written", flush=True); time.sleep(60)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "written"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    wal = db.with_name(db.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 0  # the commits live only in the WAL


def _resumes_at(db: Path, offset: int) -> None:
    s = SqliteCheckpointStore(db)
    s.open("job")
    assert s.load("t") == {A0: offset}
    s.close()


def test_a_crash_leaves_a_store_that_resumes(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _crashed_store(db)
    _resumes_at(db, 2000)
    assert marker_path(db).exists()


@pytest.mark.parametrize("damage", ["deleted", "overwritten", "main file restored alone"])
def test_a_lost_wal_is_refused(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "c.db"
    _crashed_store(db)
    wal, shm = db.with_name("c.db-wal"), db.with_name("c.db-shm")
    if damage == "deleted":
        wal.unlink()
        shm.unlink()
    elif damage == "overwritten":
        wal.write_bytes(os.urandom(wal.stat().st_size))
    else:  # a backup of the main file alone, taken while the job ran, copied back later
        backup = tmp_path / "backup.db"
        shutil.copyfile(db, backup)
        _resumes_at(db, 2000)  # the store itself is fine
        shutil.copyfile(backup, db)
    with pytest.raises(CheckpointError, match=r"c.db is older than its marker .*c.db.generation"):
        SqliteCheckpointStore(db).open("job")
    with pytest.raises(CheckpointError, match=r"c.db is older than its marker"):
        SqliteCheckpointStore(db).committed("job")  # tailrace checkpoints show, too


@pytest.mark.parametrize("damage", ["truncated to 0 bytes", "deleted"])
def test_an_emptied_store_is_refused(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "c.db"
    _crashed_store(db)
    _resumes_at(db, 2000)  # clean close: SQLite folds the WAL in
    assert not db.with_name("c.db-wal").exists()
    if damage == "deleted":
        db.unlink()
        with pytest.raises(CheckpointError, match=r"c.db is missing, but its marker"):
            SqliteCheckpointStore(db).committed("job")
    else:
        db.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"c.db is empty .* held checkpoints"):
        SqliteCheckpointStore(db).open("job")


def test_another_stores_database_is_refused(tmp_path: Path) -> None:
    db, other = tmp_path / "c.db", tmp_path / "other" / "c.db"
    _resumes_at_after_write(db, 5)
    _resumes_at_after_write(other, 7)
    shutil.copyfile(other, db)
    with pytest.raises(CheckpointError, match=r"c.db is not the store its marker"):
        SqliteCheckpointStore(db).open("job")


def _resumes_at_after_write(db: Path, offset: int) -> None:
    s = SqliteCheckpointStore(db)
    s.open("job")
    s.write("t", {A0: offset})
    s.close()


def test_a_store_ahead_of_its_marker_or_without_one_is_fine(tmp_path: Path) -> None:
    """What crashes leave (the marker is written after the write it names) is accepted."""
    db = tmp_path / "c.db"
    _crashed_store(db)
    m = GenerationMarker.read(marker_path(db))
    assert m is not None and m.generation == 20
    GenerationMarker.create(marker_path(db), m.store_id, 17)  # killed before the last marker updates
    _resumes_at(db, 2000)
    marker_path(db).unlink()  # killed between the schema and the marker's creation
    _resumes_at(db, 2000)
    m2 = GenerationMarker.read(marker_path(db))
    assert m2 is not None and m2.store_id == m.store_id and m2.generation == 20
    with open(marker_path(db), "r+b") as f:  # a torn marker update: the other slot holds
        f.seek(0)
        f.write(b"\xff" * 8)
    _resumes_at(db, 2000)
    # a new store killed before its first commit and then emptied: nothing was committed
    fresh = tmp_path / "fresh.db"
    new = SqliteCheckpointStore(fresh)
    new.open("job")
    new.close()
    fresh.write_bytes(b"")
    s = SqliteCheckpointStore(fresh)
    s.open("job")
    assert s.load("t") == {}
    s.close()


def test_deleting_the_marker_resumes_from_the_older_checkpoint_on_purpose(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _crashed_store(db)
    shutil.copyfile(db, tmp_path / "backup.db")
    _resumes_at(db, 2000)
    shutil.copyfile(tmp_path / "backup.db", db)
    with pytest.raises(CheckpointError, match="older than its marker"):
        SqliteCheckpointStore(db).open("job")
    marker_path(db).unlink()
    s = SqliteCheckpointStore(db)
    s.open("job")
    assert s.load("t") == {}  # the backup predates every commit: all replayed, as asked
    s.close()


def _container_proc(db: Path, index: int, parent: str = "os.getppid()") -> subprocess.Popen[str]:
    """A process opening ``db`` as container ``index`` of a --containers run, then holding it."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        from tailrace.errors import CheckpointError
        from tailrace.sqlite import SqliteCheckpointStore
        from tailrace.types import SystemStreamPartition as SSP
        s = SqliteCheckpointStore({str(db)!r})
        s.as_container({index}, {parent})
        try:
            s.open("job")
        except CheckpointError as e:
            print("refused:", e, flush=True)
            sys.exit(1)
        s.write("Partition {index}", {{SSP("files", "in", {index}): {index}}})
        print("open", flush=True)
        time.sleep(60)
        """
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_containers_share_the_store_only_under_the_parent_holding_the_job_lock(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    parent = SqliteCheckpointStore(db)
    parent.open("job")  # this process plays the `tailrace run --containers 2` parent
    procs = [_container_proc(db, 0), _container_proc(db, 1)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "open"
        # the same container twice: refused by its own lock
        twin = _container_proc(db, 1)
        out, _ = twin.communicate(timeout=30)
        assert twin.returncode == 1 and "in use by container 1 of job 'job'" in out, out
        # any other run of the job: refused by the job's lock
        with pytest.raises(CheckpointError, match="in use by another container for job 'job'"):
            SqliteCheckpointStore(db).open("job")
        # the parent gone, its containers still stopping: a new run is refused by their locks...
        parent.close()
        with pytest.raises(
            CheckpointError, match=r"in use by a container of an earlier run of job 'job' \(pid"
        ):
            SqliteCheckpointStore(db).open("job")
        # ...and a container whose parent does not hold the job's lock is refused
        orphan = _container_proc(db, 2)
        out, _ = orphan.communicate(timeout=30)
        assert orphan.returncode == 1 and "container 2 of job 'job' refused" in out, out
        assert "lock held by nobody" in out
    finally:
        for p in procs:
            p.kill()
            p.wait()
    s = SqliteCheckpointStore(db)
    s.open("job")  # the kernel dropped the containers' locks with them
    assert s.committed() == {
        "Partition 0": {SSP("files", "in", 0): 0},
        "Partition 1": {SSP("files", "in", 1): 1},
    }
    s.close()
