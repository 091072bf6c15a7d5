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
from ..errors import CheckpointError, ConfigError
from ..interfaces import CheckpointStore, CommitOutputs, HeldProducer, Producer, Write
from ..serdes import _json_codec, _json_encode  # the raw functions: errors stay the codec's own
from .streams import _CHUNK, _msgpack, partition_file, publish_committed

HELD_BYTES = 4 << 20
"""Bytes of records a task's exactly-once file outputs hold before its commit falls due
early (rule 41; docs/outputs.md)."""

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
        self._repaired = False  # exactly-once: the job's files cut to their committed lengths
        self._encode, self._sep = encode, sep
        self._what = what = "JSON" if fmt == "jsonl" else "msgpack"
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

    def hold(self, task_name: str, store: CheckpointStore) -> HeldProducer:
        """Task ``task_name``'s exactly-once file outputs (rule 41, ``_HeldFileProducer``). The
        first call cuts every file of this output directory that ``store`` has a committed
        length of back to it: the records of a commit that never happened go before
        anything runs."""
        try:
            store.output_marks(())
        except NotImplementedError:
            raise ConfigError(
                f"exactly-once file outputs need a checkpoint store that records their committed "
                f"lengths in the checkpoint's atomic write; {type(store).__name__} does not",
                key="task.output.guarantee",
                allowed="at-least-once with this store, or exactly-once with a sqlite (or memory) store",
            ) from None
        with self._lock:
            if not self._repaired:
                self._repair(store)
                self._repaired = True
        return _HeldFileProducer(self, task_name, store)

    def _repair(self, store: CheckpointStore) -> None:
        root = f"{os.path.realpath(self._root)}{os.sep}"
        for name, mark in sorted(store.output_marks().items()):
            if not name.startswith(root):
                continue
            path = Path(name)
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                raise CheckpointError(
                    f"exactly-once output {path} is missing, but {mark} bytes of it are committed: "
                    "it was moved or deleted outside the job"
                ) from None
            try:
                with _appending(fd):
                    # read again under the lock: another container of the job may have
                    # committed to the file since (its length only grows)
                    mark = store.output_marks([name]).get(name, mark)
                    _cut_to(fd, path, mark)
                    publish_committed(path, mark)
            finally:
                os.close(fd)

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


class _HeldFileProducer(HeldProducer):
    """One task's file outputs under exactly-once (rule 41).

    ``send`` encodes into buffers of the task's own (one per partition file, compiled, as
    ``FileProducer``'s) that are never written before the task's commit. The commit's
    publication (``_publish``, on the commit writer's thread) takes each file's exclusive
    ``flock`` (in path order: no two processes wait on each other), cuts the file to its
    committed length (the tail of a commit a crash cut short), appends and fsyncs the
    task's records, then runs the checkpoint's atomic write with each file's new length,
    publishes the lengths (``.partition-N.jsonl.committed``, for chained readers) and
    unlocks. So a file only ever grows by whole commits, containers of one job append to one
    file in turn, and whatever a crash leaves past a committed length is cut by the next
    writer (or at the next start) before anything is appended or read."""

    def __init__(self, parent: FileProducer, task_name: str, store: CheckpointStore) -> None:
        self._parent = parent
        self._task = task_name
        self._store = store
        self._paths: dict[FileOutput, Path] = {}
        self._asked = False  # on_full called since the last take
        # the compiled send path (the collector finds it under this name); a buffer reaching
        # HELD_BYTES calls _write_full, which asks for the early commit instead of writing
        self._tailrace_sink = FileSink(self, parent._encode, parent._sep, HELD_BYTES, parent._what, 1 << 16)

    def partitions(self, stream: str) -> int:
        return self._parent.partitions(stream)

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        self._tailrace_sink.send(stream, partition, key, message)

    def _output(self, stream: str, partition: int) -> FileOutput:
        """The task's buffer of ``stream``'s ``partition`` (FileSink's slow path): the file is
        the container's (opened once), the buffer the task's."""
        shared = self._parent._output(stream, partition)
        with self._parent._lock:
            for out in self._paths:
                if out.fd == shared.fd:
                    return out
            out = FileOutput(shared.fd)
            self._paths[out] = self._parent._paths[shared]
            self._tailrace_sink.add(stream, partition, out)
            return out

    def _write_full(self, out: FileOutput) -> None:
        if not self._asked and self.on_full is not None:
            self._asked = True
            self.on_full()

    def pending(self) -> bool:
        return any(out.used for out in list(self._paths))

    def take(self) -> Callable[[Write, CommitOutputs], None] | None:
        batch = []
        for out, path in sorted(list(self._paths.items()), key=lambda item: str(item[1])):
            taken = out.take()
            if taken is not None:
                batch.append((out, path, taken[0], taken[1]))
        self._asked = False
        if not batch:
            return None

        def publish(write: Write, outputs: CommitOutputs) -> None:
            _publish(self._store, self._task, batch, write, outputs)

        return publish

    def close(self) -> None:
        """Nothing to write: what is still held belongs to no commit (rule 41)."""


def _publish(
    store: CheckpointStore,
    task_name: str,
    batch: list[tuple[FileOutput, Path, bytearray, int]],
    write: Write,
    outputs: CommitOutputs,
) -> None:
    """A commit's file outputs made durable and visible with its write (see ``_HeldFileProducer``)."""
    locked: list[int] = []
    try:
        for out, _path, _data, _size in batch:
            fcntl.flock(out.fd, fcntl.LOCK_EX)
            locked.append(out.fd)
        names = [os.path.realpath(path) for _out, path, _data, _size in batch]
        marks = store.output_marks(names)
        fresh = CommitOutputs()
        for (out, path, _data, _size), name in zip(batch, names):
            if name not in marks:
                # never committed: what the file holds now is the job's starting length,
                # recorded before a byte is appended (a crash after the append cuts back to it)
                size = os.fstat(out.fd).st_size
                keep = (
                    _complete_prefix(out.fd, size)
                    if path.suffix == ".jsonl"
                    else _complete_values(out.fd, size)
                )
                fresh.marks[name] = marks[name] = keep
        if fresh:
            store.write(task_name, {}, None, outputs=fresh)
            for name, keep in fresh.marks.items():  # a chained reader stops there from now on
                publish_committed(Path(name), keep)
        for (out, path, data, size), name in zip(batch, names):
            mark = marks[name]
            _cut_to(out.fd, path, mark)
            view = memoryview(data)
            try:
                done = 0
                while done < size:
                    done += os.write(out.fd, view[done:size])
            finally:
                view.release()
            os.fsync(out.fd)
            outputs.marks[name] = mark + size
        write(outputs)
        for (_out, path, _data, _size), name in zip(batch, names):
            publish_committed(path, outputs.marks[name])
    finally:
        for fd in locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        for out, _path, data, _size in batch:
            out.give_back(data)


def _cut_to(fd: int, path: Path, mark: int) -> None:
    """Under the file's ``flock``: cut ``path`` back to its committed length ``mark``."""
    size = os.fstat(fd).st_size
    if size < mark:
        raise CheckpointError(
            f"exactly-once output {path} holds {size} bytes, fewer than the {mark} committed: "
            "it was truncated or replaced outside the job"
        )
    if size > mark:
        log.warning(
            "%s: cut %d bytes past its committed length %d (outputs of a commit a hard stop cut short)",
            path,
            size - mark,
            mark,
        )
        os.ftruncate(fd, mark)
        os.fsync(fd)


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
