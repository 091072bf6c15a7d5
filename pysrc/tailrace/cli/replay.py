"""``tailrace replay``: append the original messages of dead letters (``task.error.policy =
dead-letter``, docs/bad-messages.md) to the partitions they came from, or to another stream
of the job.

Every letter is read and checked, and its target found, before anything is appended: a
letter that cannot be replayed (no coordinates, a system the job lacks, a partition its
stream does not have) stops the command naming its file and line, with nothing appended.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError, SetupError
from ..jobfile import JobSpec
from ..types import parse_system_stream
from .job import _load
from .text import _count

_NO_VALUE = object()


@dataclass
class Letter:
    """One dead letter: where it was read (``file:line``), where its message came from, and
    the message: its original bytes (``raw``) or, where the input kept none, its ``value``."""

    where: tuple[str, int]  # (file, line or record number)
    system: str
    stream: str
    partition: int
    offset: Any
    key: Any
    raw: bytes | None
    value: Any = _NO_VALUE

    def error(self, message: str) -> InputError:
        return InputError(
            f"dead letter of {self.system}.{self.stream}[{self.partition}]: {message}",
            source=self.where[0],
            line=self.where[1],
        )


@dataclass
class Target:
    """A partitioned stream of the job that letters are appended to."""

    system: Any
    kind: str  # "file", "redis", "kafka"
    stream: str
    partitions: int
    fmt: str = ""  # file streams: jsonl, text or msgpack
    directory: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.system.name}.{self.stream}"


def cmd_replay(args: argparse.Namespace) -> int:
    """Append dead letters' messages to their partitions; print a count per partition."""
    spec = _load(args)
    path = Path(args.dead_letters)
    fixed = _target(spec, args.stream, "--stream") if args.stream else None
    letters = list(read_letters(path))
    targets: dict[tuple[str, str], Target] = {}
    seen: set[tuple[str, str, int, str]] = set()
    plan: dict[tuple[str, str], dict[int, list[Letter]]] = {}
    duplicates = 0
    for letter in letters:
        if fixed is not None:
            target = fixed
            partition = letter.partition % target.partitions
        else:
            target = _origin_target(spec, letter, targets)
            partition = letter.partition
            if partition >= target.partitions:
                raise letter.error(
                    f"stream {target.name} has {_count(target.partitions, 'partition')}, no partition "
                    f"{partition}; replay it to another stream with --stream SYSTEM.STREAM"
                )
        _check_encodable(letter, target)
        if letter.offset is not None:  # (checked first, like every letter)
            # the same input message dead-lettered twice (at-least-once, after a crash): once
            same = (letter.system, letter.stream, letter.partition, json.dumps(letter.offset))
            if same in seen:
                duplicates += 1
                continue
            seen.add(same)
        plan.setdefault((target.system.name, target.stream), {}).setdefault(partition, []).append(letter)
        targets.setdefault((target.system.name, target.stream), target)
    if fixed is not None:
        targets[(fixed.system.name, fixed.stream)] = fixed
    if not args.dry_run:
        for ident, per_partition in plan.items():
            _append(targets[ident], per_partition)
    total = sum(len(ls) for pp in plan.values() for ls in pp.values())
    verb = "would append" if args.dry_run else "appended"
    skipped = (
        f", {_count(duplicates, 'duplicate')} skipped (a message dead-lettered twice)" if duplicates else ""
    )
    print(
        f"{verb} {_count(total, 'message')} of {_count(len(letters), 'dead letter')} in {path}{skipped}"
        + (":" if total else "")
    )
    for (system, stream), per_partition in sorted(plan.items()):
        for p, ls in sorted(per_partition.items()):
            print(f"  {system}.{stream}[{p}]: {len(ls):,}")
    if args.dry_run:
        print("dry run: nothing was appended")
    for target in targets.values():
        if target.kind == "redis":
            target.system.close()
    return 0


# -- reading the dead letters ------------------------------------------------------------------
def read_letters(path: Path) -> Iterator[Letter]:
    """The dead letters of ``path``: a JSON Lines (or msgpack) file, or a file stream
    directory (its partition files in order), each checked."""
    from ..files.streams import FORMATS, partition_file, scan_stream

    if path.is_dir():
        n, fmt = scan_stream(path)
        if fmt == "text":
            raise InputError(
                "a stream of text lines holds no dead letters (they are JSON objects)", source=str(path)
            )
        files = [(partition_file(path, p, fmt), fmt) for p in range(n)]
    elif path.is_file():
        files = [(path, "msgpack" if FORMATS.get(path.suffix) == "msgpack" else "jsonl")]
    elif path.exists():
        raise SetupError(f"{path}: not a regular file or a directory")
    else:
        raise SetupError(f"{path}: no such file or directory")
    for file, fmt in files:
        for where, record in _records(file, fmt):
            yield _letter(where, record)


def _records(file: Path, fmt: str) -> Iterator[tuple[tuple[str, int], Any]]:
    if fmt == "msgpack":
        from ..files.streams import _msgpack

        with open(file, "rb") as f:
            unpacker = _msgpack().Unpacker(f, raw=False, strict_map_key=False)
            for i, record in enumerate(unpacker, 1):
                yield (str(file), i), record
        return
    with open(file, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            if n == len(lines):  # no newline after it: a writer stopped inside its write
                continue  # its message was not committed: the job dead-letters it again
            raise InputError(f"line is not valid JSON ({e})", source=str(file), line=n) from None
        yield (str(file), n), record


def _letter(where: tuple[str, int], record: Any) -> Letter:
    def refuse(message: str) -> InputError:
        return InputError(message, source=where[0], line=where[1])

    if not isinstance(record, dict):
        raise refuse(f"not a dead letter: a {type(record).__name__}, not an object")
    missing = [f for f in ("system", "stream", "partition") if record.get(f) is None]
    if missing:
        raise refuse(
            f"dead letter without {', '.join(repr(f) for f in missing)}: its coordinates (system, stream, "
            "partition) say where its message came from; nothing to replay it to"
        )
    system, stream, partition = record["system"], record["stream"], record["partition"]
    if not isinstance(system, str) or not isinstance(stream, str) or not system or not stream:
        raise refuse(f"dead letter with system {system!r} and stream {stream!r}: expected names")
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise refuse(f"dead letter with partition {partition!r}: expected an integer >= 0")
    raw: bytes | None = None
    value: Any = _NO_VALUE
    if isinstance(record.get("bytes"), str):
        try:
            raw = record["bytes"].encode("utf-8")
        except UnicodeEncodeError:
            raise refuse("dead letter whose 'bytes' is not text (a lone surrogate)") from None
    elif isinstance(record.get("bytes_base64"), str):
        try:
            raw = base64.b64decode(record["bytes_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise refuse("dead letter whose 'bytes_base64' is not base64") from None
    elif "value" in record:
        value = record["value"]
    else:
        raise refuse("dead letter without its message: none of 'bytes', 'bytes_base64', 'value'")
    return Letter(where, system, stream, partition, record.get("offset"), record.get("key"), raw, value)


# -- the targets -------------------------------------------------------------------------------
def _target(spec: JobSpec, name: str, option: str) -> Target:
    """The stream ``name`` (``system.stream``) of the job's systems, with its partition count."""
    try:
        ss = parse_system_stream(name)
    except ValueError as e:
        raise ConfigError(str(e), key=option) from None
    system = spec.systems.get(ss.system)
    if system is None:
        raise ConfigError(
            f"the job has no system {ss.system!r}",
            key=option,
            allowed=", ".join(spec.systems) or "none",
            source=str(spec.source),
        )
    return _stream_of(system, ss.stream, lambda m: ConfigError(m, key=option, source=str(spec.source)))


def _stream_of(system: Any, stream: str, refuse: Any) -> Target:
    from ..files import FileSystem
    from ..files.streams import scan_stream

    kind = type(system).__module__.split(".")[1] if type(system).__module__.startswith("tailrace.") else ""
    if isinstance(system, FileSystem):
        directory = system.path / stream
        try:
            n, fmt = scan_stream(directory)
        except InputError as e:
            raise refuse(f"stream {system.name}.{stream}: {e}") from None
        return Target(system, "file", stream, n, fmt, directory)
    if kind == "redis":
        from ..redis.tools import ended_partitions

        try:
            n = system.partitions(stream)
        except InputError as e:
            raise refuse(str(e)) from None
        ended = ended_partitions(system, stream)
        if ended:  # docs/redis.md: an end marker is final, a reader never reads past it
            raise refuse(
                f"stream {system.name}.{stream} has ended: "
                + ", ".join(f"{system.name}.{stream}[{p}]" for p in ended)
                + " end with an end marker, and a reader never reads past it"
            )
        return Target(system, "redis", stream, n)
    if kind == "kafka":
        try:
            n = system.topic_partitions(stream)
        except InputError as e:
            raise refuse(str(e)) from None
        return Target(system, "kafka", stream, n)
    raise refuse(
        f"system {system.name!r} ({type(system).__name__}) keeps no stream to append to: replay to a "
        "file, Redis or Kafka stream of the job (--stream SYSTEM.STREAM)"
    )


def _origin_target(spec: JobSpec, letter: Letter, targets: dict[tuple[str, str], Target]) -> Target:
    """The stream a letter's message came from: an input of the job."""
    found = targets.get((letter.system, letter.stream))
    if found is not None:
        return found
    name = f"{letter.system}.{letter.stream}"
    if letter.system not in spec.systems:
        raise letter.error(
            f"the job ({spec.source}) has no system {letter.system!r} (its systems: "
            f"{', '.join(spec.systems) or 'none'}); replay it to a stream of the job with "
            "--stream SYSTEM.STREAM"
        )
    if name not in spec.inputs:
        raise letter.error(
            f"{name} is not an input of the job ({spec.source}; its inputs: {', '.join(spec.inputs)}): "
            "these dead letters are another job's; replay them to a stream of this one with --stream"
        )
    target = _stream_of(spec.systems[letter.system], letter.stream, letter.error)
    targets[(letter.system, letter.stream)] = target
    return target


# -- appending ---------------------------------------------------------------------------------
def _file_record(letter: Letter, target: Target) -> bytes:
    """What is appended to a partition file for ``letter``: a newline-terminated line (JSON
    Lines, text) or a msgpack value."""
    if target.fmt == "msgpack":
        if letter.raw is not None:
            return letter.raw
        from ..files.streams import _msgpack

        return bytes(_msgpack().packb(letter.value, use_bin_type=True))
    if letter.raw is not None:
        line = letter.raw
    elif target.fmt == "text" and isinstance(letter.value, str):
        line = letter.value.encode("utf-8", "surrogatepass")
    else:
        line = json.dumps(letter.value, ensure_ascii=False, separators=(",", ":")).encode(
            "utf-8", "surrogatepass"
        )
    if b"\n" in line:
        raise letter.error(
            f"its message holds a newline: appended to {target.name}, a file of lines, it would be "
            "two messages"
        )
    return line + b"\n"


def _check_encodable(letter: Letter, target: Target) -> None:
    """Refuse, before anything is appended, a letter its target cannot take."""
    try:
        if target.kind == "file":
            _file_record(letter, target)
        elif target.kind == "redis":
            _redis_entry(letter, target, 0)
        elif target.kind == "kafka":
            _kafka_record(letter, target)
    except (TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise letter.error(f"its message cannot be written to {target.name}: {e}") from None


def _redis_entry(
    letter: Letter, target: Target, partition: int
) -> tuple[int, bytes | str, bytes | str | None]:
    from ..redis.system import _encoder

    enc = _encoder(target.system.codec)
    message = letter.raw if letter.raw is not None else enc(letter.value)
    return partition, message, None if letter.key is None else enc(letter.key)


def _kafka_record(letter: Letter, target: Target) -> tuple[bytes | None, bytes | None]:
    system = target.system
    value = (
        letter.raw
        if letter.raw is not None
        else (None if letter.value is None else system.value_serde.encode(letter.value))
    )
    return (None if letter.key is None else system.key_serde.encode(letter.key)), value


def _append(target: Target, per_partition: dict[int, list[Letter]]) -> None:
    if target.kind == "file":
        assert target.directory is not None
        from ..files.streams import partition_file

        for p, letters in per_partition.items():
            data = b"".join(_file_record(letter, target) for letter in letters)
            _append_to_file(partition_file(target.directory, p, target.fmt), data, target.fmt)
    elif target.kind == "redis":
        from ..redis.tools import append_entries

        append_entries(
            target.system,
            target.stream,
            (_redis_entry(letter, target, p) for p, letters in per_partition.items() for letter in letters),
        )
    else:
        producer = target.system.producer()
        try:
            for p, letters in per_partition.items():
                for letter in letters:
                    key, value = _kafka_record(letter, target)
                    producer.send_encoded(target.stream, p, key, value)
            producer.flush()
        finally:
            producer.close()


def _append_to_file(path: Path, data: bytes, fmt: str) -> None:
    """Append ``data`` to an input partition file, under the file outputs' lock, fsynced. A
    JSON Lines or text file whose last line has no newline gets one first (appended to that
    line, the bytes would make it another line: docs/running-jobs.md)."""
    from ..files.producer import _appending

    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    try:
        with _appending(fd):
            size = os.fstat(fd).st_size
            if fmt != "msgpack" and size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            view = memoryview(data)
            done = 0
            while done < len(data):
                done += os.write(fd, view[done:])
            os.fsync(fd)
    finally:
        os.close(fd)
