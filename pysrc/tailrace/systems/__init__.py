"""Input and output systems."""

from .base import PartitionReader, Producer, System
from .memory import MemorySystem

__all__ = ["MemorySystem", "PartitionReader", "Producer", "System"]
