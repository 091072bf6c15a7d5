"""File system: partitioned streams as directories of line files.

Layout (input and output alike)::

    <path>/<stream>/partition-0.jsonl     JSON Lines: one JSON value per line
    <path>/<stream>/partition-1.jsonl
    <path>/<stream>/partition-0.txt       plain text: one message (a str) per line

A stream is every ``partition-N.jsonl`` (or every ``partition-N.txt``) file in
its directory, N = 0, 1, ... without gaps; one stream uses one format. The
**offset** of a message is the byte offset of the start of its line, so a
restart after committed offset X seeks to X, skips that one line and reads on:
nothing before it is read again.

A file replaced under a checkpoint is refused, even with lines of the same
shape: after a checkpoint (at most once a second per partition) the reader
records a **fingerprint** of the committed line (the SHA-256 of the up to 4 KiB
of the file that end with that line) in
``<path>/.tailrace-fingerprints/<stream>/partition-N.jsonl``, and a restart
verifies it before seeking (see :func:`verify_fingerprint`).

Inputs are bounded: a partition ends at the end of its file. Each reader reads
ahead on its own thread into a bounded buffer (``read_ahead`` messages) and
calls the engine's ``wakeup`` when data or the end arrives (rule 6).

Outputs are written as JSON Lines to ``<output_path>/<stream>/partition-N.jsonl``
(``output_path`` defaults to ``path``), one line per message (the message
only; the key places it in a partition). ``flush`` (called before every
checkpoint) writes and fsyncs them. A partial last line left by a hard kill is
cut off when the file is reopened (it was never covered by a checkpoint).

Bad input is never silent: a missing directory or file, a partition gap, a line
that is not valid JSON (or UTF-8) raises InputError naming the file and line;
with ``skip_bad_lines=True`` bad lines are skipped, logged and counted instead
(``PartitionReader.skipped()``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ._core import Envelope
from .errors import ConfigError, InputError
from .interfaces import PartitionReader, Producer, System
from .types import Offset, SystemStreamPartition

log = logging.getLogger("tailrace.files")

FORMATS = {".jsonl": "jsonl", ".txt": "text"}
_PARTITION_FILE = re.compile(r"^partition-(0|[1-9][0-9]*)(\.jsonl|\.txt)$")
_CHUNK = 1 << 16  # bytes read from a file at a time
_LOGGED_SKIPS = 10  # bad lines logged individually per partition before going quiet


def partition_file(directory: Path, partition: int, fmt: str = "jsonl") -> Path:
    """The file of one partition: ``<directory>/partition-<N>.jsonl`` (or ``.txt``)."""
    return directory / f"partition-{partition}.{'jsonl' if fmt == 'jsonl' else 'txt'}"


def scan_stream(directory: Path) -> tuple[int, str]:
    """(partition count, format) of a stream directory; InputError on anything unexpected."""
    if not directory.is_dir():
        raise InputError("stream directory does not exist", source=str(directory))
    found: dict[int, str] = {}
    formats: set[str] = set()
    for entry in sorted(os.listdir(directory)):
        if entry.startswith("."):
            continue
        m = _PARTITION_FILE.match(entry)
        if m is None:
            raise InputError(
                f"unexpected file {entry!r} (a stream directory holds only partition-N.jsonl "
                "or partition-N.txt files)",
                source=str(directory),
            )
        n = int(m.group(1))
        if n in found:
            raise InputError(f"partition {n} has two files (.jsonl and .txt)", source=str(directory))
        found[n] = FORMATS[m.group(2)]
        formats.add(found[n])
    if not found:
        raise InputError(
            "stream directory has no partition files (partition-0.jsonl ...)", source=str(directory)
        )
    if len(formats) > 1:
        raise InputError("stream mixes .jsonl and .txt partition files", source=str(directory))
    missing = [n for n in range(max(found) + 1) if n not in found]
    if missing:
        fmt = formats.pop()
        names = ", ".join(partition_file(directory, n, fmt).name for n in missing[:5])
        raise InputError(
            f"partition gap: {names} missing (partitions are numbered 0..{max(found)} without gaps)",
            source=str(directory),
        )
    return len(found), formats.pop()


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


def _line_fingerprint(f: BinaryIO, offset: int) -> tuple[int, str] | None:
    """(end of the line starting at ``offset``, SHA-256 of the window ending there), or
    None when no whole line starts there."""
    f.seek(offset)
    line = f.readline()
    if not line.endswith(b"\n"):
        return None
    end = offset + len(line)
    start = max(0, end - FINGERPRINT_BYTES)
    f.seek(start)
    return end, hashlib.sha256(f.read(end - start)).hexdigest()


def record_fingerprint(path: Path, offset: int) -> None:
    """Record the fingerprint of the line of ``path`` starting at ``offset`` (OSError on failure)."""
    with open(path, "rb") as f:
        got = _line_fingerprint(f, offset)
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
    got = _line_fingerprint(f, offset) if end <= os.fstat(f.fileno()).st_size else None
    if got != (end, digest):
        raise InputError(
            f"partition {ssp.partition} ({ssp}): the file was replaced or rewritten since the checkpoint "
            f"at offset {after}: its bytes before offset {end} (the line at byte offset {offset}, "
            f"fingerprinted at a commit in {fp_file}) are no longer the same. Restore the original "
            "file, or reset the checkpoints to read the new one from its start",
            source=str(path),
        )


class FileReader(PartitionReader):
    """Reads one partition file on a read-ahead thread into a bounded buffer."""

    def __init__(
        self,
        ssp: SystemStreamPartition,
        path: Path,
        fmt: str,
        *,
        read_ahead: int = 4096,
        skip_bad_lines: bool = False,
        key_field: str | None = None,
    ) -> None:
        super().__init__(ssp)
        self.path = path
        self.fmt = fmt
        self._capacity = max(1, read_ahead)
        self._skip_bad = skip_bad_lines
        self._key_field = key_field
        self._buf: deque[Envelope] = deque()
        self._cond = threading.Condition()
        self._done = False  # the thread reached the end of the file (or failed)
        self._error: InputError | None = None
        self._closed = False
        self._starved = False  # the last poll returned nothing: wake the engine on news
        self._wakeup: Callable[[], None] | None = None
        self._skipped = 0
        self._thread: threading.Thread | None = None
        self._file: BinaryIO | None = None
        self._first_line = 1  # line number of the first line read (None once unknown)
        self._start_pos = 0
        self._fingerprint_warned = False
        self._fingerprinted: int | None = None  # offset of the last fingerprint recorded
        self._fingerprinted_at = -FINGERPRINT_INTERVAL_S

    # -- engine side (loop thread) ---------------------------------------------
    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        if not self.path.is_file():
            raise InputError("partition file does not exist", source=str(self.path))
        f = open(self.path, "rb")
        try:
            pos = 0
            if after is not None:
                pos = self._seek_after(f, after)
                verify_fingerprint(self.path, f, self.ssp, after)
        except BaseException:
            f.close()
            raise
        self._file = f
        self._start_pos = pos
        self._first_line = 1 if after is None else 0  # 0: unknown, computed on error
        self._wakeup = wakeup
        self._thread = threading.Thread(target=self._run, name=f"tailrace-read-{self.ssp}", daemon=True)
        self._thread.start()

    def _seek_after(self, f: BinaryIO, after: Offset) -> int:
        """Position just past the line that starts at committed offset ``after``."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InputError(
                f"committed offset {after!r} is not a file offset (a byte offset >= 0)", source=str(self.path)
            )
        size = os.fstat(f.fileno()).st_size
        if after >= size:
            raise InputError(
                f"committed offset {after} is beyond the end of the file ({size} bytes): "
                "the file was truncated or replaced since the checkpoint",
                source=str(self.path),
            )
        if after > 0:
            f.seek(after - 1)
            if f.read(1) != b"\n":
                raise InputError(
                    f"committed offset {after} is not the start of a line: "
                    "the file was changed since the checkpoint",
                    source=str(self.path),
                )
        f.seek(after)
        f.readline()  # the committed message itself
        return f.tell()

    def poll(self, max_messages: int) -> list[Envelope]:
        with self._cond:
            n = min(max_messages, len(self._buf))
            if n == 0:
                if self._error is not None:
                    raise self._error
                self._starved = True
                return []
            buf = self._buf
            out = [buf.popleft() for _ in range(n)]
            self._starved = False
            self._cond.notify()  # room for the reader thread
            return out

    def at_end(self) -> bool:
        with self._cond:
            if not self._buf and self._error is not None:
                raise self._error
            return self._done and not self._buf

    def skipped(self) -> int:
        return self._skipped

    def committed(self, offset: Offset) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset == self._fingerprinted:
            return
        now = time.monotonic()
        if now - self._fingerprinted_at < FINGERPRINT_INTERVAL_S:
            return  # an older fingerprint is still true; about 0.5 ms each, so at most one a second
        self._fingerprinted, self._fingerprinted_at = offset, now
        try:
            record_fingerprint(self.path, offset)
        except OSError as e:
            if not self._fingerprint_warned:
                self._fingerprint_warned = True
                log.warning("%s: cannot record its fingerprint (%s): replacement not detected", self.path, e)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._wakeup = None
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- reader thread ---------------------------------------------------------
    def _run(self) -> None:
        f = self._file
        assert f is not None
        s = self.ssp
        pos = self._start_pos
        line_no = self._first_line  # 0 when unknown (resumed mid-file)
        pending = b""
        batch: list[Envelope] = []
        try:
            f.seek(pos)
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    lines = [pending] if pending else []
                    pending = b""
                else:
                    data = pending + chunk
                    cut = data.rfind(b"\n") + 1
                    lines = data[:cut].splitlines(keepends=True)
                    pending = data[cut:]
                for raw in lines:
                    start = pos
                    pos += len(raw)
                    try:
                        message = self._decode(raw)
                    except ValueError as e:
                        self._bad_line(start, line_no, e)
                    else:
                        key = None
                        if self._key_field is not None and isinstance(message, dict):
                            key = message.get(self._key_field)
                        batch.append(Envelope(s.system, s.stream, s.partition, start, key, message))
                    if line_no:
                        line_no += 1
                    if len(batch) >= 256 and not self._push(batch):
                        return
                if batch and not self._push(batch):
                    return
                if not chunk:
                    break
            self._finish(None)
        except InputError as e:
            if batch:
                self._push(batch)
            self._finish(e)
        except OSError as e:
            self._finish(InputError(f"read failed: {e}", source=str(self.path)))

    def _decode(self, raw: bytes) -> Any:
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        if self.fmt == "text":
            return line.decode("utf-8")
        return json.loads(line)

    def _bad_line(self, start: int, line_no: int, exc: ValueError) -> None:
        if not line_no:
            line_no = self._line_number(start)
        what = "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else f"not valid JSON ({exc})"
        if not self._skip_bad:
            raise InputError(
                f"line is {what}; set skip_bad_lines = true on the system to skip and count bad lines",
                source=str(self.path),
                line=line_no,
            )
        self._skipped += 1
        if self._skipped <= _LOGGED_SKIPS:
            log.warning("%s:%d: skipped a line that is %s (byte offset %d)", self.path, line_no, what, start)
            if self._skipped == _LOGGED_SKIPS:
                log.warning("%s: further skipped lines are counted, not logged", self.path)

    def _line_number(self, offset: int) -> int:
        """1-based line number of the line starting at ``offset`` (error path only)."""
        count = 0
        with open(self.path, "rb") as f:
            remaining = offset
            while remaining > 0:
                chunk = f.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                remaining -= len(chunk)
        return count + 1

    def _push(self, batch: list[Envelope]) -> bool:
        """Move ``batch`` into the buffer, waiting for room (backpressure). False once closed."""
        i = 0
        while i < len(batch):
            with self._cond:
                while len(self._buf) >= self._capacity and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return False
                room = self._capacity - len(self._buf)
                self._buf.extend(batch[i : i + room])
                i += room
                wake = self._wakeup if self._starved else None
                self._starved = False
            if wake is not None:
                wake()  # outside the lock: the engine may poll right away
        batch.clear()
        return True

    def _finish(self, error: InputError | None) -> None:
        with self._cond:
            self._done = True
            self._error = error
            wake = self._wakeup
            self._starved = False
        if wake is not None:
            wake()


class FileProducer(Producer):
    """Appends JSON Lines to ``<root>/<stream>/partition-N.jsonl``; ``flush`` writes and fsyncs."""

    def __init__(self, root: Path, partitions: Callable[[str], int], buffer_bytes: int = 1 << 16) -> None:
        self._root = root
        self._partitions = partitions
        self._limit = buffer_bytes
        self._lock = threading.Lock()
        self._fds: dict[tuple[str, int], int] = {}
        self._pending: dict[int, list[bytes]] = {}
        self._pending_bytes: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._closed = False

    def partitions(self, stream: str) -> int:
        return self._partitions(stream)

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        try:
            line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"file output {stream}[{partition}]: message is not JSON-serialisable: {e}"
            ) from None
        with self._lock:
            if self._closed:
                raise ValueError(f"file output {stream}[{partition}]: producer is closed")
            fd = self._fds.get((stream, partition))
            if fd is None:
                fd = self._open(stream, partition)
            pend = self._pending[fd]
            pend.append(line)
            self._pending_bytes[fd] += len(line)
            if self._pending_bytes[fd] >= self._limit:
                self._write(fd)

    def _open(self, stream: str, partition: int) -> int:
        directory = self._root / stream
        created_dir = not directory.is_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = partition_file(directory, partition)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(fd).st_size
        if size:
            keep = _complete_prefix(fd, size)
            if keep != size:
                log.warning(
                    "%s: cut off a partial last line (%d bytes) left by an earlier hard stop",
                    path,
                    size - keep,
                )
                os.ftruncate(fd, keep)
                os.fsync(fd)
        if created_dir:
            _fsync_dir(directory.parent)
        _fsync_dir(directory)
        self._fds[(stream, partition)] = fd
        self._pending[fd] = []
        self._pending_bytes[fd] = 0
        return fd

    def _write(self, fd: int) -> None:
        data = b"".join(self._pending[fd])
        self._pending[fd].clear()
        self._pending_bytes[fd] = 0
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        self._dirty.add(fd)

    def flush(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                if self._pending[fd]:
                    self._write(fd)
            for fd in self._dirty:
                os.fsync(fd)
            self._dirty.clear()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
        self.flush()
        with self._lock:
            self._closed = True
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileSystem(System):
    """Streams as directories of ``partition-N.jsonl`` / ``partition-N.txt`` files (see module doc).

    ``path``: directory of input streams; ``output_path``: directory of output
    streams (default ``path``); ``output_partitions``: partitions of a new output
    stream (default 1), or a mapping ``{stream: n}`` with an optional ``"*"``
    default; ``skip_bad_lines``: skip and count bad lines instead of failing;
    ``key_field``: JSON field used as the envelope key (JSON objects only);
    ``read_ahead``: messages buffered per partition by the read-ahead thread.
    """

    def __init__(
        self,
        name: str,
        path: str | os.PathLike[str],
        *,
        output_path: str | os.PathLike[str] | None = None,
        output_partitions: int | Mapping[str, int] = 1,
        skip_bad_lines: bool = False,
        key_field: str | None = None,
        read_ahead: int = 4096,
    ) -> None:
        super().__init__(name)
        where = f"systems.{name}"
        if not isinstance(skip_bad_lines, bool):
            raise ConfigError(
                f"expected true or false, got {skip_bad_lines!r}", key=f"{where}.skip_bad_lines"
            )
        if key_field is not None and not isinstance(key_field, str):
            raise ConfigError(f"expected a field name, got {key_field!r}", key=f"{where}.key_field")
        if isinstance(read_ahead, bool) or not isinstance(read_ahead, int) or read_ahead < 1:
            raise ConfigError(
                f"expected an integer >= 1, got {read_ahead!r}", key=f"{where}.read_ahead", allowed=">= 1"
            )
        counts = output_partitions if isinstance(output_partitions, Mapping) else {"*": output_partitions}
        for stream, n in counts.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ConfigError(
                    f"stream {stream!r}: expected an integer >= 1, got {n!r}",
                    key=f"{where}.output_partitions",
                    allowed="an integer >= 1, or a table {stream = n}",
                )
        self.path = Path(path)
        self.output_path = Path(output_path) if output_path is not None else self.path
        self._output_counts = dict(counts)
        self.skip_bad_lines = skip_bad_lines
        self.key_field = key_field
        self.read_ahead = read_ahead
        self._streams: dict[str, tuple[int, str]] = {}
        self._checked_outputs: set[str] = set()

    def _scan(self, stream: str) -> tuple[int, str]:
        info = self._streams.get(stream)
        if info is None:
            if not self.path.is_dir():
                raise InputError(
                    f"input directory of system {self.name!r} does not exist", source=str(self.path)
                )
            info = self._streams[stream] = scan_stream(self.path / stream)
        return info

    def partitions(self, stream: str) -> int:
        return self._scan(stream)[0]

    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        n, fmt = self._scan(ssp.stream)
        if not 0 <= ssp.partition < n:
            raise InputError(
                f"stream has no partition {ssp.partition} (it has {n})", source=str(self.path / ssp.stream)
            )
        return FileReader(
            ssp,
            partition_file(self.path / ssp.stream, ssp.partition, fmt),
            fmt,
            read_ahead=self.read_ahead,
            skip_bad_lines=self.skip_bad_lines,
            key_field=self.key_field,
        )

    def output_partitions(self, stream: str) -> int:
        """Partition count of output stream ``stream``; ConfigError if the files already there disagree."""
        n = self._output_counts.get(stream, self._output_counts.get("*", 1))
        if stream not in self._checked_outputs:
            # Files are created on first send, so fewer files than partitions is normal;
            # a file beyond the configured count means an earlier run used more partitions.
            directory = self.output_path / stream
            found = (
                [m for e in os.listdir(directory) if (m := _PARTITION_FILE.match(e))]
                if directory.is_dir()
                else []
            )
            top = max((int(m.group(1)) for m in found), default=-1)
            if top >= n:
                raise ConfigError(
                    f"output stream {stream!r} already has partition {top} in {directory}, "
                    f"but {n} partitions are configured (move the old output away, or configure {top + 1})",
                    key=f"systems.{self.name}.output_partitions",
                )
            self._checked_outputs.add(stream)
        return n

    def producer(self) -> Producer:
        return FileProducer(self.output_path, self.output_partitions)


def write_stream(
    directory: str | os.PathLike[str], partitions: list[list[Any]], fmt: str = "jsonl"
) -> list[list[int]]:
    """Write an input stream (one list of messages per partition); returns each message's offset.

    A helper for tests and examples: ``fmt`` "jsonl" (JSON values) or "text" (str lines).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    offsets: list[list[int]] = []
    for p, messages in enumerate(partitions):
        pos = 0
        offs: list[int] = []
        with open(partition_file(d, p, fmt), "wb") as f:
            for m in messages:
                line = (m if fmt == "text" else json.dumps(m, separators=(",", ":"))).encode() + b"\n"
                offs.append(pos)
                f.write(line)
                pos += len(line)
        offsets.append(offs)
    return offsets


def read_stream(directory: str | os.PathLike[str]) -> list[list[Any]]:
    """Every message of an output (or input) JSON Lines stream, per partition (for tests and tools)."""
    d = Path(directory)
    n, fmt = scan_stream(d)
    out: list[list[Any]] = []
    for p in range(n):
        with open(partition_file(d, p, fmt), "rb") as f:
            lines = f.read().splitlines()
        out.append([line.decode() if fmt == "text" else json.loads(line) for line in lines])
    return out
