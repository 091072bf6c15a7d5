"""Every checkpoint store, in one namespace (each lives with its backend:
``tailrace.memory``, ``tailrace.sqlite``, ``tailrace.redis``); the interface is
``tailrace.interfaces``."""

from __future__ import annotations

from typing import Any

from ..interfaces import CheckpointStore
from ..memory import MemoryCheckpointStore
from ..sqlite import SqliteCheckpointStore

__all__ = ["CheckpointStore", "MemoryCheckpointStore", "RedisCheckpointStore", "SqliteCheckpointStore"]


def __getattr__(name: str) -> Any:
    if name == "RedisCheckpointStore":  # imported on use: needs the redis extra
        from ..redis import RedisCheckpointStore

        return RedisCheckpointStore
    raise AttributeError(name)
