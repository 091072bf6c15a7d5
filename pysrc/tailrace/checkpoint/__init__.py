"""Checkpoint stores."""

from .base import CheckpointStore, MemoryCheckpointStore

__all__ = ["CheckpointStore", "MemoryCheckpointStore"]
