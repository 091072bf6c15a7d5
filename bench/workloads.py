"""The benchmark workloads: one registry, one entry per workload.

A workload is a task class (the same class every engine runs), a partition
count, a config, and the "floor" driver that fits it (a bare Python loop calling
the task's own ``process`` with prebuilt arguments), or None where a bare loop
cannot stand for the work (threads, sleeps). Adding a workload is one
``_register(Workload(...))`` call below.

Every message payload is a reference into a fixed pool of 1000 short strings, so
input lists cost one pointer per message whatever their length.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailrace import AsyncStreamTask, StreamTask

KEYS: tuple[str, ...] = tuple(f"k{i:03d}" for i in range(1000))


def payload(first: int, count: int) -> list[str]:
    """Messages ``first .. first+count-1`` of a partition (keys cycling through KEYS)."""
    n = len(KEYS)
    return [KEYS[i % n] for i in range(first, first + count)]


def split(total: int, partitions: int) -> list[int]:
    """Message count of each partition when ``total`` messages are spread evenly."""
    base, extra = divmod(total, partitions)
    return [base + (1 if p < extra else 0) for p in range(partitions)]


# -- tasks --------------------------------------------------------------------
class Noop(StreamTask):
    """Does nothing: measures the engine's per-message cost."""

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass


class Counter(StreamTask):
    """Counts messages per key in a per-task dict."""

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        counts = self.counts
        m = envelope.message
        counts[m] = counts.get(m, 0) + 1


class StoreCounter(StreamTask):
    """Counts messages per key in a state store (``counts``: str keys, int values): the
    same work as :class:`Counter`, durable with the offsets (docs/state.md)."""

    def init(self, context: Any) -> None:
        self.store = context.store("counts")
        self.counts: dict[Any, int] = {}

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        store = self.store
        m = envelope.message
        store[m] = store.get(m, 0) + 1

    def close(self) -> None:
        # for the check: the store's view (cache merged with committed state) before it closes
        if not self.counts:
            self.counts = dict(self.store.items())


class InlineAsync(AsyncStreamTask):
    """Completes its callback before ``process_async`` returns."""

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        callback.complete()


class ThreadAsync(AsyncStreamTask):
    """Hands each callback to a helper thread that completes it (as an I/O client would)."""

    def __init__(self) -> None:
        self._pending: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._complete_all, name="bench-completer", daemon=True)
        self._thread.start()

    def _complete_all(self) -> None:
        get = self._pending.get
        while (callback := get()) is not None:
            callback.complete()

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        self._pending.put(callback)

    def close(self) -> None:
        """Stop the helper thread (idempotent; the bench also calls it after a failed run)."""
        if self._thread.is_alive():
            self._pending.put(None)
            self._thread.join()


class AsyncioInline(AsyncStreamTask):
    """``async def process`` that never suspends."""

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        return None


class AsyncioSleep(AsyncStreamTask):
    """``async def process`` awaiting 10 ms of simulated I/O."""

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        await asyncio.sleep(0.01)


SLOW_KEY = "slow"


def skewed_keys(first: int, count: int) -> list[str]:
    """Keys of messages ``first .. first+count-1``: uniform over KEYS (a fixed
    scramble of the position), except that 1 message in 2,000 has SLOW_KEY."""
    n = len(KEYS)
    return [SLOW_KEY if i % 2000 == 1999 else KEYS[(i * 2654435761) % n] for i in range(first, first + count)]


class AsyncioSleepKeyed(AsyncStreamTask):
    """``async def process`` awaiting 10 ms, or 200 ms for SLOW_KEY (skewed keys)."""

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        await asyncio.sleep(0.2 if envelope.key == SLOW_KEY else 0.01)


# -- checks -------------------------------------------------------------------
def _check_counts(tasks: Sequence[Any], per_task: Sequence[int]) -> str | None:
    """Each Counter saw exactly its partition's messages, each key as often as sent."""
    k = len(KEYS)
    for i, (task, n) in enumerate(zip(tasks, per_task)):
        expected = {KEYS[j]: n // k + (1 if j < n % k else 0) for j in range(min(n, k))}
        if task.counts != expected:
            got = sum(task.counts.values())
            return f"task {i}: counted {got} messages over {len(task.counts)} keys, expected {n}"
    return None


# -- the registry -------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """One benchmark workload.

    ``task``: the task class (instantiated once per partition by every engine).
    ``floor``: "sync", "async" or "asyncio" (which bare-loop driver fits), or None.
    ``check(tasks, per_task_counts)``: an error message when the tasks' own state
    shows lost or duplicated messages, else None. ``guard``: when set, an engine
    that raises on this workload is skipped with this note instead of failing.
    """

    name: str
    doc: str
    task: Callable[[], Any]
    partitions: int = 1
    config: Mapping[str, Any] = field(default_factory=dict)
    floor: str | None = None
    check: Callable[[Sequence[Any], Sequence[int]], str | None] | None = None
    guard: str | None = None
    # the input's keys (first, count) -> keys, or None: no keys
    keys: Callable[[int, int], list[Any]] | None = None


WORKLOADS: dict[str, Workload] = {}


def _register(w: Workload) -> None:
    if w.name in WORKLOADS:
        raise ValueError(f"workload {w.name!r} registered twice")
    WORKLOADS[w.name] = w


_register(Workload("sync_noop_1task", "StreamTask, empty process, 1 task", Noop, floor="sync"))
_register(
    Workload(
        "sync_noop_1task_deadletter",
        "StreamTask, empty process, 1 task, task.error.policy = dead-letter (compare sync_noop_1task)",
        Noop,
        config={"task.error.policy": "dead-letter", "task.error.stream": "bench.dead"},
        floor="sync",
    )
)
_register(
    Workload(
        "sync_state_16tasks_store_deadletter",
        "sync_state_16tasks_store with task.error.policy = dead-letter",
        StoreCounter,
        partitions=16,
        config={
            "stores": {"counts": {"key.serde": "str", "value.serde": "int"}},
            "task.error.policy": "dead-letter",
            "task.error.stream": "bench.dead",
        },
        check=_check_counts,
    )
)
_register(
    Workload(
        "sync_noop_1024tasks", "StreamTask, empty process, 1024 tasks", Noop, partitions=1024, floor="sync"
    )
)
_register(
    Workload(
        "sync_state_16tasks",
        "StreamTask, per-task dict counter update, 16 tasks",
        Counter,
        partitions=16,
        floor="sync",
        check=_check_counts,
    )
)
_register(
    Workload(
        "sync_state_16tasks_store",
        "StreamTask, per-task state store counter update, 16 tasks (compare sync_state_16tasks)",
        StoreCounter,
        partitions=16,
        config={"stores": {"counts": {"key.serde": "str", "value.serde": "int"}}},
        check=_check_counts,
    )
)
_register(Workload("async_inline", "process_async completes before returning", InlineAsync, floor="async"))
_register(
    Workload(
        "async_thread_c64",
        "process_async completed from a helper thread, max concurrency 64",
        ThreadAsync,
        config={"task.max.concurrency": 64},
    )
)
_register(
    Workload(
        "pool4_sync",
        "StreamTask, empty process, 16 tasks on a thread pool of 4",
        Noop,
        partitions=16,
        config={"job.container.thread.pool.size": 4},
    )
)
_register(
    Workload(
        "commit_100ms",
        "StreamTask, empty process, 1 task, commit every 100 ms",
        Noop,
        config={"task.commit.ms": 100},
        floor="sync",
    )
)
_register(
    Workload(
        "asyncio_inline",
        "async def process that never awaits, 1 task",
        AsyncioInline,
        floor="asyncio",
    )
)
_register(
    Workload(
        "asyncio_inline_c64",
        "async def process that never awaits, 1 task, max concurrency 64 (reaches the loop in bursts)",
        AsyncioInline,
        config={"task.max.concurrency": 64},
        floor="asyncio",
    )
)
_register(
    Workload(
        "asyncio_io",
        "async def process awaiting asyncio.sleep(0.01), 4 tasks, max concurrency 32",
        AsyncioSleep,
        partitions=4,
        config={"task.max.concurrency": 32},
    )
)
# task.ordering = key (issue 17): skewed keys, one slow key; the same job kept in
# per-key order by key lanes (ordering key, 64 in flight), with no per-key order
# (ordering partition, 64 in flight), and in per-key order the only way partition
# ordering can (max concurrency 1)
for _name, _doc, _cfg in (
    (
        "asyncio_io_keyed",
        "ordering key, max concurrency 64",
        {"task.ordering": "key", "task.max.concurrency": 64},
    ),
    ("asyncio_io_keyed_p64", "ordering partition, max concurrency 64", {"task.max.concurrency": 64}),
    ("asyncio_io_keyed_p1", "ordering partition, max concurrency 1", {"task.max.concurrency": 1}),
):
    _register(
        Workload(
            _name,
            "async def process awaiting 10 ms (200 ms for 1 key in 2,000 messages), 1,000 keys, 4 tasks, "
            + _doc,
            AsyncioSleepKeyed,
            partitions=4,
            config=_cfg,
            keys=skewed_keys,
        )
    )
_register(
    Workload(
        "sync_noop_1task_keyed",
        "StreamTask, empty process, 1 task, task.ordering = key (1,000 keys)",
        Noop,
        config={"task.ordering": "key"},
        keys=skewed_keys,
    )
)
