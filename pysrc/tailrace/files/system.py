"""The file system: :class:`FileSystem`, streams as directories of partition files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..config import options_checked
from ..errors import ConfigError, InputError
from ..interfaces import PartitionReader, Producer, System
from ..types import SystemStreamPartition
from .producer import FileProducer
from .reader import READ_AHEAD, FileReader, MsgpackReader
from .streams import _PARTITION_FILE, _msgpack, partition_file, scan_stream


class FileSystem(System):
    """Streams as directories of ``partition-N.jsonl`` / ``partition-N.txt`` files (see ``tailrace.files``).

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
