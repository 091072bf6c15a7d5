"""The system interfaces under their name before each backend got its own folder
(kept so that code importing ``tailrace.systems.base`` goes on working); they live
in :mod:`tailrace.interfaces`."""

from ..interfaces import PartitionReader, Producer, System

__all__ = ["PartitionReader", "Producer", "System"]
