"""Appending to output partition files (:class:`FileProducer`): buffered, flushed and
fsynced before every checkpoint, safe to share between processes."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core import FileOutput, FileSink
from ..interfaces import Producer
from ..serdes import _json_codec, _json_encode  # the raw functions: errors stay the codec's own
from .streams import _CHUNK, _msgpack, partition_file

log = logging.getLogger("tailrace.files")


class FileProducer(Producer):
    """Appends JSON Lines to ``<root>/<stream>/partition-N.jsonl``; ``flush`` writes and fsyncs.

    ``send`` encodes on the caller's thread (the loop's GIL hold) and appends to the
    partition's buffer, compiled (``tailrace._core.FileSink``, which the compiled
    collector calls directly); a buffer is written in one ``os.write`` (which drops
    the GIL) once it holds ``buffer_bytes``, and every buffer is written and fsynced
    by ``flush`` (before every checkpoint). Thread-safe: opening, writing and fsyncing
    hold the producer's lock, and the append itself is one step under the GIL.
    """

    def __init__(
        self, root: Path, partitions: Callable[[str], int], buffer_bytes: int = 1 << 18, fmt: str = "jsonl"
    ) -> None:
        self._root = root
        self._partitions = partitions
        self._fmt = fmt
        # jsonl: one encoded line and a newline; msgpack: values back to back
        encode: Any = _json_codec or _json_encode  # the codec itself: FileSink calls it directly
        sep = b"\n"
        if fmt == "msgpack":
            packer = _msgpack().Packer(use_bin_type=True)
            encode, sep = packer.pack, b""
        elif fmt != "jsonl":
            raise ValueError(f"file output format {fmt!r}: expected jsonl or msgpack")
        self._lock = threading.Lock()
        self._outs: dict[tuple[str, int], FileOutput] = {}
        self._dirty: set[FileOutput] = set()
        self._paths: dict[FileOutput, Path] = {}  # for messages
        self._closed = False
        what = "JSON" if fmt == "jsonl" else "msgpack"
        # the compiled send path; the collector finds it under this name
        self._tailrace_sink = FileSink(self, encode, sep, buffer_bytes, what)

    def partitions(self, stream: str) -> int:
        return self._partitions(stream)

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        self._tailrace_sink.send(stream, partition, key, message)

    def _output(self, stream: str, partition: int) -> FileOutput:
        """The open file of ``stream``'s ``partition``, opened on first use (FileSink's slow path)."""
        with self._lock:
            out = self._outs.get((stream, partition))
            if out is None:
                if self._closed:
                    raise ValueError(f"file output {stream}[{partition}]: producer is closed")
                out = self._open(stream, partition)
            return out

    def _write_full(self, out: FileOutput) -> None:
        """Write ``out``'s buffer (FileSink, once it holds ``buffer_bytes``)."""
        with self._lock:
            self._write(out)

    def _open(self, stream: str, partition: int) -> FileOutput:
        if partition < 0:
            raise ValueError(f"file output {stream}[{partition}]: no such partition")
        directory = self._root / stream
        created_dir = not directory.is_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = partition_file(directory, partition, self._fmt)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            with _appending(fd):  # no other process is inside a write of this file meanwhile
                size = os.fstat(fd).st_size
                if size:
                    keep = _complete_prefix(fd, size) if self._fmt == "jsonl" else _complete_values(fd, size)
                    if keep != size:
                        log.warning(
                            "%s: cut off a partial last record (%d bytes) left by an earlier hard stop",
                            path,
                            size - keep,
                        )
                        os.ftruncate(fd, keep)
                        os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        if created_dir:
            _fsync_dir(directory.parent)
        _fsync_dir(directory)
        out = self._outs[(stream, partition)] = FileOutput(fd)
        self._paths[out] = path
        self._tailrace_sink.add(stream, partition, out)
        return out

    def _write(self, out: FileOutput) -> None:
        """Write ``out``'s buffer; the caller holds the lock (so buffers reach the file in order).

        Several processes may append to one file (``tailrace run --containers N``, or two
        jobs writing one stream): a buffer holds whole records and is written under an
        exclusive ``flock`` of the file, so a short write's rest follows it directly and no
        other process's record lands inside one. A writer killed inside its write (the
        kernel drops its lock) leaves a partial record at the end: the next writer cuts it
        (JSON Lines: the file ends without a newline) before appending."""
        taken = out.take()
        if taken is None:
            return
        data, size = taken
        view = memoryview(data)
        try:
            with _appending(out.fd):
                if self._fmt == "jsonl":
                    _cut_partial_line(out.fd, self._paths.get(out))
                done = 0
                while done < size:
                    done += os.write(out.fd, view[done:size])
        finally:
            view.release()  # (the slices are gone): the buffer can grow again
            out.give_back(data)
        self._dirty.add(out)

    def flush(self) -> None:
        sync = self.flush_begin()
        if sync is not None:
            sync()

    def flush_begin(self) -> Callable[[], None] | None:
        """Write every buffer now; return the fsync of the files written since the last
        flush (the commit writer's thread calls it before the checkpoint). The files stay
        open until ``close``, which comes after the commit writer stopped."""
        with self._lock:
            for out in self._outs.values():
                if out.used:
                    self._write(out)
            if not self._dirty:
                return None
            fds = [out.fd for out in self._dirty]
            self._dirty.clear()

        def sync() -> None:
            for fd in fds:
                os.fsync(fd)

        return sync

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
        self.flush()
        with self._lock:
            self._closed = True
            self._tailrace_sink.clear()
            for out in self._outs.values():
                os.close(out.fd)
            self._outs.clear()
            self._paths.clear()


class _appending:
    """Context manager: an exclusive ``flock`` of an output file while appending to it or
    repairing its end (see ``FileProducer._write``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)  # held for one write: others wait at most that long

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def _cut_partial_line(fd: int, path: Path | None) -> None:
    """Under ``_appending``: cut a partial last line (its writer died inside its write)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    keep = _complete_prefix(fd, size)
    log.warning(
        "%s: cut off a partial last line (%d bytes) left by a writer stopped inside its write",
        path if path is not None else f"output file descriptor {fd}",
        size - keep,
    )
    os.ftruncate(fd, keep)


def _complete_prefix(fd: int, size: int) -> int:
    """Length of the file up to and including its last newline."""
    pos = size
    while pos > 0:
        start = max(0, pos - _CHUNK)
        chunk = os.pread(fd, pos - start, start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def _complete_values(fd: int, size: int) -> int:
    """Length of a msgpack file up to the end of its last complete value (reads it all)."""
    u = _msgpack().Unpacker(raw=False, strict_map_key=False)
    mp = _msgpack()
    pos = end = 0
    while pos < size:
        chunk = os.pread(fd, _CHUNK, pos)
        if not chunk:
            break
        pos += len(chunk)
        u.feed(chunk)
        try:
            while True:
                u.skip()
                end = u.tell()
        except mp.OutOfData:
            pass
    return end


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
