"""The checkpoint store interface (SQLite, Redis and in-memory stores implement it).

A checkpoint is, per task, the committed offset of each of its partitions: the
low watermark at the time of the commit (rules 12, 13). ``write`` is atomic per
call: after a crash either the whole new checkpoint of that task or the whole
previous one is read back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from ..types import Offset, SystemStreamPartition


class CheckpointStore(ABC):
    """Durable committed offsets of one job.

    Called from the loop thread only (one container at a time per job and store:
    ``open`` refuses a second one with CheckpointError).
    """

    @abstractmethod
    def open(self, job_name: str) -> None:
        """Claim the store for ``job_name``; CheckpointError if locked by another
        container, corrupt or unreachable."""

    @abstractmethod
    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        """The last committed offsets of a task ({} if it never committed)."""

    @abstractmethod
    def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        """Atomically record committed offsets of a task (partitions not named keep theirs)."""

    def close(self) -> None:
        """Release the claim. Idempotent."""


class MemoryCheckpointStore(CheckpointStore):
    """Checkpoints in a dict; survives container restarts within one process.

    ``history`` records the writes as (task, offsets), oldest first, so tests can
    check the commit sequence. Bounded, so that long runs with frequent commits
    do not grow: once ``history_limit`` writes (default 1000) were recorded it
    holds at least the last ``history_limit`` and fewer than twice that (older
    ones are dropped in chunks). None keeps every write, 0 none.
    """

    def __init__(self, history_limit: int | None = 1000) -> None:
        if history_limit is not None and history_limit < 0:
            raise ValueError(f"history_limit must be >= 0 or None, got {history_limit}")
        self._data: dict[str, dict[str, dict[SystemStreamPartition, Offset]]] = {}
        self._job: str | None = None
        self.history_limit = history_limit
        self.history: list[tuple[str, dict[SystemStreamPartition, Offset]]] = []

    def open(self, job_name: str) -> None:
        self._job = job_name
        self._data.setdefault(job_name, {})

    def _tasks(self) -> dict[str, dict[SystemStreamPartition, Offset]]:
        if self._job is None:
            raise RuntimeError("checkpoint store is not open")
        return self._data[self._job]

    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        return dict(self._tasks().get(task_name, {}))

    def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        self._tasks().setdefault(task_name, {}).update(offsets)
        limit = self.history_limit
        if limit is None or limit > 0:
            history = self.history
            history.append((task_name, dict(offsets)))
            if limit is not None and len(history) >= 2 * limit:
                del history[:limit]  # trimmed in chunks: amortised O(1) per write

    def committed(self, job_name: str | None = None) -> dict[SystemStreamPartition, Offset]:
        """Every committed offset of a job, across tasks."""
        tasks = self._data.get(job_name or self._job or "", {})
        return {ssp: off for offsets in tasks.values() for ssp, off in offsets.items()}

    def close(self) -> None:
        self._job = None
