"""Command-line tools for Redis jobs (``tailrace checkpoints show|reset``, ``tailrace load``).

Kept apart from the store and the system: these read and write the same keys
(:class:`~tailrace.redis._io.Keys`) but are not on any job's run path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InputError
from ..types import Offset, SystemStreamPartition
from ._io import Keys, connect, connection_errors, redact, text


def committed_offsets(
    url: str, cluster: bool, prefix: str, job: str, ssps: Sequence[SystemStreamPartition]
) -> dict[SystemStreamPartition, Offset]:
    """The committed entry id of each of ``ssps`` for ``job`` (partitions never committed are absent)."""
    keys = Keys(prefix)
    client = connect(url, cluster=cluster)
    try:
        names = [keys.checkpoint(s.stream, s.partition, job) for s in ssps]
        values = [client.get(k) for k in names] if cluster else (list(client.mget(names)) if names else [])
    except connection_errors() as e:
        raise CheckpointError(f"Redis at {redact(url)} is unreachable: {e}") from e
    finally:
        client.close()
    return {s: text(v) for s, v in zip(ssps, values) if v is not None}


def state_counts(
    url: str, cluster: bool, prefix: str, job: str, ssps: Sequence[SystemStreamPartition]
) -> dict[str, dict[str, int]]:
    """Entries per task and store of ``job``'s state kept in the slots of ``ssps`` (what a
    reset deletes with the checkpoints: see ``reset_checkpoints``)."""
    keys = Keys(prefix)
    client = connect(url, cluster=cluster)
    out: dict[str, dict[str, int]] = {}
    try:
        for s in ssps:
            head = f"{keys.state(s.stream, s.partition, job, '', '')[0][: -len('::k')]}"
            for pattern in keys.job_data(s.stream, s.partition, job)[:1]:
                for k in client.scan_iter(match=pattern, count=1000):
                    name = text(k)
                    if not (keys.is_job_data(k, s.stream, s.partition, job) and name.endswith(":k")):
                        continue
                    task, store, _ = name[len(head) :].split(":")
                    out.setdefault(task, {})[store] = int(client.zcard(k))
    except connection_errors() as e:
        raise CheckpointError(f"Redis at {redact(url)} is unreachable: {e}") from e
    finally:
        client.close()
    return {t: dict(sorted(stores.items())) for t, stores in sorted(out.items())}


def reset_checkpoints(
    url: str, cluster: bool, prefix: str, job: str, ssps: Sequence[SystemStreamPartition]
) -> int:
    """Delete ``job``'s checkpoints of ``ssps`` with everything committed with them: the
    end-of-partition marks and the state of the job's tasks (rule 26: state and offsets
    go together, so a rerun from the beginning starts from empty stores). Only the keys
    of ``job`` itself are deleted, not those of a job whose name starts with ``job + ":"``
    (``Keys.is_job_data``). Refused (CheckpointError) while a container holds a lease on
    one of them. Returns how many checkpoints were deleted."""
    keys = Keys(prefix)
    client = connect(url, cluster=cluster)
    try:
        held = [s for s in ssps if client.exists(keys.lease(s.stream, s.partition, job))]
        if held:
            raise CheckpointError(
                f"job {job!r} is running (a container holds the lease of {', '.join(map(str, held[:4]))}); "
                "stop it first"
            )
        deleted = 0
        for s in ssps:
            deleted += int(client.delete(keys.checkpoint(s.stream, s.partition, job)))
            client.delete(keys.done(s.stream, s.partition, job))
            for pattern in keys.job_data(s.stream, s.partition, job):
                found = [
                    k
                    for k in client.scan_iter(match=pattern, count=1000)
                    if keys.is_job_data(k, s.stream, s.partition, job)
                ]
                for i in range(0, len(found), 500):  # one slot (the partition's tag): one DEL
                    client.delete(*found[i : i + 500])
        client.delete(keys.anchors(job))
        return deleted
    except connection_errors() as e:
        raise CheckpointError(f"Redis at {redact(url)} is unreachable: {e}") from e
    finally:
        client.close()


def read_messages(path: Path, fmt: str, *, key_field: str | None = None) -> Iterator[Any]:
    """Messages of a JSON Lines (``jsonl``) or text (``text``) file; InputError names file and
    line. With ``key_field``, each message must be a JSON object whose ``key_field`` is set
    (not null): a message without its key is refused, never sent round robin."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if fmt == "text":
                try:
                    yield line.decode("utf-8")
                except UnicodeDecodeError:
                    raise InputError("line is not valid UTF-8", source=str(path), line=n) from None
                continue
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as e:
                raise InputError(f"line is not valid JSON ({e})", source=str(path), line=n) from None
            if key_field is not None and (not isinstance(message, dict) or message.get(key_field) is None):
                raise InputError(_no_key(message, key_field), source=str(path), line=n)
            yield message


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false"}
_JSON_KINDS[type(None)] = "null"


def _no_key(message: Any, key_field: str) -> str:
    if not isinstance(message, dict):
        kind = _JSON_KINDS.get(type(message), type(message).__name__)
        return f"the message is {kind}, not a JSON object with the --key-field {key_field!r}"
    if key_field in message:
        return f"the message's --key-field {key_field!r} is null (every message needs a key)"
    fields = ", ".join(repr(k) for k in list(message)[:10]) + (", ..." if len(message) > 10 else "")
    return f"the message has no field {key_field!r} (--key-field); its fields: {fields or 'none'}"


def ended_partitions(system: Any, stream: str) -> list[int]:
    """The partitions of ``system``'s ``stream`` (a :class:`RedisSystem`) whose last entry
    is an end marker: a reader stops there, so nothing appended after it would be read."""
    from .system import EOS_FIELD

    n = system.partitions(stream)
    pipe = system.client.pipeline(transaction=False)
    for p in range(n):
        pipe.xrevrange(system.keys.stream(stream, p), count=1)
    last = pipe.execute()
    return [p for p, entries in enumerate(last) if entries and EOS_FIELD in entries[0][1]]


def append_pipelined(
    system: Any, stream: str, messages: Iterable[Any], *, key_field: str | None = None, batch: int = 1000
) -> dict[int, int]:
    """Append ``messages`` to ``system``'s ``stream`` (a :class:`RedisSystem`), ``batch``
    XADDs per round trip (a pipeline). A message goes to the partition of its key
    (``key_field`` of a JSON object), else round-robin. Returns messages per partition. A bad
    message (InputError from ``messages``) stops it: every message before it is appended, none
    from it on, and the error says how many were."""
    from .system import _encoder  # the system's codec, so readers decode what was written

    n = system.partitions(stream)
    enc = _encoder(system.codec)
    counts = dict.fromkeys(range(n), 0)
    pipe = system.client.pipeline(transaction=False)
    pending = 0
    rr = 0
    try:
        for message in messages:
            key = message.get(key_field) if key_field and isinstance(message, dict) else None
            if key is None:
                p, rr = rr % n, rr + 1
            else:
                p = _partition_of(key, n)
            fields: dict[str, Any] = {"m": enc(message)}
            if key is not None:
                fields["k"] = enc(key)
            pipe.xadd(system.keys.stream(stream, p), fields)
            counts[p] += 1
            pending += 1
            if pending >= batch:
                pipe.execute()
                pending = 0
    except InputError as e:
        # a bad message: every message before it is appended, none from it on (where to resume)
        if pending:
            pipe.execute()
        done = sum(counts.values())
        where = f"line {e.line}" if e.line is not None else "it"
        if done == 0:
            appended = "nothing was appended"
        else:
            them = "the message" if done == 1 else f"the {done:,} messages"
            was = "was" if done == 1 else "were"
            appended = f"{them} before {where} {was} appended to stream {stream!r}, none from it on"
        error = InputError(f"{e}; {appended}")
        error.source, error.line = e.source, e.line
        raise error from None
    if pending:
        pipe.execute()
    return counts


def append_entries(
    system: Any,
    stream: str,
    entries: Iterable[tuple[int, bytes | str, bytes | str | None]],
    *,
    batch: int = 1000,
) -> dict[int, int]:
    """Append entries already encoded, ``(partition, message, key or None)``, to their
    partitions of ``system``'s ``stream`` (a :class:`RedisSystem`), ``batch`` XADDs per round
    trip, in order (``tailrace replay``: a dead letter's message goes back to its partition).
    Returns entries per partition."""
    counts: dict[int, int] = {}
    pipe = system.client.pipeline(transaction=False)
    pending = 0
    for p, message, key in entries:
        fields: dict[str, Any] = {"m": message}
        if key is not None:
            fields["k"] = key
        pipe.xadd(system.keys.stream(stream, p), fields)
        counts[p] = counts.get(p, 0) + 1
        pending += 1
        if pending >= batch:
            pipe.execute()
            pending = 0
    if pending:
        pipe.execute()
    return counts


def _partition_of(key: Any, n: int) -> int:
    from ..collector import key_partition  # the partition collector.send(key=...) picks

    return int(key_partition(key, n))


__all__ = [
    "append_entries",
    "append_pipelined",
    "committed_offsets",
    "ended_partitions",
    "read_messages",
    "reset_checkpoints",
]
