"""In-memory system: bounded streams (lists, end of stream when exhausted) and
live streams (appended from any thread while running, bounded, blocking when full).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._core import Envelope, make_envelopes
from ..config import options_checked
from ..errors import ConfigError, InputError
from ..interfaces import (
    CheckpointStore,
    CommitOutputs,
    HeldProducer,
    PartitionReader,
    Producer,
    System,
    Write,
)
from ..types import Offset, SystemStreamPartition

_TEXT = (str, bytes, bytearray)  # sequences, but never a partition or a list of partitions


def partition_lists(stream: str, partitions: Iterable[Sequence[Any]]) -> list[list[Any]]:
    """``partitions`` as lists, one of messages per partition. TypeError naming the stream
    for a str or bytes given as the partitions or as one partition (taken as a sequence, it
    would be its characters), or for something that is no sequence at all (a count)."""
    if isinstance(partitions, _TEXT) or not _iterable(partitions):
        raise TypeError(
            f"stream {stream!r}: expected a list of partitions, each a list of messages, got "
            f"{partitions!r} (a stream of one partition is [[m1, m2, ...]])"
        )
    return [_partition(stream, p, part, "messages") for p, part in enumerate(partitions)]


def _iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _partition(stream: str, p: int, part: Iterable[Any], what: str) -> list[Any]:
    if isinstance(part, _TEXT) or not _iterable(part):
        raise TypeError(
            f"stream {stream!r} partition {p}: expected a list of {what}, got {part!r} "
            "(a stream of one partition is [[m1, m2, ...]])"
        )
    return list(part)


class _LivePartition:
    """A bounded FIFO fed by any thread; offsets are 0, 1, 2, ... in append order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[tuple[Any, Any, int | None]] = deque()  # (key, message, timestamp)
        self.next_offset = 0  # offset of items[0]
        self.timestamped = False  # some item was appended with a timestamp
        self.ended = False
        self.cond = threading.Condition()
        self.wakeup: Callable[[], None] | None = None


class _BoundedReader(PartitionReader):
    def __init__(
        self, ssp: SystemStreamPartition, messages: Sequence[Any], keys: Sequence[Any] | None
    ) -> None:
        super().__init__(ssp)
        self._messages = messages
        self._keys = keys
        self._pos = 0

    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        if after is None:
            self._pos = 0
        elif not isinstance(after, int) or after < -1:
            raise InputError(f"committed offset {after!r} is not a memory offset", source=str(self.ssp))
        else:
            self._pos = min(after + 1, len(self._messages))

    def poll(self, max_messages: int) -> list[Any]:
        start = self._pos
        end = min(start + max_messages, len(self._messages))
        if end <= start:
            return []
        self._pos = end
        keys = None if self._keys is None else self._keys[start:end]
        s = self.ssp
        return make_envelopes(s.system, s.stream, s.partition, start, self._messages[start:end], keys)

    def at_end(self) -> bool:
        return self._pos >= len(self._messages)

    def _tailrace_poll_range(self, max_messages: int) -> tuple[Sequence[Any], Sequence[Any] | None, int, int]:
        """``poll`` without building a list: (messages, keys, start, end); the
        messages of offsets start..end-1 are ``messages[start:end]``. The native
        engine builds their envelopes straight into its input buffer."""
        start = self._pos
        end = min(start + max_messages, len(self._messages))
        self._pos = max(start, end)
        return self._messages, self._keys, start, end


class _LiveReader(PartitionReader):
    def __init__(self, ssp: SystemStreamPartition, part: _LivePartition) -> None:
        super().__init__(ssp)
        self._part = part
        self._after = -1  # the committed offset resumed after: offsets up to it are skipped (rule 13)

    def start(self, after: Offset | None, wakeup: Callable[[], None]) -> None:
        p = self._part
        with p.cond:
            if after is not None:
                if isinstance(after, bool) or not isinstance(after, int):
                    raise InputError(
                        f"committed offset {after!r} is not a memory offset", source=str(self.ssp)
                    )
                self._after = after
                self._skip_committed()
            p.wakeup = wakeup

    def _skip_committed(self) -> None:
        """Drop the messages at offsets up to the committed one, whether they were appended
        before the run started or after it (a log given again after a restart); cond held."""
        p = self._part
        if p.next_offset > self._after:
            return
        while p.items and p.next_offset <= self._after:
            p.items.popleft()
            p.next_offset += 1
        p.cond.notify_all()  # room for blocked appenders

    def poll(self, max_messages: int) -> list[Any]:
        p = self._part
        with p.cond:
            self._skip_committed()
            n = min(max_messages, len(p.items))
            if n == 0:
                return []
            first = p.next_offset
            batch = [p.items.popleft() for _ in range(n)]
            p.next_offset += n
            p.cond.notify_all()  # room for blocked appenders
        s = self.ssp
        if p.timestamped:  # appended with the system's own time (rule 32): a test driver's
            return [
                Envelope(s.system, s.stream, s.partition, first + i, item[0], item[1], timestamp=item[2])
                for i, item in enumerate(batch)
            ]
        return make_envelopes(
            s.system, s.stream, s.partition, first, [item[1] for item in batch], [item[0] for item in batch]
        )

    def at_end(self) -> bool:
        p = self._part
        with p.cond:
            self._skip_committed()
            return p.ended and not p.items

    def close(self) -> None:
        with self._part.cond:
            self._part.wakeup = None


class _MemoryProducer(Producer):
    def __init__(self, system: MemorySystem) -> None:
        self._system = system

    def partitions(self, stream: str) -> int:
        return self._system.output_partitions(stream)

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        self._system._output(stream, partition).append((key, message))

    def hold(self, task_name: str, store: CheckpointStore) -> HeldProducer:
        return _HeldMemoryProducer(self._system)


HELD_RECORDS = 100_000
"""Records a task's held memory outputs reach before its commit falls due early (rule 41)."""


class _HeldMemoryProducer(HeldProducer):
    """A task's memory outputs under exactly-once (rule 41): held in a list, appended to the
    system's outputs right after the commit's write (one process: a crash loses both)."""

    def __init__(self, system: MemorySystem) -> None:
        self._system = system
        self._held: list[tuple[str, int, Any, Any]] = []

    def partitions(self, stream: str) -> int:
        return self._system.output_partitions(stream)

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        held = self._held
        held.append((stream, partition, key, message))
        if len(held) == HELD_RECORDS and self.on_full is not None:
            self.on_full()

    def pending(self) -> bool:
        return bool(self._held)

    def take(self) -> Callable[[Write, CommitOutputs], None] | None:
        held = self._held
        if not held:
            return None
        self._held = []
        system = self._system

        def publish(write: Write, outputs: CommitOutputs) -> None:
            write(outputs)
            for stream, partition, key, message in held:
                system._output(stream, partition).append((key, message))

        return publish


def _check_partition_count(n: object, key: str) -> None:
    """ConfigError naming ``key`` unless ``n`` is an integer >= 1 (a partition count)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"expected an integer >= 1, got {n!r}", key=key, allowed="an integer >= 1")


class MemorySystem(System):
    """In-memory streams for tests and examples.

    ``add_stream(name, partitions)`` defines a bounded input stream from lists (one list
    of messages per partition: ``[["a", "b"]]`` is one partition of two messages);
    ``add_live_stream(name, n)`` a live one fed by ``append`` from any thread
    (blocks while ``capacity`` messages wait); ``end(name, partition)`` marks the
    end of a live partition. Output streams are created on first send and read
    back with ``messages(stream, partition)``; ``output_partitions`` is the
    partition count of an output stream (default 1) unless ``set_output_partitions``
    gave it one.

    Thread-safety: ``append`` and ``end`` are safe from any thread, also while a
    container runs; the producer's ``send`` is safe from any thread. Define streams
    (``add_stream``, ``add_live_stream``) before the container starts.
    """

    @options_checked
    def __init__(self, name: str = "mem", *, output_partitions: int = 1) -> None:
        _check_partition_count(output_partitions, "output_partitions")
        super().__init__(name)
        self._bounded: dict[str, tuple[list[Sequence[Any]], list[Sequence[Any] | None]]] = {}
        self._live: dict[str, list[_LivePartition]] = {}
        self._outputs: dict[str, list[list[tuple[Any, Any]]]] = {}
        self._output_partitions: dict[str, int] = {}
        self._default_output_partitions = output_partitions
        self._lock = threading.Lock()

    # -- inputs ---------------------------------------------------------------
    def add_stream(
        self,
        stream: str,
        partitions: Sequence[Sequence[Any]],
        keys: Sequence[Sequence[Any] | None] | None = None,
    ) -> MemorySystem:
        """A bounded input stream: ``partitions[p]`` is the list of messages of partition p
        (any sequence but a str or bytes: TypeError naming the stream)."""
        self._check_new(stream)
        parts: list[Sequence[Any]] = list(partition_lists(stream, partitions))
        ks: list[Sequence[Any] | None] = [None] * len(parts)
        if keys is not None:
            if isinstance(keys, _TEXT) or not _iterable(keys):
                raise TypeError(f"stream {stream!r}: expected a list of key lists, got {keys!r}")
            ks = [None if k is None else _partition(stream, p, k, "keys") for p, k in enumerate(keys)]
        if len(ks) != len(parts):
            raise ValueError(f"stream {stream!r}: {len(parts)} partitions but {len(ks)} key lists")
        for p, (m, k) in enumerate(zip(parts, ks)):
            if k is not None and len(k) != len(m):
                raise ValueError(f"stream {stream!r} partition {p}: {len(m)} messages but {len(k)} keys")
        self._bounded[stream] = (parts, ks)
        return self

    def add_live_stream(self, stream: str, partitions: int, *, capacity: int = 10000) -> MemorySystem:
        """A live input stream of ``partitions`` partitions, at most ``capacity`` waiting in each."""
        self._check_new(stream)
        if partitions < 1 or capacity < 1:
            raise ValueError(
                f"stream {stream!r}: partitions and capacity must be >= 1, "
                f"got partitions={partitions!r}, capacity={capacity!r}"
            )
        self._live[stream] = [_LivePartition(capacity) for _ in range(partitions)]
        return self

    def append(
        self,
        stream: str,
        partition: int,
        message: Any,
        key: Any = None,
        timeout: float | None = None,
        *,
        timestamp: int | None = None,
    ) -> int:
        """Append to a live partition from any thread; returns the offset. Blocks while full.

        ``timestamp`` (ms since the epoch): the message's time as this system gives it, which
        its envelope carries unless the task reads its own (rule 32: ``task.timestamp.field``
        or a ``timestamp`` method); None: it has none (ingestion time).

        Raises TimeoutError if still full after ``timeout`` seconds, ValueError after ``end``.
        """
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int)):
            raise TypeError(f"timestamp must be an int of ms since the epoch, got {timestamp!r}")
        p = self._live_partition(stream, partition)
        with p.cond:
            if p.ended:
                raise ValueError(f"{self.name}.{stream}[{partition}] has ended")
            if not p.cond.wait_for(lambda: len(p.items) < p.capacity, timeout):
                raise TimeoutError(f"{self.name}.{stream}[{partition}] stayed full for {timeout}s")
            if timestamp is not None:
                p.timestamped = True
            p.items.append((key, message, timestamp))
            offset = p.next_offset + len(p.items) - 1
            wake = p.wakeup
        if wake is not None:
            wake()
        return offset

    def end(self, stream: str, partition: int | None = None) -> None:
        """Mark the end of one live partition (or all, when ``partition`` is None)."""
        parts = self._live.get(stream)
        if parts is None:
            raise KeyError(f"no live stream {stream!r} in system {self.name!r}")
        wakes = []
        for i in range(len(parts)) if partition is None else [partition]:
            p = self._live_partition(stream, i)
            with p.cond:
                p.ended = True
                wakes.append(p.wakeup)
        for wake in wakes:  # once every partition has ended: a reader woken first sees them all
            if wake is not None:
                wake()

    def partitions(self, stream: str) -> int:
        if stream in self._bounded:
            return len(self._bounded[stream][0])
        if stream in self._live:
            return len(self._live[stream])
        raise InputError(
            f"system {self.name!r} has no input stream {stream!r}", source=f"{self.name}.{stream}"
        )

    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        if ssp.stream in self._bounded:
            parts, keys = self._bounded[ssp.stream]
            return _BoundedReader(ssp, parts[ssp.partition], keys[ssp.partition])
        return _LiveReader(ssp, self._live_partition(ssp.stream, ssp.partition))

    # -- outputs --------------------------------------------------------------
    def set_output_partitions(self, stream: str, n: int) -> None:
        _check_partition_count(n, f"set_output_partitions({stream!r})")
        self._output_partitions[stream] = n

    def output_partitions(self, stream: str) -> int:
        return self._output_partitions.get(stream, self._default_output_partitions)

    def producer(self) -> Producer:
        return _MemoryProducer(self)

    def _output(self, stream: str, partition: int) -> list[tuple[Any, Any]]:
        parts = self._outputs.get(stream)
        if parts is None:
            with self._lock:
                parts = self._outputs.setdefault(stream, [[] for _ in range(self.output_partitions(stream))])
        return parts[partition]

    def messages(self, stream: str, partition: int | None = None) -> list[Any]:
        """Messages sent to an output stream (one partition, or all partitions concatenated)."""
        parts = self._outputs.get(stream, [])
        chosen: Iterable[list[tuple[Any, Any]]] = parts if partition is None else [parts[partition]]
        return [m for part in chosen for _, m in part]

    def records(self, stream: str, partition: int | None = None) -> list[tuple[Any, Any]]:
        """(key, message) pairs sent to an output stream."""
        parts = self._outputs.get(stream, [])
        chosen: Iterable[list[tuple[Any, Any]]] = parts if partition is None else [parts[partition]]
        return [r for part in chosen for r in part]

    # -- helpers --------------------------------------------------------------
    def _check_new(self, stream: str) -> None:
        if stream in self._bounded or stream in self._live:
            raise ValueError(f"stream {stream!r} already exists in system {self.name!r}")

    def _live_partition(self, stream: str, partition: int) -> _LivePartition:
        parts = self._live.get(stream)
        if parts is None:
            raise KeyError(f"no live stream {stream!r} in system {self.name!r}")
        if not 0 <= partition < len(parts):
            raise IndexError(f"{self.name}.{stream} has no partition {partition}")
        return parts[partition]
