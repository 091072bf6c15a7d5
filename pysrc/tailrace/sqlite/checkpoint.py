"""The SQLite checkpoint store, :class:`SqliteCheckpointStore`: committed offsets and
state written in one transaction, state read from any thread (see ``tailrace.sqlite``)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..config import options_checked
from ..errors import CheckpointError
from ..interfaces import CheckpointStore, CommitOutputs, EncodedRows, StateChanges
from ..stores import split_changes
from ..types import Offset, Offsets, SystemStreamPartition
from .database import _OUTPUT_SCHEMA, _STATE_SCHEMA, _access_hint, _bump_generation, _open_checked, connect
from .locks import (
    _claim_name,
    _holder,
    _inode_locks,
    _inode_locks_guard,
    _InodeLock,
    _ofd,
    container_lock_path,
    lock_path,
)
from .marker import GenerationMarker, marker_path

log = logging.getLogger("tailrace.sqlite")

_SCAN_BATCH = 1024  # rows per query of a range scan
_WRITER_CACHE_KIB = -65536  # the writer's page cache: at most 64 MiB (grows only as used)

# Test hook (fault tests only): after this many successful writes, the next write
# creates the marker file and stalls inside its open transaction (so a test can kill
# the process mid-write).
_STALL_AFTER_ENV = "TAILRACE_TEST_SQLITE_STALL_AFTER"
_STALL_MARKER_ENV = "TAILRACE_TEST_SQLITE_STALL_MARKER"


class SqliteCheckpointStore(CheckpointStore):
    """Committed offsets and state in a SQLite file (see ``tailrace.sqlite``).

    ``path``: the database file (also the job file's ``[checkpoints] path``); ``open``
    creates it, and its directory, when missing.

    Thread-safety: ``open``, ``load``, ``reset`` and ``close`` on the loop thread only
    (one container per job and store: see ``tailrace.sqlite``), ``write`` on the job's commit
    writer thread (``background_writes``: one write at a time, while the loop goes on);
    ``state_get`` and ``state_scan`` from any thread (each reading thread has a
    read-only connection of its own).
    """

    # a write waits on fsync (synchronous=FULL): commits are written off the loop thread
    background_writes = True
    # a store's changes come encoded straight into the rows of the state table's statements
    takes_rows = True

    @options_checked
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._job: str | None = None
        self._lock_fd: int | None = None
        self._lock_key: str | None = None  # the key of our OFD lock on the database file
        self._container: tuple[int, int] | None = None  # (index, parent pid): see as_container
        self._inode: tuple[int, int] | None = None  # the database file's (st_dev, st_ino) we lock
        self._marker: GenerationMarker | None = None
        self._writes = 0
        self._max_rows = 0  # rows a state statement holds on the writer's connection (once known)
        # state readers: one connection per reading thread (WAL: they never block the writer)
        self._readers_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._local = threading.local()
        self._generation = 0  # bumped on close: a thread's old reader is not reused
        # (task, store) -> state_scopes.id of the open job; emptied by open and close (the
        # next open may be another job, and a reset from elsewhere may run in between)
        self._scopes: dict[tuple[str, str], int] = {}
        self._new_scopes: dict[tuple[str, str], int] = {}  # resolved by the write in progress
        stall = os.environ.get(_STALL_AFTER_ENV)
        self._stall_after = int(stall) if stall else None

    # -- opening --------------------------------------------------------------
    def as_container(self, index: int, parent_pid: int) -> None:
        """Open (next ``open``) as container ``index`` of a ``tailrace run --containers N``
        whose parent, process ``parent_pid``, holds the job's lock: instead of the job's
        lock this store takes the lock of that container alone (``container_lock_path``,
        and a byte of the database keyed by job and index), so the N containers share the
        store while any other run of the job stays refused. ``open`` refuses unless the
        job's lock is held by ``parent_pid`` and it is this process's parent."""
        self._container = (index, parent_pid)

    def open(self, job_name: str) -> None:
        if self._conn is not None:
            raise CheckpointError(f"checkpoint store {self.path} is already open (job {self._job!r})")
        self._forget_scopes()  # of an earlier run: another job, or reset since
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._container is None:
            self._lock_fd = self._take_lock(job_name)
            self._lock_key = job_name
        else:
            index, parent = self._container
            self._lock_fd = self._take_container_lock(job_name, index, parent)
            self._lock_key = f"{job_name}\0container {index}"
        try:
            if self._container is None:
                self._refuse_live_containers(job_name)
            self._take_inode_lock(job_name, self._lock_key)
            self._conn, self._marker = _open_checked(self.path, create=True)
            self._conn.executescript(_STATE_SCHEMA)  # stores created before state existed
            self._conn.executescript(_OUTPUT_SCHEMA)  # and before exactly-once outputs
            # a commit's state flush touches many pages in one transaction: pages past the
            # default 2 MiB cache spill to the WAL before the commit (written twice)
            self._conn.execute(f"PRAGMA cache_size = {_WRITER_CACHE_KIB}")
        except BaseException:
            self._release_lock()
            raise
        self._job = job_name

    def _take_lock(self, job_name: str) -> int:
        lp = lock_path(self.path, job_name)
        try:
            fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise CheckpointError(
                f"cannot use checkpoint store {self.path}: cannot create its lock file {lp} "
                f"({e.strerror}){_access_hint(self.path)}; nothing in it was changed (its checkpoints "
                "are intact as far as tailrace can tell)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd) or "unknown"
            os.close(fd)
            raise CheckpointError(
                f"checkpoint store {self.path} is in use by another container for job {job_name!r} "
                f"(pid {holder}, lock file {lp}); stop it first"
            ) from None
        except OSError as e:
            os.close(fd)
            raise CheckpointError(f"cannot lock checkpoint store {self.path} ({lp}): {e}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _take_container_lock(self, job_name: str, index: int, parent: int) -> int:
        """The lock of container ``index`` (see ``as_container``): taken first, then the
        job's lock is checked to be held by our parent. A run that takes the job's lock
        checks the container locks after taking it (``_refuse_live_containers``), so of
        a newcomer and a container of an earlier parent, one always sees the other."""
        what = f"container {index} of job {job_name!r}"
        lp = container_lock_path(self.path, job_name, index)
        try:
            fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise CheckpointError(
                f"cannot use checkpoint store {self.path}: cannot create the lock file {lp} of {what} "
                f"({e.strerror}){_access_hint(self.path)}"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd) or "unknown"
                raise CheckpointError(
                    f"checkpoint store {self.path} is in use by {what} of another run (pid {holder}, "
                    f"lock file {lp}); stop it first"
                ) from None
            job_fd = os.open(lock_path(self.path, job_name), os.O_RDONLY | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(job_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    holder_pid = None  # nobody holds the job's lock
                except BlockingIOError:
                    text = _holder(job_fd)
                    holder_pid = int(text) if text.isdigit() else None
            finally:
                os.close(job_fd)  # drops our shared lock, if we got it
            if holder_pid is None or holder_pid != parent or os.getppid() != parent:
                raise CheckpointError(
                    f"{what} refused: a container of a job with --containers / job.container.count "
                    f"runs only under the `tailrace run` that started it and holds the job's lock "
                    f"(expected pid {parent}, parent {os.getppid()}, lock held by "
                    f"{holder_pid if holder_pid is not None else 'nobody'})"
                )
        except OSError as e:
            os.close(fd)
            raise CheckpointError(f"cannot lock checkpoint store {self.path} ({lp}): {e}") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _refuse_live_containers(self, job_name: str) -> None:
        """CheckpointError when a container of an earlier ``--containers`` run of the job still
        holds its lock (its parent gone, it is still stopping); we hold the job's lock."""
        prefix = lock_path(self.path, job_name).name[: -len(".lock")] + ".container-"
        try:
            names = [n for n in os.listdir(self.path.parent) if n.startswith(prefix) and n.endswith(".lock")]
        except OSError as e:
            where = f"checkpoint store {self.path}"
            raise CheckpointError(f"cannot list the lock files of {where}: {e}") from None
        for name in sorted(names):
            lp = self.path.parent / name
            try:
                fd = os.open(lp, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd) or "unknown"
                raise CheckpointError(
                    f"checkpoint store {self.path} is in use by a container of an earlier run of job "
                    f"{job_name!r} (pid {holder}, lock file {lp}); wait until it stops"
                ) from None
            finally:
                os.close(fd)

    def _take_inode_lock(self, job_name: str, key: str) -> None:
        """Lock ``key`` (the job's name, or a container's key) on the database file itself
        (any path to it: see ``tailrace.sqlite``)."""
        other_name = CheckpointError(
            f"checkpoint store {self.path} is open under another name (a hard link or bind mount of "
            "the same database file) by another container; SQLite keeps a write-ahead log per name, "
            "so one database used under two names would be corrupted: use one path everywhere"
        )
        in_use = CheckpointError(
            f"checkpoint store {self.path} is in use by another container for job {job_name!r}: "
            "the same database file is open under another name (a hard link, symlink or bind mount); "
            "stop that container first"
        )
        try:
            with _inode_locks_guard:  # also orders creation: one stat/open per inode in this process
                fd = -1
                try:
                    st = os.stat(self.path)
                except FileNotFoundError:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # a new, empty store
                    st = os.fstat(fd)
                inode = (st.st_dev, st.st_ino)
                name = os.path.realpath(self.path)
                entry = _inode_locks.get(inode)
                if entry is None:
                    entry = _InodeLock(fd if fd >= 0 else os.open(self.path, os.O_RDWR), name)
                    try:
                        claimed = _claim_name(entry.fd, name)
                    except BaseException:
                        os.close(entry.fd)
                        raise
                    if not claimed:
                        os.close(entry.fd)
                        raise other_name
                    _inode_locks[inode] = entry
                elif entry.name != name:
                    raise other_name
                if key in entry.jobs:
                    raise in_use  # another store of this process (OFD locks of one descriptor never conflict)
                try:
                    _ofd(entry.fd, fcntl.F_WRLCK, key)
                except OSError as e:
                    if not entry.jobs:
                        del _inode_locks[inode]
                        os.close(entry.fd)
                    if e.errno in (errno.EAGAIN, errno.EACCES):
                        raise in_use from None
                    raise CheckpointError(f"cannot lock checkpoint store {self.path}: {e}") from None
                entry.jobs.add(key)
                self._inode = inode
        except OSError as e:
            raise CheckpointError(f"cannot open checkpoint store {self.path}: {e}") from None

    def _release_lock(self) -> None:
        inode, self._inode = self._inode, None
        key, self._lock_key = self._lock_key, None
        if inode is not None and key is not None:
            with _inode_locks_guard:
                entry = _inode_locks.get(inode)
                if entry is not None and key in entry.jobs:
                    entry.jobs.discard(key)
                    if entry.jobs:
                        _ofd(entry.fd, fcntl.F_UNLCK, key)
                    else:  # the last store of this file in this process: its SQLite connection is closed
                        del _inode_locks[inode]
                        os.close(entry.fd)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None or self._job is None:
            raise CheckpointError(f"checkpoint store {self.path} is not open")
        return self._conn

    # -- CheckpointStore ------------------------------------------------------
    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        db = self._db()
        try:
            rows = db.execute(
                "SELECT system, stream, partition, committed_offset FROM checkpoints"
                " WHERE job = ? AND task = ?",
                (self._job, task_name),
            ).fetchall()
        except sqlite3.DatabaseError as e:
            raise CheckpointError(f"checkpoint store {self.path}: cannot read task {task_name!r}: {e}") from e
        return {SystemStreamPartition(s, st, p): _offset(self.path, off) for s, st, p, off in rows}

    def write(
        self,
        task_name: str,
        offsets: Offsets,
        state: StateChanges | None = None,
        outputs: CommitOutputs | None = None,
    ) -> None:
        db = self._db()
        if outputs is not None and outputs.records:
            raise CheckpointError(f"checkpoint store {self.path} cannot append Redis entries")
        now = time.time()
        rows = []
        for ssp, off in offsets.items():
            if isinstance(off, bool) or not isinstance(off, (int, str)):
                raise CheckpointError(f"offset of {ssp} must be an int or a str, got {off!r}")
            rows.append((self._job, task_name, ssp.system, ssp.stream, ssp.partition, off, now))
        try:
            with db:  # one transaction: all rows of this commit or none
                db.execute("BEGIN IMMEDIATE")
                db.executemany(
                    "INSERT INTO checkpoints"
                    " (job, task, system, stream, partition, committed_offset, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (job, task, system, stream, partition) DO UPDATE SET"
                    " committed_offset = excluded.committed_offset, updated_at = excluded.updated_at",
                    rows,
                )
                self._new_scopes.clear()
                if state:
                    self._write_state(db, task_name, state)
                if outputs is not None and outputs.marks:
                    db.executemany(
                        "INSERT INTO output_marks (job, path, length) VALUES (?, ?, ?)"
                        " ON CONFLICT (job, path) DO UPDATE SET length = excluded.length",
                        [(self._job, path, length) for path, length in outputs.marks.items()],
                    )
                generation = _bump_generation(db)
                self._test_stall()
        except sqlite3.Error as e:
            raise CheckpointError(
                f"checkpoint store {self.path}: writing task {task_name!r} failed: {e}"
            ) from e
        if self._new_scopes:
            self._scopes.update(self._new_scopes)
        self._writes += 1
        self._record_generation(generation)

    def output_marks(self, paths: Iterable[str] | None = None) -> dict[str, int]:
        db = self._db()
        try:
            if paths is None:
                rows = db.execute(
                    "SELECT path, length FROM output_marks WHERE job = ?", (self._job,)
                ).fetchall()
            else:
                rows = []
                for path in paths:
                    rows += db.execute(
                        "SELECT path, length FROM output_marks WHERE job = ? AND path = ?", (self._job, path)
                    ).fetchall()
        except sqlite3.DatabaseError as e:
            raise CheckpointError(f"checkpoint store {self.path}: cannot read output lengths: {e}") from e
        return dict(rows)

    def _record_generation(self, generation: int) -> None:
        """After a write is durable: raise the marker's lower bound to it (see ``tailrace.sqlite``)."""
        if self._marker is None:
            return
        try:
            self._marker.record(generation)
        except OSError as e:  # the write itself is durable: the database is ahead, which is safe
            log.warning(
                "checkpoint marker %s not updated (%s); the checkpoint is written", self._marker.path, e
            )

    def _write_state(self, db: sqlite3.Connection, task_name: str, state: StateChanges) -> None:
        """The task's store changes, inside the checkpoint's transaction (rule 26).

        Each store's scope is looked up inside this transaction, not taken from the cache:
        the rows go to the scope that names (job, task, store) now, whatever happened to the
        file since the cache was filled (one indexed lookup per store and commit)."""
        for store, changes in state.items():
            scope = self._scope_id(db, task_name, store, cache=False)
            if scope is None:
                db.execute(
                    "INSERT INTO state_scopes (job, task, store) VALUES (?, ?, ?)",
                    (self._job, task_name, store),
                )
                scope = self._scope_id(db, task_name, store, cache=False)
                if scope is None:
                    raise sqlite3.DatabaseError(f"state scope of store {store!r} vanished")
            if self._scopes.get((task_name, store)) != scope:
                self._new_scopes[task_name, store] = scope  # cached once the transaction commits
            if isinstance(changes, EncodedRows):  # the commit writer's (takes_rows)
                puts, deletes = changes.puts, changes.deletes
            else:
                puts, deletes = split_changes(changes, yield_gil=True)
            # as few statements as SQLite allows (thousands of rows a statement), so that
            # the sqlite3 module takes the GIL once per statement, not once per row: it lets
            # the GIL go around each step, and on the commit writer's thread each take back
            # may wait for the loop thread (up to the switch interval, 5 ms)
            most = self._max_rows or _max_rows(db)
            self._max_rows = most
            _run_rows(db, _UPSERT, scope, puts, 2, most)
            _run_rows(db, _DELETE, scope, deletes, 1, most)

    def _scope_id(
        self, db: sqlite3.Connection, task_name: str, store: str, *, cache: bool = True
    ) -> int | None:
        """The scope id of a task's store (cached once known), or None if it never held state."""
        row = db.execute(
            "SELECT id FROM state_scopes WHERE job = ? AND task = ? AND store = ?",
            (self._job, task_name, store),
        ).fetchone()
        if row is None:
            return None
        scope: int = row[0]
        if cache:
            self._scopes[task_name, store] = scope
        return scope

    def _forget_scopes(self) -> None:
        """Drop the cached scope ids: they belong to one open of one job."""
        self._scopes = {}
        self._new_scopes = {}

    # -- state reads (any thread) ----------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        """This thread's read connection to the store."""
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.generation == self._generation:
            return conn
        if self._conn is None:
            raise CheckpointError(f"checkpoint store {self.path} is not open")
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=10.0, check_same_thread=False)
            conn.execute("PRAGMA query_only = 1")
        except sqlite3.Error as e:
            raise CheckpointError(f"checkpoint store {self.path}: cannot open a state reader: {e}") from e
        with self._readers_lock:
            self._readers.append(conn)
        local.conn = conn
        local.generation = self._generation
        return conn

    def state_get(self, task_name: str, store: str, key: bytes) -> bytes | None:
        try:
            reader = self._reader()
            scope = self._scopes.get((task_name, store))
            if scope is None:
                scope = self._scope_id(reader, task_name, store)
                if scope is None:
                    return None
            sql = "SELECT value FROM state WHERE scope = ? AND key = ?"
            row = reader.execute(sql, (scope, key)).fetchone()
        except sqlite3.Error as e:
            raise CheckpointError(
                f"checkpoint store {self.path}: reading store {store!r} of task {task_name!r} failed: {e}"
            ) from e
        return None if row is None else bytes(row[0])

    def state_scan(
        self, task_name: str, store: str, start: bytes | None = None, end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        reader = self._reader()
        try:
            scope = self._scopes.get((task_name, store)) or self._scope_id(reader, task_name, store)
        except sqlite3.Error as e:
            raise CheckpointError(
                f"checkpoint store {self.path}: scanning store {store!r} of task {task_name!r} failed: {e}"
            ) from e
        if scope is None:
            return
        where = "scope = ?"
        args: list[Any] = [scope]
        if end is not None:
            where += " AND key < ?"
            args.append(end)
        first_op, after = ">=", start
        while True:
            sql = f"SELECT key, value FROM state WHERE {where}"
            params = list(args)
            if after is not None:
                sql += f" AND key {first_op} ?"
                params.append(after)
            sql += f" ORDER BY key LIMIT {_SCAN_BATCH}"
            try:
                rows = reader.execute(sql, params).fetchall()
            except sqlite3.Error as e:
                raise CheckpointError(
                    f"checkpoint store {self.path}: scanning store {store!r} "
                    f"of task {task_name!r} failed: {e}"
                ) from e
            for k, v in rows:
                yield bytes(k), bytes(v)
            if len(rows) < _SCAN_BATCH:
                return
            first_op, after = ">", bytes(rows[-1][0])

    def _close_readers(self) -> None:
        with self._readers_lock:
            readers, self._readers = self._readers, []
            self._generation += 1
        for conn in readers:
            try:
                conn.close()
            except sqlite3.Error:
                log.warning("closing a state reader of %s failed", self.path)

    def _test_stall(self) -> None:
        if self._stall_after is None or self._writes < self._stall_after:
            return
        marker = os.environ.get(_STALL_MARKER_ENV)
        if marker:
            Path(marker).write_text(str(os.getpid()))
        log.warning("test hook %s: stalling inside a checkpoint transaction", _STALL_AFTER_ENV)
        time.sleep(3600)

    def close(self) -> None:
        self._close_readers()
        self._forget_scopes()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
                self._job = None
                self._release_lock()
        else:
            self._release_lock()

    # -- tools (CLI) ----------------------------------------------------------
    def committed(self, job_name: str | None = None) -> dict[str, dict[SystemStreamPartition, Offset]]:
        """Every committed offset of a job per task (the open job by default)."""
        rows = self._read_job(
            "checkpoints",
            "SELECT task, system, stream, partition, committed_offset FROM checkpoints"
            " WHERE job = ? ORDER BY task, system, stream, partition",
            job_name,
            never_written=self._never_committed,
        )
        out: dict[str, dict[SystemStreamPartition, Offset]] = {}
        for task, s, st, p, off in rows:
            out.setdefault(task, {})[SystemStreamPartition(s, st, p)] = _offset(self.path, off)
        return out

    def state_counts(self, job_name: str | None = None) -> dict[str, dict[str, int]]:
        """Entries per task and store of a job's state (the open job by default); a store
        that was used, then emptied or reset, counts 0. Reads without the lock, as
        ``committed`` does."""
        rows = self._read_job(
            "state_scopes",
            "SELECT s.task, s.store, (SELECT count(*) FROM state WHERE scope = s.id)"
            " FROM state_scopes s WHERE s.job = ? ORDER BY s.task, s.store",
            job_name,
            never_written=lambda: True,
        )
        out: dict[str, dict[str, int]] = {}
        for task, store, n in rows:
            out.setdefault(task, {})[store] = int(n)
        return out

    def _never_committed(self) -> bool:
        """The database file is missing and its marker says it never held a checkpoint (a
        missing file the marker vouches for is a damaged store: ``connect`` says so)."""
        marker = GenerationMarker.read(marker_path(self.path))
        return marker is None or marker.generation == 0

    def _read_job(
        self, table: str, sql: str, job_name: str | None, *, never_written: Callable[[], bool]
    ) -> list[Any]:
        """The rows of ``sql`` for a job (the open job by default), read without the lock: on
        the store's connection when open, else on one of their own; when the database
        is missing and ``never_written`` says that is fine, or ``table`` does not exist: none."""
        job = job_name or self._job
        db = self._db() if self._conn is not None else None
        close = False
        if db is None:
            if not self.path.exists() and never_written():
                return []
            db = connect(self.path, create=False)
            close = True
        try:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() is None:
                return []
            return db.execute(sql, (job,)).fetchall()
        except sqlite3.DatabaseError as e:
            raise CheckpointError(f"checkpoint store {self.path}: cannot read: {e}") from e
        finally:
            if close:
                db.close()

    def reset(self) -> int:
        """Delete every checkpoint of the open job with the state of its stores; returns how
        many checkpoint rows were deleted. The job's scope rows stay (empty): a scope id is
        never freed, so never given to another (job, task, store) while some store object
        may still hold it."""
        db = self._db()
        try:
            with db:
                db.execute("BEGIN IMMEDIATE")
                cur = db.execute("DELETE FROM checkpoints WHERE job = ?", (self._job,))
                generation = _bump_generation(db)
                db.execute(
                    "DELETE FROM state WHERE scope IN (SELECT id FROM state_scopes WHERE job = ?)",
                    (self._job,),
                )
            self._forget_scopes()
        except sqlite3.Error as e:
            raise CheckpointError(f"checkpoint store {self.path}: reset failed: {e}") from e
        self._record_generation(generation)
        return cur.rowcount


def _offset(path: Path, value: Any) -> Offset:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    raise CheckpointError(f"checkpoint store {path} holds an offset of unexpected type: {value!r}")


_HAND_OVER_S = 20e-6  # the GIL let go between two statements of one state write
_MAX_ROWS = 8192  # rows per statement of a state write, at most (parameters permitting)
# Plain ``?`` only: the scope is the first, then the values. A numbered ``?1`` reads as a named
# parameter to the sqlite3 module, which warns on 3.12 and 3.13 when given a sequence and
# refuses it from 3.14.
_UPSERT = "INSERT OR REPLACE INTO state (scope, key, value) SELECT ?, column1, column2 FROM (VALUES (?,?))"
_DELETE = "DELETE FROM state WHERE scope = ? AND key IN (?)"
_statements: dict[tuple[str, int], str] = {}  # (template, rows) -> SQL text


def _statement(template: str, rows: int) -> str:
    """The SQL text of ``rows`` rows of ``template`` (the scope, then ``?`` per value)."""
    sql = _statements.get((template, rows))
    if sql is None:
        more = ",(?,?)" if template is _UPSERT else ",?"
        sql = template[:-1] + more * (rows - 1) + ")"
        _statements[template, rows] = sql
    return sql


def _max_rows(db: sqlite3.Connection) -> int:
    """Rows a statement of two parameters a row may hold on this connection (a power of two)."""
    limit = db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    rows = 1
    while rows * 2 <= _MAX_ROWS and rows * 2 * 2 + 1 <= limit:
        rows *= 2
    return rows


def _run_rows(
    db: sqlite3.Connection, template: str, scope: int, params: list[Any], width: int, most: int
) -> None:
    """Run ``template`` over ``params`` (``width`` parameters a row) in statements of
    ``most`` rows, the rest in statements of power-of-two sizes: a handful of distinct SQL
    texts, each prepared once (the sqlite3 module's statement cache), shared by every scope."""
    total = len(params) // width
    at = 0
    size = most
    while at < total:
        while size > total - at:
            size //= 2
        db.execute(_statement(template, size), [scope, *params[at * width : (at + size) * width]])
        at += size
        if at < total:
            # binding a statement's parameters holds the GIL; a moment without it between
            # statements lets a waiting loop thread in, instead of after the 5 ms switch
            # interval (bench/commit_pause.py measures the loop's longest pause)
            time.sleep(_HAND_OVER_S)
