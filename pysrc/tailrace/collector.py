"""The message collector handed to process/window/end_of_stream."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from .systems.base import Producer
from .types import parse_system_stream


def key_partition(key: Any, partitions: int) -> int:
    """Stable partition of a key (the same in every process and run)."""
    if isinstance(key, bytes):
        data = key
    elif isinstance(key, str):
        data = key.encode()
    else:
        data = repr(key).encode()
    return zlib.crc32(data) % partitions


class Collector:
    """Routes ``send(stream, message, key=None, partition=None)`` to a system's producer.

    ``stream`` is ``"system.stream"`` (or a bare stream name on the default output
    system). The partition is the one given, else the key's stable hash, else
    round robin. ``send`` may block while the output is full (rule 24). Safe to
    call from any thread (producers are thread-safe).
    """

    __slots__ = ("_default_system", "_producers", "_resolved", "_rr", "sent")

    def __init__(self, producers: Mapping[str, Producer], default_system: str | None = None) -> None:
        self._producers = producers
        self._default_system = default_system
        self._resolved: dict[str, tuple[Producer, str, int]] = {}
        self._rr = 0
        self.sent = 0

    def _resolve(self, stream: str) -> tuple[Producer, str, int]:
        try:
            ss = parse_system_stream(stream, self._default_system)
        except ValueError as e:
            raise ValueError(f"collector.send: {e}") from None
        producer = self._producers.get(ss.system)
        if producer is None:
            raise ValueError(
                f"collector.send: no system {ss.system!r} for stream {stream!r} "
                f"(systems: {', '.join(sorted(self._producers)) or 'none'})"
            )
        entry = (producer, ss.stream, producer.partitions(ss.stream))
        self._resolved[stream] = entry
        return entry

    def send(self, stream: str, message: Any, key: Any = None, partition: int | None = None) -> None:
        entry = self._resolved.get(stream)
        if entry is None:
            entry = self._resolve(stream)
        producer, name, n = entry
        if partition is None:
            if key is not None:
                partition = key_partition(key, n)
            else:
                partition = self._rr % n
                self._rr += 1
        elif not 0 <= partition < n:
            raise ValueError(f"collector.send: {stream!r} has no partition {partition} (it has {n})")
        producer.send(name, partition, key, message)
        self.sent += 1
