"""Stream directories: a stream is a directory of ``partition-N`` files of one format
(see :mod:`tailrace.files`); finding them, and writing or reading a whole stream (for
tests and tools)."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import InputError

FORMATS = {".jsonl": "jsonl", ".txt": "text", ".msgpack": "msgpack"}
_EXTENSIONS = {fmt: ext for ext, fmt in FORMATS.items()}
_PARTITION_FILE = re.compile(r"^partition-(0|[1-9][0-9]*)(\.jsonl|\.txt|\.msgpack)$")
_CHUNK = 1 << 16  # bytes read from a file at a time


def partition_file(directory: Path, partition: int, fmt: str = "jsonl") -> Path:
    """The file of one partition: ``<directory>/partition-<N>.jsonl`` (or ``.txt``, ``.msgpack``)."""
    return directory / f"partition-{partition}{_EXTENSIONS[fmt]}"


def committed_file(path: Path) -> Path:
    """The file where an exactly-once job publishes ``path``'s committed length (rule 41):
    ``.partition-N.jsonl.committed`` beside it (a dot file: no stream scan sees it)."""
    return path.with_name(f".{path.name}.committed")


def committed_length(path: Path) -> int | None:
    """The committed length an exactly-once job last published for output file ``path``
    (None: the file has none, so every byte of it counts). Only records below it are
    committed; the job writes it after each commit that grows the file, never ahead."""
    try:
        text = committed_file(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(f"bad committed length {text[:40]!r}", source=str(committed_file(path))) from None


def publish_committed(path: Path, length: int) -> None:
    """Publish ``length`` as ``path``'s committed length (a rename: a reader sees the old or
    the new value whole). Not fsynced: after a crash it may read an earlier length, never a
    later one, and the next start publishes it again."""
    final = committed_file(path)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    tmp.write_bytes(b"%d\n" % length)
    os.replace(tmp, final)


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


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:
        raise InputError("msgpack files need msgpack: pip install 'tailrace[fast]'") from None
    return msgpack


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
    """Every message of an output (or input) stream, per partition (for tests and tools); of an
    exactly-once output, the committed messages only (``committed_length``)."""
    d = Path(directory)
    n, fmt = scan_stream(d)
    out: list[list[Any]] = []
    for p in range(n):
        path = partition_file(d, p, fmt)
        limit = committed_length(path)
        with open(path, "rb") as f:
            data = f.read() if limit is None else f.read(limit)
        if fmt == "msgpack":
            out.append(list(_msgpack().Unpacker(io.BytesIO(data), raw=False, strict_map_key=False)))
            continue
        lines = data.splitlines()
        out.append([line.decode() if fmt == "text" else json.loads(line) for line in lines])
    return out
