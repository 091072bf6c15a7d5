"""Fingerprints of committed lines: is a partition file still the one the checkpoint
was taken on? (See :mod:`tailrace.files`.)"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import BinaryIO

from .._digest import sha256
from ..errors import InputError
from ..types import Offset, SystemStreamPartition

log = logging.getLogger("tailrace.files")

# -- fingerprints: is this still the file the checkpoint was taken on? ----------------
# A fingerprint is a claim about a partition file, true of it whatever job made it:
# "the up to FINGERPRINT_BYTES bytes that end with the line starting at `offset`
# hash to `sha256`". It is recorded after each checkpoint (PartitionReader.committed)
# and checked when a reader resumes; it lives in one place, fingerprint_path().
# Appending keeps it true; a replacement or rewrite of those bytes breaks it. Writes
# are atomic (rename) but not fsynced: a fingerprint lost in a crash leaves the
# previous one, which is still true.
FINGERPRINT_BYTES = 4096
FINGERPRINT_INTERVAL_S = 1.0  # a reader records at most one fingerprint per interval


def fingerprint_path(path: Path) -> Path:
    """Where the fingerprint of partition file ``<path>/<stream>/<name>`` is kept:
    ``<path>/.tailrace-fingerprints/<stream>/<name>`` (outside every stream directory,
    so a stream directory holds nothing but its partition files)."""
    return path.parent.parent / ".tailrace-fingerprints" / path.parent.name / path.name


def _window_digest(f: BinaryIO, end: int) -> str:
    """SHA-256 of the up to FINGERPRINT_BYTES bytes of ``f`` that end at ``end``."""
    start = max(0, end - FINGERPRINT_BYTES)
    f.seek(start)
    return sha256(f.read(end - start)).hexdigest()


def _line_fingerprint(f: BinaryIO, offset: int) -> tuple[int, str] | None:
    """(end of the line starting at ``offset``, SHA-256 of the window ending there), or
    None when no line starts there. The last line of the file counts without its newline
    (the reader reads it as a line at the end of the file)."""
    f.seek(offset)
    line = f.readline()
    if not line:
        return None
    end = offset + len(line)
    return end, _window_digest(f, end)


def record_fingerprint(path: Path, offset: int, end: int | None = None) -> None:
    """Record the fingerprint of the line of ``path`` starting at ``offset`` (OSError on
    failure). ``end``: where that line ended when it was read, for a last line read without
    a newline (bytes appended since must not count as part of it)."""
    with open(path, "rb") as f:
        if end is None:
            got = _line_fingerprint(f, offset)
        elif end <= os.fstat(f.fileno()).st_size:
            got = end, _window_digest(f, end)
        else:
            got = None
    if got is None:
        return
    end, digest = got
    target = fingerprint_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps({"offset": offset, "end": end, "sha256": digest}))
    os.replace(tmp, target)


def verify_fingerprint(path: Path, f: BinaryIO, ssp: SystemStreamPartition, after: Offset) -> None:
    """Check the recorded fingerprint of ``path`` against its bytes now (read through ``f``);
    InputError naming the file, partition and offsets when the file was replaced or rewritten."""
    fp_file = fingerprint_path(path)
    try:
        claim = json.loads(fp_file.read_text())
        offset, end, digest = int(claim["offset"]), int(claim["end"]), str(claim["sha256"])
    except FileNotFoundError:
        return  # never committed with fingerprints (or the file was written by an older tailrace)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: unreadable fingerprint %s (%s): not checked", path, fp_file, e)
        return
    size = os.fstat(f.fileno()).st_size
    got = _line_fingerprint(f, offset) if end <= size else None
    if got == (end, digest):
        return
    if got is not None and got[0] > end and _window_digest(f, end) == digest:
        # the bytes up to the line's end are the same, but the line goes on: it was the
        # file's last line, read without a newline, and was extended since
        f.seek(end)
        if got[0] == end + 1 and f.read(1) == b"\n":
            return  # only its newline was added: the same line
        raise InputError(
            f"partition {ssp.partition} ({ssp}): the line at byte offset {offset} was the last line of "
            f"the file, without a newline, when it was processed and committed (offset {after}); bytes "
            f"were appended to that line since (it now ends at byte offset {got[0]}), so what was "
            "processed is not the line there now. End every line with a newline when appending; "
            "restore the file, or reset the checkpoints to read it from its start",
            source=str(path),
        )
    if got != (end, digest):
        raise InputError(
            f"partition {ssp.partition} ({ssp}): the file was replaced or rewritten since the checkpoint "
            f"at offset {after}: its bytes before offset {end} (the line at byte offset {offset}, "
            f"fingerprinted at a commit in {fp_file}) are no longer the same. Restore the original "
            "file, or reset the checkpoints to read the new one from its start",
            source=str(path),
        )
