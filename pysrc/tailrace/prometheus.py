"""Prometheus export of a running container's metrics (optional extra ``prometheus``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_ENTRY_ID = re.compile(r"[0-9]+-[0-9]+\Z")  # a Redis Streams entry id
_TASK_COUNTERS = (
    "processed",
    "completed",
    "failed",
    "ignored",
    "skipped",
    "dead_lettered",
    "retried",
    "late",
    "windows",
    "commits",
    "timers",
)


class ContainerCollector(Collector):
    """Reads ``container.metrics()`` on each scrape (thread-safe snapshot).

    ``container``: a Container, or anything with its ``metrics()`` and ``skipped()``
    (a Redis member's view of its current container). ``job``: when given, every
    series carries a ``job`` label with the job's name.
    """

    def __init__(self, container: Any, job: str | None = None) -> None:
        self.container = container
        self.job = job

    def collect(self) -> Iterator[Metric]:
        for family in self._collect():
            if self.job is not None:
                family.samples = [s._replace(labels={"job": self.job, **s.labels}) for s in family.samples]
            yield family

    def _collect(self) -> Iterator[Metric]:
        snap = self.container.metrics()
        if snap is None:
            return
        tasks, cm = snap
        for name in _TASK_COUNTERS:
            c = CounterMetricFamily(
                f"tailrace_task_{name}", f"task {name} (SEMANTICS metrics)", labels=["task"]
            )
            for t in tasks.values():
                c.add_metric([t.task], getattr(t, name))
            yield c
        g = GaugeMetricFamily(
            "tailrace_task_outstanding", "callbacks invoked, not yet completed", labels=["task"]
        )
        for t in tasks.values():
            g.add_metric([t.task], t.outstanding)
        yield g
        # task.ordering = key (rules 30, 31)
        keys = GaugeMetricFamily(
            "tailrace_task_keys_in_flight", "keys with a message outstanding (ordering key)", labels=["task"]
        )
        hol = GaugeMetricFamily(
            "tailrace_task_head_of_line_seconds",
            "age of the oldest outstanding message holding the watermark back (ordering key)",
            labels=["task"],
        )
        for t in tasks.values():
            keys.add_metric([t.task], t.keys_in_flight)
            hol.add_metric([t.task], t.head_of_line_ms / 1000.0)
        yield keys
        yield hol
        # event time (rules 33, 37): -Inf before a watermark exists, +Inf once every input ended
        ewm = GaugeMetricFamily(
            "tailrace_task_event_time_watermark_seconds",
            "the task's event-time watermark, seconds since the epoch",
            labels=["task"],
        )
        elag = GaugeMetricFamily(
            "tailrace_task_event_time_lag_seconds",
            "wall clock minus the event-time watermark (+Inf before there is one, 0 once inputs ended)",
            labels=["task"],
        )
        for t in tasks.values():
            ewm.add_metric([t.task], t.event_time_watermark / 1000.0)
            elag.add_metric([t.task], t.event_time_lag_ms / 1000.0)
        yield ewm
        yield elag
        lag = GaugeMetricFamily(
            "tailrace_partition_lag", "newest offset read minus committed", labels=["task", "partition"]
        )
        off = GaugeMetricFamily(
            "tailrace_partition_committed_offset",
            "committed offset (file, memory and Kafka partitions: int offsets)",
            labels=["task", "partition"],
        )
        entry = GaugeMetricFamily(
            "tailrace_partition_committed_entry_ms",
            "time part of the committed entry id (Redis Streams partitions: ids MS-SEQ)",
            labels=["task", "partition"],
        )
        for t in tasks.values():
            for ssp, v in t.lag.items():
                lag.add_metric([t.task, str(ssp)], v)
            for ssp, o in t.committed.items():
                if isinstance(o, int):
                    off.add_metric([t.task, str(ssp)], o)
                elif isinstance(o, str) and _ENTRY_ID.match(o):
                    entry.add_metric([t.task, str(ssp)], int(o.partition("-")[0]))
        yield lag
        yield off
        yield entry
        skipped = CounterMetricFamily(
            "tailrace_partition_skipped", "bad input lines skipped", labels=["partition"]
        )
        for ssp, n in self.container.skipped().items():
            skipped.add_metric([str(ssp)], n)
        yield skipped
        for name in ("envelopes_chosen", "idle_wakeups", "loop_iterations"):
            c = CounterMetricFamily(f"tailrace_container_{name}", f"container {name}")
            c.add_metric([], getattr(cm, name))
            yield c
