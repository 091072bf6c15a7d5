"""Small value types shared across tailrace."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, NamedTuple

Offset = int | str
"""A message offset: an int for memory/file systems, an entry id string for Redis."""


class Scope(enum.IntEnum):
    """Scope of a commit or shutdown request (rule 14)."""

    CURRENT_TASK = 1
    ALL_TASKS_IN_CONTAINER = 2


class SystemStream(NamedTuple):
    system: str
    stream: str

    def __str__(self) -> str:
        return f"{self.system}.{self.stream}"


class SystemStreamPartition(NamedTuple):
    """One ordered input sequence: (system, stream, partition number)."""

    system: str
    stream: str
    partition: int

    def __str__(self) -> str:
        return f"{self.system}.{self.stream}[{self.partition}]"

    @property
    def system_stream(self) -> SystemStream:
        return SystemStream(self.system, self.stream)


Offsets = Mapping[SystemStreamPartition, Offset]
"""Committed offsets by partition (a checkpoint's, or a commit's)."""


def parse_system_stream(name: str, default_system: str | None = None) -> SystemStream:
    """Parse ``"system.stream"`` (or ``"stream"`` when a default system is given)."""
    system, sep, stream = name.partition(".")
    if not sep:
        if default_system is None:
            raise ValueError(f"stream {name!r} must be written as 'system.stream'")
        return SystemStream(default_system, name)
    if not system or not stream:
        raise ValueError(f"stream {name!r} must be written as 'system.stream'")
    return SystemStream(system, stream)


class BadInput:
    """The ``message`` of an envelope whose input could not be read as a message (rule 39):
    bytes that do not decode, a key that cannot be read. A reader puts such an envelope in
    its place in the partition, so that everything before it is processed and committed
    as usual (rule 40); the engine never hands it to ``process``: ``task.error.policy``
    decides (``fail`` raises ``error``, ``skip`` counts it, ``dead-letter`` sends ``raw``).

    ``error``: the exception that says what is wrong (an InputError naming the source,
    partition and offset; a TaskError for a key without identity under key ordering);
    ``raw``: the message's original bytes, or None; ``value``: the message as decoded, where
    it was (its key was the bad part), else None.
    """

    __slots__ = ("error", "raw", "value")

    def __init__(self, error: BaseException, raw: bytes | None = None, value: Any = None) -> None:
        self.error = error
        self.raw = raw
        self.value = value

    def __repr__(self) -> str:
        return f"BadInput({self.error!r})"
