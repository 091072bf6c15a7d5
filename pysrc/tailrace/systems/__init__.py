"""Every input/output system, in one namespace (each lives with its backend:
``tailrace.memory``, ``tailrace.files``, ``tailrace.redis``); the interface is
``tailrace.interfaces``."""

from __future__ import annotations

from typing import Any

from ..files import FileSystem
from ..interfaces import PartitionReader, Producer, System
from ..memory import MemorySystem

__all__ = ["FileSystem", "MemorySystem", "PartitionReader", "Producer", "RedisSystem", "System"]


def __getattr__(name: str) -> Any:
    if name == "RedisSystem":  # imported on use: needs the redis extra
        from ..redis import RedisSystem

        return RedisSystem
    raise AttributeError(name)
