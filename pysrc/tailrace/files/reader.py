"""Reading one partition file on the engine's loop thread: JSON Lines and text
(:class:`FileReader`), msgpack values (:class:`MsgpackReader`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from .._core import Envelope, file_decode_lines
from ..errors import InputError
from ..interfaces import PartitionReader
from ..serdes import _json_codec, _json_decode  # the raw functions: errors stay the codec's own
from ..types import BadInput, Offset, SystemStreamPartition
from .fingerprints import FINGERPRINT_INTERVAL_S, record_fingerprint, verify_fingerprint
from .streams import _CHUNK, _msgpack, committed_length

log = logging.getLogger("tailrace.files")

_LOGGED_SKIPS = 10  # bad lines logged individually per partition before going quiet
# Most messages one poll decodes, by default. Small on purpose: a poll's messages are
# processed right after it, so a few dozen are still in the CPU's caches when the task
# reads them (thousands were not: the end-to-end job took ~15% more CPU with 4096).
READ_AHEAD = 64


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8")


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
        self._key_checked = key_field is None  # the first message's fields were checked
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
        self._limit: int | None = None  # the committed length of an exactly-once output

    def _room(self, pos: int) -> int:
        """Bytes to read at ``pos`` (at most a chunk): none past an exactly-once output's
        committed length, which is read again once ``pos`` reaches it."""
        limit = self._limit
        if limit is None:
            return _CHUNK
        if pos >= limit:
            fresh = committed_length(self.path)
            if fresh is not None and fresh > limit:
                self._limit = limit = fresh
        return max(0, min(_CHUNK, limit - pos))

    # -- engine side (loop thread) ---------------------------------------------
    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        if not self.path.is_file():
            raise InputError("partition file does not exist", source=str(self.path))
        self._limit = committed_length(self.path)
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
            at = pos + len(self._tail)
            try:
                room = self._room(at)
                chunk = os.pread(self._fd, room, at) if room else b""
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
            if self._line_no:
                self._line_no += lines
            if error is not None:
                line_no = self._line_no - 1 if self._line_no else 0
                if self._skip_bad:
                    self._skip_line(start, line_no, error)
                else:
                    # the bad line takes its place in the partition: the policy decides at
                    # dispatch, after everything before it (rules 39, 40)
                    raw = self._data[start - self._data_off : at - 1].removesuffix(b"\r")
                    out.append(
                        Envelope(
                            s.system,
                            s.stream,
                            s.partition,
                            start,
                            None,
                            BadInput(self._bad_line_error(start, line_no, error), raw),
                        )
                    )
            self._at = at
        if not self._key_checked and out:
            self._check_key_field(out)
        return out

    def _check_key_field(self, out: list[Envelope]) -> None:
        """``key_field`` names a field of the first message (rule 39, issue 36 item 5): a
        field no message has would make every key None in silence."""
        for env in out:
            message = env.message
            if type(message) is BadInput:
                continue
            self._key_checked = True
            field = self._key_field
            if isinstance(message, dict) and field in message:
                return
            has = (
                f"its fields: {', '.join(map(str, message)) or '(none)'}"
                if isinstance(message, dict)
                else f"it is a {type(message).__name__}, not an object"
            )
            raise InputError(
                f"key_field {field!r} is not a field of the first message (partition {self.ssp}, "
                f"offset {env.offset}); {has}",
                source=str(self.path),
            )

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

    def raw(self, offset: Offset) -> bytes | None:
        """The line at byte ``offset`` (without its newline), read back from the file."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            return None
        with open(self.path, "rb") as f:
            f.seek(offset)
            line = f.readline()
        return line.removesuffix(b"\n").removesuffix(b"\r")

    @staticmethod
    def _what(exc: BaseException) -> str:
        return "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else f"not valid JSON ({exc})"

    def _bad_line_error(self, start: int, line_no: int, exc: ValueError | RecursionError) -> InputError:
        if not line_no:
            line_no = self._line_number(start)
        error = InputError(
            f"line is {self._what(exc)}; partition {self.ssp}, offset {start}; set task.error.policy "
            "to skip or dead-letter (or skip_bad_lines = true on the system) to go on past bad lines",
            source=str(self.path),
            line=line_no,
        )
        error.__cause__ = exc
        return error

    def _skip_line(self, start: int, line_no: int, exc: ValueError | RecursionError) -> None:
        """skip_bad_lines = true: the line is dropped at the read, logged and counted."""
        if not line_no:
            line_no = self._line_number(start)
        what = self._what(exc)
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
        self._limit = committed_length(self.path)
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
                room = self._room(self._read_pos)
                chunk = os.pread(self._fd, room, self._read_pos) if room else b""
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
