"""File system: partitioned streams as directories of line files.

Layout (input and output alike)::

    <path>/<stream>/partition-0.jsonl     JSON Lines: one JSON value per line
    <path>/<stream>/partition-1.jsonl
    <path>/<stream>/partition-0.txt       plain text: one message (a str) per line
    <path>/<stream>/partition-0.msgpack   msgpack values back to back (tailrace[fast])

A stream is every ``partition-N.jsonl`` (or ``.txt``, or ``.msgpack``) file in
its directory, N = 0, 1, ... without gaps; one stream uses one format. The
**offset** of a message is the byte offset of the start of its line, so a
restart after committed offset X seeks to X, skips that one line and reads on:
nothing before it is read again (msgpack: the byte offset where the value starts;
see MsgpackReader).

A file replaced under a checkpoint is refused, even with lines of the same
shape: after a checkpoint (at most once a second per partition) the reader
records a **fingerprint** of the committed line (the SHA-256 of the up to 4 KiB
of the file that end with that line) in
``<path>/.tailrace-fingerprints/<stream>/partition-N.jsonl``, and a restart
verifies it before seeking (see :func:`verify_fingerprint`).

Inputs are bounded: a partition ends at the end of its file, which also ends a last
line without a newline; such a line's fingerprint is recorded as soon as it is
committed, ending where it ended, so that bytes appended to it later (a different
line at that offset) are refused at restart, not skipped. A reader has no
thread: the engine's ``poll`` (on its loop thread) reads the next chunk, splits it
into lines and decodes at most ``read_ahead`` messages, so an input never holds
more than one chunk of bytes, and a slow task simply polls less (rule 6).

Outputs are written as JSON Lines to ``<output_path>/<stream>/partition-N.jsonl``
(``output_path`` defaults to ``path``), one line per message (the message
only; the key places it in a partition), encoded by ``tailrace.serdes`` (byte for
byte the standard library's output; a plain record is encoded straight into the
partition's buffer). ``flush`` (called
before every checkpoint) writes and fsyncs them. ``output_format = "msgpack"`` writes
``partition-N.msgpack`` files instead. A partial last line (or value) left by a hard kill
is cut off when the file is reopened (it was never covered by a checkpoint). Several
processes may append to one output file (``tailrace run --containers N``): every write
and every repair happens under an exclusive ``flock`` of the file, and a JSON Lines writer
first cuts a partial last line left by a writer killed inside its write.

Bad input is never silent: a missing directory or file, a partition gap, a line
that is not valid JSON (or UTF-8) raises InputError naming the file and line;
with ``skip_bad_lines=True`` bad lines are skipped, logged and counted instead
(``PartitionReader.skipped()``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .._core import Envelope, FileOutput, FileSink, file_decode_lines
from .._digest import sha256
from ..config import options_checked
from ..errors import ConfigError, InputError
from ..interfaces import PartitionReader, Producer, System
from ..serdes import _json_codec, _json_decode, _json_encode  # the raw functions: errors stay the codec's own
from ..types import Offset, SystemStreamPartition

log = logging.getLogger("tailrace.files")

FORMATS = {".jsonl": "jsonl", ".txt": "text", ".msgpack": "msgpack"}
_EXTENSIONS = {fmt: ext for ext, fmt in FORMATS.items()}
_PARTITION_FILE = re.compile(r"^partition-(0|[1-9][0-9]*)(\.jsonl|\.txt|\.msgpack)$")
_CHUNK = 1 << 16  # bytes read from a file at a time
_LOGGED_SKIPS = 10  # bad lines logged individually per partition before going quiet
# Most messages one poll decodes, by default. Small on purpose: a poll's messages are
# processed right after it, so a few dozen are still in the CPU's caches when the task
# reads them (thousands were not: the end-to-end job took ~15% more CPU with 4096).
READ_AHEAD = 64


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8")


def partition_file(directory: Path, partition: int, fmt: str = "jsonl") -> Path:
    """The file of one partition: ``<directory>/partition-<N>.jsonl`` (or ``.txt``, ``.msgpack``)."""
    return directory / f"partition-{partition}{_EXTENSIONS[fmt]}"


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
                f"unexpected file {entry!r} (a stream directory holds only partition-N.jsonl, "
                "partition-N.txt or partition-N.msgpack files)",
                source=str(directory),
            )
        n = int(m.group(1))
        if n in found:
            raise InputError(
                f"partition {n} has two files ({_EXTENSIONS[found[n]]} and {m.group(2)})",
                source=str(directory),
            )
        found[n] = FORMATS[m.group(2)]
        formats.add(found[n])
    if not found:
        raise InputError(
            "stream directory has no partition files (partition-0.jsonl ...)", source=str(directory)
        )
    if len(formats) > 1:
        raise InputError(
            f"stream mixes {' and '.join(sorted(_EXTENSIONS[f] for f in formats))} partition files",
            source=str(directory),
        )
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


class FileReader(PartitionReader):
    """Reads one partition file on the engine's loop thread, lazily, one chunk at a time.

    No thread of its own: ``poll`` reads the next chunk (``os.read``, which drops the
    GIL while the kernel copies), splits it into lines, tracks each line's byte offset
    and decodes at most ``max_messages`` (and at most ``read_ahead``) of them. So the
    reader holds one chunk of undecoded bytes and never more than one poll's messages:
    backpressure is the engine simply not polling (rule 6). A file input never waits
    for data (inputs are bounded), so ``wakeup`` is never needed.
    """

    def __init__(
        self,
        ssp: SystemStreamPartition,
        path: Path,
        fmt: str,
        *,
        read_ahead: int = READ_AHEAD,
        skip_bad_lines: bool = False,
        key_field: str | None = None,
    ) -> None:
        super().__init__(ssp)
        self.path = path
        self.fmt = fmt
        self._capacity = max(1, read_ahead)
        self._skip_bad = skip_bad_lines
        self._deferred: InputError | None = None  # a bad line found after good ones: raised by the next poll
        self._key_field = key_field
        # the compiled JSON codec itself when there is one: file_decode_lines calls it directly
        self._decode_line: Any = _decode_text if fmt == "text" else _json_codec or _json_decode
        self._skipped = 0
        self._fd = -1
        # the current chunk: _data[:_end] is whole lines (each ends with a newline),
        # _data[_at:_end] the ones not yet decoded; _data[0] is at file offset _data_off
        self._data = b""
        self._at = 0
        self._end = 0
        self._data_off = 0
        self._tail = b""  # bytes after the chunk's last newline (start of the next line)
        self._eof = False
        self._line_no = 1  # line number of the line at _data[_at]; 0 when unknown (resumed mid-file)
        self._fingerprint_warned = False
        self._fingerprinted: int | None = None  # offset of the last fingerprint recorded
        self._fingerprinted_at = -FINGERPRINT_INTERVAL_S
        # (offset, end) of the file's last line when it was read without a newline: its
        # fingerprint is recorded at once when it is committed, ending where it ended then
        self._open_line: tuple[int, int] | None = None

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
            fd = os.dup(f.fileno())
        finally:
            f.close()
        self._fd = fd
        self._data_off = pos
        self._line_no = 1 if after is None else 0  # 0: unknown, computed on error

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

    def _fill(self) -> bool:
        """Read the next chunk into ``_data``; False at the end of the file."""
        pos = self._data_off + self._end  # file offset of the first byte after the current chunk
        self._data, self._at, self._end, self._data_off = b"", 0, 0, pos
        while not self._eof:
            try:
                chunk = os.pread(self._fd, _CHUNK, pos + len(self._tail))
            except OSError as e:
                raise InputError(f"read failed: {e}", source=str(self.path)) from None
            if not chunk:
                self._eof = True
                if self._tail:  # a last line without a newline
                    self._open_line = (pos, pos + len(self._tail))
                    self._data = self._tail + b"\n"
                    self._end = len(self._data)
                    self._tail = b""
                    return True
                return False
            data = self._tail + chunk if self._tail else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                self._tail = data  # a line longer than a chunk: read on
                continue
            self._data, self._end = data, cut + 1
            self._tail = data[cut + 1 :]
            return True
        return False

    def poll(self, max_messages: int) -> list[Envelope]:
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            raise deferred
        if self._fd < 0:
            return []
        out: list[Envelope] = []
        want = min(max_messages, self._capacity)
        s = self.ssp
        while len(out) < want:
            if self._at >= self._end and not self._fill():
                break
            # compiled (tailrace._core): find, decode and wrap each line of the chunk
            at, lines, error, start = file_decode_lines(
                self._data,
                self._at,
                self._end,
                self._data_off,
                want - len(out),
                self._decode_line,
                s.system,
                s.stream,
                s.partition,
                self._key_field,
                out,
            )
            self._at = at
            if self._line_no:
                self._line_no += lines
            if error is not None:
                try:
                    self._bad_line(start, self._line_no - 1 if self._line_no else 0, error)
                except InputError as e:
                    if not out:
                        raise
                    self._deferred = e  # the lines before it are processed (and committed) first
                    break
        return out

    def at_end(self) -> bool:
        """True once every line was polled; reads ahead one chunk to know (never a guess)."""
        if self._deferred is not None:
            return False  # the next poll raises it
        if self._fd < 0:
            return True
        if self._at < self._end:
            return False
        return not self._fill()

    def skipped(self) -> int:
        return self._skipped

    def committed(self, offset: Offset) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset == self._fingerprinted:
            return
        now = time.monotonic()
        # a last line read without a newline: recorded at once, ending where it ended then,
        # so that a restart can tell that line from one extended since
        line = self._open_line
        open_end = line[1] if line is not None and offset == line[0] else None
        if now - self._fingerprinted_at < FINGERPRINT_INTERVAL_S and open_end is None:
            return  # an older fingerprint is still true; about 0.5 ms each, so at most one a second
        self._fingerprinted, self._fingerprinted_at = offset, now
        try:
            record_fingerprint(self.path, offset, open_end)
        except OSError as e:
            if not self._fingerprint_warned:
                self._fingerprint_warned = True
                log.warning("%s: cannot record its fingerprint (%s): replacement not detected", self.path, e)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._data, self._at, self._end = b"", 0, 0
        self._tail = b""

    def _bad_line(self, start: int, line_no: int, exc: ValueError | RecursionError) -> None:
        if not line_no:
            line_no = self._line_number(start)
        what = "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else f"not valid JSON ({exc})"
        if not self._skip_bad:
            raise InputError(
                f"line is {what}; partition {self.ssp}, offset {start}; set skip_bad_lines = true on "
                "the system to skip and count bad lines",
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


class MsgpackReader(FileReader):
    """Reads a ``partition-N.msgpack`` file: msgpack values back to back, no separators.

    The offset of a message is the byte offset where its value starts. A restart after
    offset X decodes the value at X (to skip it) and reads on; without separators a
    changed file is caught only when that value or a later one does not decode. Bad data
    always stops the partition with InputError naming the file and byte offset
    (``skip_bad_lines`` cannot apply: a decoder cannot find the next value after garbage).
    """

    def __init__(self, ssp: SystemStreamPartition, path: Path, **kw: Any) -> None:
        super().__init__(ssp, path, "msgpack", **kw)
        self._unpacker: Any = None
        self._base = 0  # file offset of the unpacker's first byte
        self._read_pos = 0  # file offset of the next byte to feed
        self._ahead: tuple[int, Any] | None = None  # one value decoded by at_end

    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        mp = _msgpack()
        if not self.path.is_file():
            raise InputError("partition file does not exist", source=str(self.path))
        fd = os.open(self.path, os.O_RDONLY)
        self._fd = fd
        self._unpacker = mp.Unpacker(raw=False, strict_map_key=False)
        if after is None:
            return
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            self.close()
            raise InputError(
                f"committed offset {after!r} is not a file offset (a byte offset >= 0)", source=str(self.path)
            )
        size = os.fstat(fd).st_size
        if after >= size:
            self.close()
            raise InputError(
                f"committed offset {after} is beyond the end of the file ({size} bytes): "
                "the file was truncated or replaced since the checkpoint",
                source=str(self.path),
            )
        self._base = self._read_pos = after
        try:
            if self._next_value() is None:
                raise InputError(f"no value at committed offset {after}", source=str(self.path))
        except InputError:
            self.close()
            raise

    def _next_value(self) -> tuple[int, Any] | None:
        """(offset, value) of the next value, reading as needed; None at the end."""
        if self._ahead is not None:
            got, self._ahead = self._ahead, None
            return got
        if self._fd < 0:
            return None
        mp = _msgpack()
        u = self._unpacker
        start = self._base + u.tell()  # before unpack: a value cut by the chunk end moves tell()
        while True:
            try:
                return start, u.unpack()
            except mp.OutOfData:
                pass
            except Exception as e:  # noqa: BLE001 - FormatError, StackError, UnicodeDecodeError...: the data
                raise InputError(
                    f"bad msgpack data at byte offset {start} (partition {self.ssp}, offset {start}): {e!r}",
                    source=str(self.path),
                ) from None
            try:
                chunk = os.pread(self._fd, _CHUNK, self._read_pos)
            except OSError as e:
                raise InputError(f"read failed: {e}", source=str(self.path)) from None
            if not chunk:
                if self._read_pos > start:
                    raise InputError(
                        f"truncated msgpack value at byte offset {start} (partition {self.ssp}, offset "
                        f"{start}; the file ends inside it)",
                        source=str(self.path),
                    )
                return None
            u.feed(chunk)
            self._read_pos += len(chunk)

    def poll(self, max_messages: int) -> list[Envelope]:
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            raise deferred
        out: list[Envelope] = []
        s = self.ssp
        key_field = self._key_field
        for _ in range(min(max_messages, self._capacity)):
            try:
                got = self._next_value()
            except InputError as e:
                if not out:
                    raise
                self._deferred = e  # the values before it are processed (and committed) first
                break
            if got is None:
                break
            offset, message = got
            key = message.get(key_field) if key_field is not None and type(message) is dict else None
            out.append(Envelope(s.system, s.stream, s.partition, offset, key, message))
        return out

    def at_end(self) -> bool:
        if self._deferred is not None:
            return False  # the next poll raises it
        if self._ahead is None:
            self._ahead = self._next_value()
        return self._ahead is None


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:
        raise InputError("msgpack files need msgpack: pip install 'tailrace[fast]'") from None
    return msgpack


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


class FileSystem(System):
    """Streams as directories of ``partition-N.jsonl`` / ``partition-N.txt`` files (see module doc).

    ``path``: directory of input streams; ``output_path``: directory of output
    streams (default ``path``); ``output_partitions``: partitions of a new output
    stream (default 1), or a mapping ``{stream: n}`` with an optional ``"*"``
    default; ``skip_bad_lines``: skip and count bad lines instead of failing;
    ``key_field``: JSON field used as the envelope key (JSON objects only);
    ``read_ahead``: most messages one poll of a partition decodes;
    ``output_format``: ``"jsonl"`` (default) or ``"msgpack"`` (``partition-N.msgpack``
    files of msgpack values back to back; needs ``tailrace[fast]``). Inputs are read in
    the format their files' extension names.

    Thread-safety: readers start no thread; the engine polls them on its loop thread.
    The producer's ``send`` is safe from any thread (a task on the thread pool, a thread
    completing a callback): see :class:`FileProducer`; the engine calls its ``flush``
    on the loop thread, before every checkpoint.
    """

    @options_checked
    def __init__(
        self,
        name: str,
        path: str | os.PathLike[str],
        *,
        output_path: str | os.PathLike[str] | None = None,
        output_partitions: int | Mapping[str, int] = 1,
        skip_bad_lines: bool = False,
        key_field: str | None = None,
        read_ahead: int = READ_AHEAD,
        output_format: str = "jsonl",
    ) -> None:
        super().__init__(name)
        where = f"systems.{name}"
        for option, value in (("path", path), ("output_path", output_path)):
            if value is None and option == "output_path":
                continue  # (the default: path)
            if not isinstance(value, (str, os.PathLike)):
                raise ConfigError(
                    f"expected a directory path (a string), got {type(value).__name__} {value!r}",
                    key=f"{where}.{option}",
                )
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
        if output_format not in ("jsonl", "msgpack"):
            raise ConfigError(
                f"unknown output format {output_format!r}",
                key=f"{where}.output_format",
                allowed="jsonl, msgpack",
            )
        if output_format == "msgpack":
            try:
                _msgpack()
            except InputError as e:
                raise ConfigError(str(e), key=f"{where}.output_format") from None
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
        self.output_format = output_format
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
        path = partition_file(self.path / ssp.stream, ssp.partition, fmt)
        if fmt == "msgpack":
            return MsgpackReader(ssp, path, read_ahead=self.read_ahead, key_field=self.key_field)
        return FileReader(
            ssp,
            path,
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
        return FileProducer(self.output_path, self.output_partitions, fmt=self.output_format)


def write_stream(
    directory: str | os.PathLike[str], partitions: list[list[Any]], fmt: str = "jsonl"
) -> list[list[int]]:
    """Write an input stream (one list of messages per partition); returns each message's offset.

    A helper for tests and examples: ``fmt`` "jsonl" (JSON values), "text" (str lines) or
    "msgpack" (msgpack values).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    offsets: list[list[int]] = []
    for p, messages in enumerate(partitions):
        pos = 0
        offs: list[int] = []
        with open(partition_file(d, p, fmt), "wb") as f:
            for m in messages:
                if fmt == "msgpack":
                    line = _msgpack().packb(m, use_bin_type=True)
                else:
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
            if fmt == "msgpack":
                out.append(list(_msgpack().Unpacker(f, raw=False, strict_map_key=False)))
                continue
            lines = f.read().splitlines()
        out.append([line.decode() if fmt == "text" else json.loads(line) for line in lines])
    return out
