"""An import path kept for code written before each backend had its own folder: the
checkpoint-store interface and the stores under one name. Nothing lives here: the
interface is in ``tailrace.interfaces``, each store in its backend's folder
(``tailrace.memory``, ``tailrace.sqlite``, ``tailrace.redis``, ``tailrace.kafka``)."""

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
