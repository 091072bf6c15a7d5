"""tailrace: a stream-processing runtime with Samza's asynchronous run loop and a C core."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

try:
    from . import _core  # noqa: F401 - fail early with a clear message
except ImportError as _e:  # pragma: no cover - exercised only on broken installs
    from .errors import CoreUnavailableError

    raise CoreUnavailableError(
        "tailrace's compiled core (tailrace._core) could not be imported: "
        f"{_e}. Reinstall from source with a C compiler available: "
        "`pip install --force-reinstall --no-binary tailrace tailrace` "
        "(or `pip install .` in a checkout)."
    ) from _e

from ._core import Coordinator, Envelope
from .api import AsyncStreamTask, Callback, Collector, StreamTask, TaskContext
from .config import Config, parse_config
from .container import Container
from .errors import (
    CallbackError,
    CallbackTimeoutError,
    CheckpointError,
    ConfigError,
    CoreError,
    InputError,
    TailraceError,
    TaskError,
)
from .files import FileSystem
from .interfaces import CheckpointStore, PartitionReader, Producer, System
from .memory import MemoryCheckpointStore, MemorySystem
from .metrics import ContainerMetrics, RunResult, TaskMetrics
from .serdes import SerdeError
from .sqlite import SqliteCheckpointStore
from .stores import KeyValueStore
from .types import Scope, SystemStream, SystemStreamPartition

# a library's convention: its records go where the application's logging sends them, and
# nowhere (not to logging's last-resort stderr handler) when the application configures none
logging.getLogger("tailrace").addHandler(logging.NullHandler())

if TYPE_CHECKING:  # imported lazily at run time (see __getattr__); typed for checkers
    from .redis import RedisCheckpointStore, RedisSystem

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (scikit-build-core regex provider)

__all__ = [
    "AsyncStreamTask",
    "Callback",
    "CallbackError",
    "CallbackTimeoutError",
    "CheckpointError",
    "CheckpointStore",
    "Collector",
    "Config",
    "ConfigError",
    "Container",
    "ContainerMetrics",
    "Coordinator",
    "CoreError",
    "Envelope",
    "FileSystem",
    "InputError",
    "KafkaSystem",
    "KeyValueStore",
    "MemoryCheckpointStore",
    "MemorySystem",
    "PartitionReader",
    "Producer",
    "RedisCheckpointStore",
    "RedisSystem",
    "RunResult",
    "Scope",
    "SerdeError",
    "SqliteCheckpointStore",
    "StreamTask",
    "System",
    "SystemStream",
    "SystemStreamPartition",
    "TailraceError",
    "TaskContext",
    "TaskError",
    "TaskMetrics",
    "parse_config",
]


def __getattr__(name: str) -> Any:
    # the Redis backend is imported on first use: it needs the redis extra
    if name in ("RedisSystem", "RedisCheckpointStore"):
        from . import redis

        return getattr(redis, name)
    if name == "KafkaSystem":  # the Kafka backend needs the kafka extra
        from . import kafka

        return kafka.KafkaSystem
    raise AttributeError(f"module 'tailrace' has no attribute {name!r}")
