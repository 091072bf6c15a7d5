"""One container per job and store: the lock files, and the locks on the database
file itself that hold whatever path names it (see ``tailrace.sqlite``)."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
import threading
import time
import zlib
from pathlib import Path

from .._digest import blake2b


def _holder(fd: int) -> str:
    """What a lock file holds (the pid its holder wrote), as text; "" when empty."""
    return os.pread(fd, 64, 0).decode(errors="replace").strip()


def lock_path(db: Path, job_name: str) -> Path:
    """The lock file guarding ``job_name`` in store ``db``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)[:64]
    return db.with_name(f"{db.name}.{safe}-{zlib.crc32(job_name.encode()):08x}.lock")


def container_lock_path(db: Path, job_name: str, index: int) -> Path:
    """The lock file of container ``index`` of a ``--containers`` run of ``job_name`` in ``db``."""
    job = lock_path(db, job_name)
    return job.with_name(f"{job.name[: -len('.lock')]}.container-{index}.lock")


# -- the per-file job lock --------------------------------------------------------
# An OFD lock belongs to an open file description, so it conflicts between
# processes and between descriptors, but is released only when that descriptor
# closes. Closing *any* descriptor of a file also drops the process's POSIX
# locks on it, which is how SQLite locks: so each process keeps one descriptor
# per database inode, shared by every store of that process, and closes it only
# when the last of them closes (after its own SQLite connection).
_LOCK_BASE = 1 << 62  # far above SQLite's lock bytes (around 2**30)
_FLOCK = struct.Struct("=hh4xqqi4x")  # struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid)


def _lock_byte(job_name: str) -> int:
    return _LOCK_BASE + int.from_bytes(blake2b(job_name.encode(), digest_size=5).digest(), "big")


class _InodeLock:
    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name  # the real path this process uses for the file
        self.jobs: set[str] = set()


_inode_locks: dict[tuple[int, int], _InodeLock] = {}
_inode_locks_guard = threading.Lock()


def _ofd_range(fd: int, kind: int, start: int, length: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, start, length, 0))


def _ofd(fd: int, kind: int, job_name: str) -> None:
    _ofd_range(fd, kind, _lock_byte(job_name), 1)


# -- one name per database at a time ----------------------------------------------
# SQLite names its -wal and -shm files after the path it was given (symlinks
# resolved): two processes using one database under two names (hard links, bind
# mounts) would each keep a write-ahead log of their own and corrupt it. Every
# process holding the file takes a read lock on the whole name range except the
# byte of its own name; a newcomer first takes a write lock on the byte of its
# name, which only a holder under another name can block, then its own read
# ranges, then drops the write lock.
_NAME_BASE = 1 << 61
_NAME_SPAN = (1 << 40) - 1


def _name_byte(name: str) -> int:
    return int.from_bytes(blake2b(name.encode(), digest_size=8).digest(), "big") % _NAME_SPAN


def _claim_name(fd: int, name: str) -> bool:
    """Register ``name`` as this process's name of the file behind ``fd``; False when another
    process uses the file under another name."""
    n = _name_byte(name)
    for _ in range(50):  # a holder under the same name blocks the byte only for a moment
        try:
            _ofd_range(fd, fcntl.F_WRLCK, _NAME_BASE + n, 1)
            break
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            time.sleep(0.005)
    else:
        return False
    try:
        if n > 0:
            _ofd_range(fd, fcntl.F_RDLCK, _NAME_BASE, n)
        _ofd_range(fd, fcntl.F_RDLCK, _NAME_BASE + n + 1, _NAME_SPAN - n - 1)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        _ofd_range(fd, fcntl.F_UNLCK, _NAME_BASE, _NAME_SPAN)
        return False
    _ofd_range(fd, fcntl.F_UNLCK, _NAME_BASE + n, 1)
    return True
