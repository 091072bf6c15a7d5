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
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import CheckpointError
from .interfaces import CheckpointStore, StateChanges
from .types import Offset, SystemStreamPartition

log = logging.getLogger("tailrace.sqlite")

SCHEMA_VERSION = 1

_SCHEMA = """
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
        if state:  # state stores land in their own commit (issue: durable state)
            raise CheckpointError(f"{type(self).__name__} cannot store state yet")
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
                self._test_stall()
        except sqlite3.Error as e:
            raise CheckpointError(
                f"checkpoint store {self.path}: writing task {task_name!r} failed: {e}"
            ) from e
        self._writes += 1

    def _test_stall(self) -> None:
        if self._stall_after is None or self._writes < self._stall_after:
            return
        marker = os.environ.get(_STALL_MARKER_ENV)
        if marker:
            Path(marker).write_text(str(os.getpid()))
        log.warning("test hook %s: stalling inside a checkpoint transaction", _STALL_AFTER_ENV)
        time.sleep(3600)

    def close(self) -> None:
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
                cur = db.execute("DELETE FROM checkpoints WHERE job = ?", (self._job,))
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
