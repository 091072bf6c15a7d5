from .system import MemoryCheckpointStore, MemorySystem, decode_state, partition_lists

__all__ = ["MemoryCheckpointStore", "MemorySystem", "decode_state", "partition_lists"]
