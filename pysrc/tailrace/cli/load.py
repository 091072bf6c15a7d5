"""``tailrace load``: append a file's lines to a Redis input stream of a job."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import ConfigError, InputError, SetupError
from .job import _load
from .text import _count


def cmd_load(args: argparse.Namespace) -> int:
    """Append a file's lines to a Redis stream of the job, pipelined."""
    from ..redis import RedisSystem
    from ..redis.tools import append_pipelined, ended_partitions, read_messages
    from ..types import parse_system_stream

    spec = _load(args)
    target = args.stream or (spec.inputs[0] if len(spec.inputs) == 1 else None)
    if target is None:
        raise ConfigError(
            "the job has several inputs: name one with --stream",
            key="--stream",
            allowed=", ".join(spec.inputs),
        )
    try:
        ss = parse_system_stream(target)
    except ValueError as e:
        raise ConfigError(str(e), key="--stream") from None
    system = spec.systems.get(ss.system)
    if not isinstance(system, RedisSystem):
        raise ConfigError(
            f"{target!r} is not a stream of a Redis system of the job",
            key="--stream",
            allowed=", ".join(n for n, s in spec.systems.items() if isinstance(s, RedisSystem)) or "none",
            source=str(spec.source),
        )
    path = Path(args.file)
    if not path.is_file():
        if path.is_dir():
            raise SetupError(f"{path}: is a directory; load reads one file (JSON Lines or text)")
        if path.exists():
            raise SetupError(f"{path}: not a regular file; load reads one file (JSON Lines or text)")
        raise SetupError(f"{path}: no such file")
    fmt = args.format or ("text" if path.suffix == ".txt" else "jsonl")
    if args.key_field is not None and fmt == "text":
        raise ConfigError(
            f"a text file's messages are strings, with no field to take a key from ({path})",
            key="--key-field",
            allowed="--key-field with a JSON Lines file (--format jsonl)",
        )
    if args.partitions is not None:
        try:
            system.create_stream(ss.stream, args.partitions, exist_ok=True)
        except ValueError as e:  # the stream exists, or is declared, with another partition count
            raise ConfigError(str(e), key="--partitions") from None
    else:
        # the job file's count (checked against Redis), recorded: a job that later declares
        # another count is refused rather than reading only some of the partitions
        try:
            n = system.partitions(ss.stream)
        except InputError:  # neither Redis nor the job file knows the stream: nothing to append to
            raise ConfigError(
                f"Redis at {system.where} has no stream {ss.stream!r}: create it with this command's "
                f"--partitions N (N partitions), or give its partition count in the 'streams' table of "
                f"[systems.{ss.system}]",
                key="--partitions",
            ) from None
        system.create_stream(ss.stream, n, exist_ok=True)
    ended = ended_partitions(system, ss.stream)
    if ended:  # docs/redis.md: an end marker is final
        raise SetupError(
            f"stream {target} has ended: {', '.join(f'{target}[{p}]' for p in ended)} "
            f"end{'s' if len(ended) == 1 else ''} with an end marker (tailrace load --end, "
            "RedisSystem.end_stream), and a reader never reads past it; nothing was appended"
        )
    started = time.monotonic()
    messages = read_messages(path, fmt, key_field=args.key_field)
    counts = append_pipelined(system, ss.stream, messages, key_field=args.key_field, batch=args.batch)
    if args.end:
        system.end_stream(ss.stream)
    seconds = time.monotonic() - started
    total = sum(counts.values())
    rate = total / seconds if seconds > 0 else 0.0
    spread = ", ".join(f"[{p}] {n:,}" for p, n in sorted(counts.items()))
    print(
        f"appended {_count(total, 'message')} of {path} to {target} in {seconds:.2f} s ({rate:,.0f} msg/s):",
        spread,
    )
    system.close()
    return 0
