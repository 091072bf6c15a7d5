"""Metrics of SEMANTICS.md, as plain snapshots both engines produce."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .types import Offset, SystemStreamPartition


def partition_lag(newest_read: Offset | None, committed: Offset | None, unread: int) -> int:
    """SEMANTICS "watermark lag": the newest offset read minus the committed one, where
    offsets are integers (memory and Kafka: messages; files: bytes, the offsets of line
    starts); nothing committed counts as -1, nothing read as no lag. Offsets that cannot be
    subtracted (Redis entry ids) give ``unread``: the messages read and not yet committed."""
    if newest_read is None:
        return 0
    if type(newest_read) is int and (committed is None or type(committed) is int):
        return max(newest_read - (-1 if committed is None else committed), 0)
    return unread


@dataclass
class TaskMetrics:
    """Per-task counters and gauges (a snapshot)."""

    task: str
    processed: int = 0  # process/process_async invocations
    completed: int = 0  # callbacks released in order (rule 12)
    failed: int = 0
    ignored: int = 0  # exceptions skipped via task.ignored.exceptions
    # bad messages (rule 39) by task.error.policy: skipped, sent to task.error.stream, and
    # the process attempts made again (task.error.retries)
    skipped: int = 0
    dead_lettered: int = 0
    retried: int = 0
    late: int = 0  # messages late for every window they belong to (rule 35; tailrace.windows)
    outstanding: int = 0  # gauge: invoked, not yet completed
    windows: int = 0
    commits: int = 0
    timers: int = 0
    # task.ordering = key (rules 30, 31): keys with a message outstanding (gauge)
    keys_in_flight: int = 0
    # age in ms of the oldest invoked message not yet released: what holds the
    # low watermark back (head-of-line time; 0.0 when nothing is outstanding)
    head_of_line_ms: float = 0.0
    # the event-time watermark (rules 33, 37): ms since the epoch, -inf before there is one,
    # inf once every input ended (as context.watermark()); its lag behind the wall clock in
    # ms (inf while there is none, 0 once every input ended)
    event_time_watermark: int | float = -math.inf
    event_time_lag_ms: float = math.inf
    committed: dict[SystemStreamPartition, Offset] = field(default_factory=dict)
    low_watermark: dict[SystemStreamPartition, Offset] = field(default_factory=dict)
    newest_read: dict[SystemStreamPartition, Offset] = field(default_factory=dict)
    # the watermark lag per partition: newest offset read minus committed (see partition_lag)
    lag: dict[SystemStreamPartition, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("committed", "low_watermark", "newest_read", "lag"):
            d[k] = {str(ssp): v for ssp, v in d[k].items()}
        return d


@dataclass
class ContainerMetrics:
    """Per-container counters (a snapshot)."""

    envelopes_chosen: int = 0
    idle_wakeups: int = 0
    loop_iterations: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RunResult:
    """What ``Container.run()`` returns after a graceful stop."""

    tasks: dict[str, TaskMetrics]
    container: ContainerMetrics
    committed: dict[SystemStreamPartition, Offset]
    reason: str  # "end_of_stream", "shutdown", "stop"
    seconds: float = 0.0

    @property
    def processed(self) -> int:
        return sum(t.processed for t in self.tasks.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "seconds": self.seconds,
            "container": self.container.as_dict(),
            "tasks": {name: t.as_dict() for name, t in self.tasks.items()},
            "committed": {str(k): v for k, v in self.committed.items()},
        }
