"""tailrace: a stream-processing runtime with Samza's asynchronous run loop and a C core."""

from __future__ import annotations

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
from .checkpoint import CheckpointStore, MemoryCheckpointStore
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
from .metrics import ContainerMetrics, RunResult, TaskMetrics
from .systems import MemorySystem, PartitionReader, Producer, System
from .types import Scope, SystemStream, SystemStreamPartition

__version__ = "0.1.0"

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
    "InputError",
    "MemoryCheckpointStore",
    "MemorySystem",
    "PartitionReader",
    "Producer",
    "RunResult",
    "Scope",
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
