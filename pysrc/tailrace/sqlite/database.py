"""Opening a store's database: its schema, the integrity check, and the comparison with
its generation marker (see ``tailrace.sqlite``); the advice its errors give."""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path

from ..errors import CheckpointError
from .marker import GenerationMarker, marker_path

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
# on open when missing (stores written before state existed have none). A scope row is
# never deleted (a reset deletes its state rows only): a new scope gets max(id) + 1, so
# an id is never given to another (job, task, store). (Earlier builds deleted the rows on
# reset; an id they freed may be given again, which is safe as well: cached ids live for
# one open, and a commit looks its scopes up inside its own transaction.)
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

# Committed lengths of a job's exactly-once output files (rule 41), by real path, written
# in the transaction of the checkpoint whose outputs end there. Created on open when missing.
_OUTPUT_SCHEMA = """
CREATE TABLE IF NOT EXISTS output_marks (
    job TEXT NOT NULL,
    path TEXT NOT NULL,
    length INTEGER NOT NULL,
    PRIMARY KEY (job, path)
)
"""
_SCHEMA += _OUTPUT_SCHEMA + ";\n"


def _bump_generation(db: sqlite3.Connection) -> int:
    """Count one more write in ``meta`` (inside the write's transaction); the new generation."""
    row = db.execute(
        "UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation' RETURNING value"
    ).fetchone()
    return int(row[0])


def _access_hint(path: Path) -> str:
    """Why this user may not be able to use the store at ``path`` ('' when nothing is seen)."""
    for f in (path.parent, path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        mode = os.W_OK | (os.X_OK if f.is_dir() else os.R_OK)
        if f.exists() and not os.access(f, mode):
            return f" ({f} is not writable by this user)"
    return ""


def _start_over(path: Path) -> str:
    """How to start again from the beginning of every input: every file of the store at
    ``path`` in one command (the database alone would leave its marker, which then refuses
    the new database, and its ``-wal`` file, which SQLite could apply to the new one)."""
    import shlex

    files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"), marker_path(path)]
    command = " ".join(shlex.quote(str(f)) for f in files)
    return (
        "to start again from the beginning of every input (the checkpoints and state of every job in "
        f"{path.name}), delete the store's four files: rm -f -- {command}"
    )


def _restore_hint(path: Path) -> str:
    return f"restore {path.name} together with its -wal file from a backup; or, {_start_over(path)}"


def _corrupt_hint(path: Path) -> str:
    return f"restore it from a backup; or, {_start_over(path)}"


def connect(path: Path, *, create: bool) -> sqlite3.Connection:
    """Open ``path``, check it is an intact tailrace store of a known schema that did not lose
    writes its generation marker knows of (creating it if asked); CheckpointError otherwise."""
    return _open_checked(path, create=create)[0]


def _open_checked(path: Path, *, create: bool) -> tuple[sqlite3.Connection, GenerationMarker | None]:
    marker = GenerationMarker.read(marker_path(path))
    if not create and not path.exists():
        if marker is not None and marker.generation > 0:
            raise CheckpointError(
                f"checkpoint store {path} is missing, but its marker {marker.path} says it held "
                f"checkpoints (generation {marker.generation}); {_restore_hint(path)}"
            )
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
                f"{_corrupt_hint(path)}"
            )
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            if marker is not None and marker.generation > 0:
                raise CheckpointError(
                    f"checkpoint store {path} is empty (no schema: truncated, replaced, or its -wal file "
                    f"was lost before it was folded into the main file), but its marker {marker.path} says "
                    f"it held checkpoints (generation {marker.generation}); {_restore_hint(path)}"
                )
            if not create:
                return conn, marker  # created, then killed before the schema was written: no checkpoints
            store_id = uuid.uuid4().bytes
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("store_id", store_id.hex()),
                        ("generation", "0"),
                    ],
                )
            # the main file alone must hold the schema and id before a marker names them
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            marker = GenerationMarker.create(marker_path(path), store_id, 0)
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
            marker = _check_generation(conn, path, marker, create=create)
    except sqlite3.OperationalError as e:
        # cannot use it (permissions, a read-only file system, locks, I/O): that says nothing
        # about its contents, so no advice that would destroy them
        conn.close()
        raise CheckpointError(
            f"cannot use checkpoint store {path}: {e}{_access_hint(path)}; nothing in it was "
            "changed (its checkpoints are intact as far as tailrace can tell)"
        ) from e
    except sqlite3.DatabaseError as e:
        conn.close()
        raise CheckpointError(
            f"checkpoint store {path} is corrupt or not a SQLite database ({e}); {_corrupt_hint(path)}"
        ) from e
    except OSError as e:
        conn.close()
        raise CheckpointError(f"checkpoint store {path}: cannot write its marker: {e}") from e
    except BaseException:
        conn.close()
        raise
    return conn, marker


def _check_generation(
    conn: sqlite3.Connection, path: Path, marker: GenerationMarker | None, *, create: bool
) -> GenerationMarker | None:
    """Compare the store's id and generation with its marker's (see ``tailrace.sqlite``)."""
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('store_id', 'generation')"))
    if "store_id" not in meta:  # written before stores had markers: adopt it now
        if not create:
            return marker
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', ?)", (uuid.uuid4().hex,)
            )
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('generation', '0')")
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('store_id', 'generation')"))
    store_id, generation = bytes.fromhex(meta["store_id"]), int(meta["generation"])
    if marker is None:
        if not create:
            return None
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return GenerationMarker.create(marker_path(path), store_id, generation)
    if marker.store_id != store_id:
        raise CheckpointError(
            f"checkpoint store {path} is not the store its marker {marker.path} belongs to (store id "
            f"{store_id.hex()}, marker {marker.store_id.hex()}): the database was replaced by another "
            f"store's; {_restore_hint(path)}"
        )
    if generation < marker.generation:
        raise CheckpointError(
            f"checkpoint store {path} is older than its marker {marker.path} (generation {generation} < "
            f"{marker.generation}): its -wal file was lost or overwritten before being folded into the main "
            f"file, or the main file was restored alone from a backup, so it lacks the latest checkpoints. "
            f"Restore {path.name} together with its -wal file; to resume from these older checkpoints on "
            f"purpose (replaying more input), delete {marker.path.name}; or, {_start_over(path)}"
        )
    return marker
