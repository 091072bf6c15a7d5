"""SQLite checkpoint store (stdlib sqlite3, WAL, synchronous=FULL).

One row per (job, task, system, stream, partition) holds the committed offset;
``write`` replaces a task's rows in one transaction, so after a crash either the
whole new checkpoint or the whole previous one is read back. Offsets keep their
type: the column has no affinity, so an int stays an INTEGER and a str a TEXT.

A ``meta`` table records ``schema_version``; a store written by a newer (or
unknown) schema is refused. ``open`` runs ``PRAGMA integrity_check`` (the store is small): a corrupt or
truncated file stops start-up with CheckpointError instead of silently starting
again from offset 0.

One container per job and store at a time: ``open`` takes an exclusive
``flock`` on ``<db>.<job>.lock`` (held until ``close``; the kernel drops it when
the holder dies, so a crashed container never blocks the next one).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .interfaces import CheckpointStore, StateChanges
from .types import Offset, SystemStreamPartition

log = logging.getLogger("tailrace.sqlite")

SCHEMA_VERSION = 1

_SCHEMA = (
    """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE checkpoints (
    job TEXT NOT NULL,
    task TEXT NOT NULL,
    system TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    committed_offset NOT NULL,  -- no affinity: int offsets stay INTEGER, str offsets TEXT
    updated_at REAL NOT NULL,
    PRIMARY KEY (job, task, system, stream, partition)
);
"""
    + "\n"
)

# Key-value state of the tasks' stores (rules 25-29), written in the same transaction as
# the task's checkpoint rows. A scope is one store of one task of one job; state rows
# carry its integer id (short rows, cheap key compares: the commit flush rate). Keys
# compare as BLOBs (memcmp): range scans follow the order of the encoded keys. Created
# on open when missing (stores written before state existed have none).
_STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS state_scopes (
    id INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    task TEXT NOT NULL,
    store TEXT NOT NULL,
    UNIQUE (job, task, store)
);
CREATE TABLE IF NOT EXISTS state (
    scope INTEGER NOT NULL,
    key BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID
"""
_SCHEMA += _STATE_SCHEMA + ";\n"
_SCAN_BATCH = 1024  # rows per query of a range scan

# Test hook (fault tests only): after this many successful writes, the next write
# creates the marker file and stalls inside its open transaction (so a test can kill
# the process mid-write).
_STALL_AFTER_ENV = "TAILRACE_TEST_SQLITE_STALL_AFTER"
_STALL_MARKER_ENV = "TAILRACE_TEST_SQLITE_STALL_MARKER"


def lock_path(db: Path, job_name: str) -> Path:
    """The lock file guarding ``job_name`` in store ``db``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)[:64]
    return db.with_name(f"{db.name}.{safe}-{zlib.crc32(job_name.encode()):08x}.lock")


class SqliteCheckpointStore(CheckpointStore):
    """Committed offsets in a SQLite file (see module doc). Loop-thread use only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._job: str | None = None
        self._lock_fd: int | None = None
        self._writes = 0
        # state readers: one connection per reading thread (WAL: they never block the writer)
        self._readers_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._local = threading.local()
        self._generation = 0  # bumped on close: a thread's old reader is not reused
        self._scopes: dict[tuple[str, str], int] = {}  # (task, store) -> state_scopes.id
        self._new_scopes: dict[tuple[str, str], int] = {}  # created by the write in progress
        stall = os.environ.get(_STALL_AFTER_ENV)
        self._stall_after = int(stall) if stall else None

    # -- opening --------------------------------------------------------------
    def open(self, job_name: str) -> None:
        if self._conn is not None:
            raise CheckpointError(f"checkpoint store {self.path} is already open (job {self._job!r})")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._take_lock(job_name)
        try:
            self._conn = connect(self.path, create=True)
            self._conn.executescript(_STATE_SCHEMA)
        except BaseException:
            self._release_lock()
            raise
        self._job = job_name

    def _take_lock(self, job_name: str) -> int:
        lp = lock_path(self.path, job_name)
        fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
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

    def _release_lock(self) -> None:
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
        offsets: Mapping[SystemStreamPartition, Offset],
        state: StateChanges | None = None,
    ) -> None:
        db = self._db()
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
                if state:
                    self._new_scopes.clear()
                    self._write_state(db, task_name, state)
                self._test_stall()
        except sqlite3.Error as e:
            raise CheckpointError(
                f"checkpoint store {self.path}: writing task {task_name!r} failed: {e}"
            ) from e
        if state and self._new_scopes:
            self._scopes.update(self._new_scopes)
        self._writes += 1

    def _write_state(self, db: sqlite3.Connection, task_name: str, state: StateChanges) -> None:
        """The task's store changes, inside the checkpoint's transaction (rule 26)."""
        for store, changes in state.items():
            scope = self._scopes.get((task_name, store))
            if scope is None:
                db.execute(
                    "INSERT OR IGNORE INTO state_scopes (job, task, store) VALUES (?, ?, ?)",
                    (self._job, task_name, store),
                )
                scope = self._scope_id(db, task_name, store, cache=False)
                if scope is None:
                    raise sqlite3.DatabaseError(f"state scope of store {store!r} vanished")
                self._new_scopes[task_name, store] = scope  # cached once the transaction commits
            puts = [(scope, k, v) for k, v in changes.items() if v is not None]
            if puts:
                db.executemany("INSERT OR REPLACE INTO state (scope, key, value) VALUES (?, ?, ?)", puts)
            if len(puts) != len(changes):
                db.executemany(
                    "DELETE FROM state WHERE scope = ? AND key = ?",
                    [(scope, k) for k, v in changes.items() if v is None],
                )

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
        job = job_name or self._job
        db = self._db() if self._conn is not None else None
        close = False
        if db is None:
            if not self.path.exists():
                return {}
            db = connect(self.path, create=False)
            close = True
        try:
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'checkpoints'").fetchone() is None:
                return {}
            rows = db.execute(
                "SELECT task, system, stream, partition, committed_offset FROM checkpoints"
                " WHERE job = ? ORDER BY task, system, stream, partition",
                (job,),
            ).fetchall()
        except sqlite3.DatabaseError as e:
            raise CheckpointError(f"checkpoint store {self.path}: cannot read: {e}") from e
        finally:
            if close:
                db.close()
        out: dict[str, dict[SystemStreamPartition, Offset]] = {}
        for task, s, st, p, off in rows:
            out.setdefault(task, {})[SystemStreamPartition(s, st, p)] = _offset(self.path, off)
        return out

    def reset(self) -> int:
        """Delete every checkpoint of the open job; returns how many rows were deleted."""
        db = self._db()
        try:
            with db:
                db.execute("BEGIN IMMEDIATE")
                cur = db.execute("DELETE FROM checkpoints WHERE job = ?", (self._job,))
                db.execute(
                    "DELETE FROM state WHERE scope IN (SELECT id FROM state_scopes WHERE job = ?)",
                    (self._job,),
                )
                db.execute("DELETE FROM state_scopes WHERE job = ?", (self._job,))
            self._scopes.clear()
        except sqlite3.Error as e:
            raise CheckpointError(f"checkpoint store {self.path}: reset failed: {e}") from e
        return cur.rowcount


def _offset(path: Path, value: Any) -> Offset:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    raise CheckpointError(f"checkpoint store {path} holds an offset of unexpected type: {value!r}")


def connect(path: Path, *, create: bool) -> sqlite3.Connection:
    """Open ``path``, check it is an intact tailrace store of a known schema (creating it if asked)."""
    if not create and not path.exists():
        raise CheckpointError(f"checkpoint store {path} does not exist")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=10.0, check_same_thread=False)
    except sqlite3.Error as e:
        raise CheckpointError(f"cannot open checkpoint store {path}: {e}") from e
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        result = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if result != ["ok"]:
            raise CheckpointError(
                f"checkpoint store {path} is corrupt ({'; '.join(map(str, result[:3]))}); "
                "restore it from a backup or delete it to start again from the beginning of every input"
            )
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            if not create:
                return conn  # created, then killed before the schema was written: no checkpoints
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
        elif "meta" not in tables or "checkpoints" not in tables:
            raise CheckpointError(f"{path} is a SQLite database but not a tailrace checkpoint store")
        else:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None or row[0] != str(SCHEMA_VERSION):
                found = "none" if row is None else row[0]
                raise CheckpointError(
                    f"checkpoint store {path} has schema version {found}; this tailrace reads "
                    f"version {SCHEMA_VERSION} (written by a different tailrace version?)"
                )
    except sqlite3.DatabaseError as e:
        conn.close()
        raise CheckpointError(
            f"checkpoint store {path} is corrupt or not a SQLite database ({e}); "
            "restore it from a backup or delete it to start again from the beginning of every input"
        ) from e
    except BaseException:
        conn.close()
        raise
    return conn
