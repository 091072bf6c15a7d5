from .checkpoint import (
    SCHEMA_VERSION,
    GenerationMarker,
    SqliteCheckpointStore,
    connect,
    container_lock_path,
    lock_path,
    marker_path,
)

__all__ = [
    "SCHEMA_VERSION",
    "GenerationMarker",
    "SqliteCheckpointStore",
    "connect",
    "container_lock_path",
    "lock_path",
    "marker_path",
]
