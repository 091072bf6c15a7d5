"""SQLite checkpoint store (stdlib sqlite3, WAL, synchronous=FULL).

One row per (job, task, system, stream, partition) holds the committed offset;
``write`` replaces a task's rows in one transaction, so after a crash either the
whole new checkpoint or the whole previous one is read back. Offsets keep their
type: the column has no affinity, so an int stays an INTEGER and a str a TEXT.

A ``meta`` table records ``schema_version``; a store written by a newer (or
unknown) schema is refused. ``open`` runs ``PRAGMA integrity_check`` (the store is small): a corrupt or
truncated file stops start-up with CheckpointError instead of silently starting
again from offset 0.

**A damaged store never looks empty (or older).** Every write bumps a
``generation`` counter in ``meta`` (in the same transaction), and once it is
durable, records it in a small marker file next to the database,
``<db>.generation`` (two checksummed slots written alternately, so a torn write
leaves the previous one readable). ``open`` (and every reader, through
:func:`connect`) compares the two: a database whose generation is below its
marker's (its ``-wal`` file deleted or overwritten before SQLite folded it into
the main file, the main file restored alone from a backup) or that lost its
schema while the marker says it held checkpoints (truncated to 0 bytes,
deleted) is refused with CheckpointError naming both files. Crash points are
safe by order: the marker is written only after the write it names is durable,
so a crash leaves the database at or ahead of its marker, which is accepted; a
new store's schema is folded into the main file (``wal_checkpoint(TRUNCATE)``)
before its marker is created. The marker also carries the store's random id,
so a different store's database copied over this one is refused as well.

One container per job and store at a time, whatever path names the file: ``open``
takes an exclusive ``flock`` on ``<db>.<job>.lock`` (which also records the
holder's pid for the error message), and an open-file-description lock
(``F_OFD_SETLK``) on a byte of the database file itself, at an offset derived
from the job name far beyond anything SQLite locks. The second lock is keyed by
the file (its inode), so a hard link, symlink or bind mount of the same database
is refused too. And since SQLite names its ``-wal`` and ``-shm`` files after the
path (symlinks resolved), a database in use under one real path is refused under
any other (a hard link or bind mount), whatever the job: see ``_claim_name``.
The locks are held until ``close``; the kernel drops them when the holder dies,
so a crashed container never blocks the next one.

``tailrace run --containers N`` shares one store between N container processes of
one job and still refuses every other run of it: the parent holds the job's locks
(an ordinary ``open``), and container i opens the store ``as_container(i, parent)``,
taking ``<db>.<job>.container-i.lock`` and a database byte keyed by job and index
instead, after checking that the job's lock is held by its parent. An ordinary
``open`` checks, after taking the job's lock, that no container lock of the job is
held (a container of an earlier run still stopping); so of a newcomer and such a
container, whichever comes second is refused.

The modules, each a concern:

- ``checkpoint``: :class:`SqliteCheckpointStore` (offsets and state in one transaction,
  state readers, the locks taken on ``open``);
- ``database``: opening a database (schema, integrity check, generation check), :func:`connect`;
- ``marker``: :class:`GenerationMarker`, the ``<db>.generation`` file;
- ``locks``: the lock files and the locks on the database file itself.
"""

from __future__ import annotations

from .checkpoint import SqliteCheckpointStore
from .database import SCHEMA_VERSION, connect
from .locks import container_lock_path, lock_path
from .marker import GenerationMarker, marker_path

__all__ = [
    "SCHEMA_VERSION",
    "GenerationMarker",
    "SqliteCheckpointStore",
    "connect",
    "container_lock_path",
    "lock_path",
    "marker_path",
]
