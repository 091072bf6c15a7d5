"""The in-memory backend, for tests and examples.

- ``system``: :class:`MemorySystem` (bounded streams from lists, live streams appended
  from any thread, outputs read back with ``messages``);
- ``checkpoint``: :class:`MemoryCheckpointStore` (offsets and state in dicts, with the
  write history for tests).
"""

from __future__ import annotations

from .checkpoint import MemoryCheckpointStore, decode_state
from .system import MemorySystem, partition_lists

__all__ = ["MemoryCheckpointStore", "MemorySystem", "decode_state", "partition_lists"]
