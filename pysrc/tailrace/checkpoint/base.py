"""The checkpoint-store interface under its name before each backend got its own
folder (kept so that code importing ``tailrace.checkpoint.base`` goes on working);
it lives in :mod:`tailrace.interfaces`."""

from ..interfaces import CheckpointStore, StateChanges

__all__ = ["CheckpointStore", "StateChanges"]
