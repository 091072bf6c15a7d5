"""An import path kept for code written before each backend had its own folder: the
system interfaces and the systems under one name. Nothing lives here: the interfaces
are in ``tailrace.interfaces``, each system in its backend's folder (``tailrace.memory``,
``tailrace.files``, ``tailrace.redis``, ``tailrace.kafka``)."""

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
