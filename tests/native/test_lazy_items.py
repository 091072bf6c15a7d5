"""Lazy ring items: envelopes of bounded memory streams are built at dispatch.

For a reader with ``_tailrace_poll_range`` (MemorySystem bounded streams) the C
engine's input rings hold (offset, partition index) words instead of pinned
envelopes, and the envelope is made just before ``process`` from the reader's
lists. These tests pin what that must preserve on every dispatch path (sync on
the loop thread, async completed inline and from threads, the thread pool):
each envelope's fields, order per partition, no loss or duplicate, the start
after a checkpoint, errors naming the offset, and the message objects' reference
counts after runs that end with items still buffered.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    Container,
    MemoryCheckpointStore,
    MemorySystem,
    Scope,
    StreamTask,
    SystemStreamPartition,
    TaskError,
)

STREAMS = ("in", "other")  # two inputs: every task owns partition p of both (two ring partitions)
PARTITIONS = 3


class _Msg:
    """A message whose references can be counted."""

    def __init__(self, label: str) -> None:
        self.label = label


def _system(n: int) -> tuple[MemorySystem, dict[tuple[str, int], list[tuple[Any, _Msg]]]]:
    mem = MemorySystem()
    expected: dict[tuple[str, int], list[tuple[Any, _Msg]]] = {}
    for stream in STREAMS:
        parts, keys = [], []
        for p in range(PARTITIONS):
            msgs = [_Msg(f"{stream}-{p}-{i}") for i in range(n + 37 * p)]
            ks = [None if i % 5 == 0 else f"k{i % 7}" for i in range(len(msgs))]
            parts.append(msgs)
            keys.append(ks)
            expected[(stream, p)] = list(zip(ks, msgs))
        mem.add_stream(stream, parts, keys=keys)
    return mem, expected


class _Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, int], list[tuple[int, Any, _Msg]]] = {}

    def add(self, env: Any) -> None:
        assert env.system == "mem"
        with self.lock:
            self.seen.setdefault((env.stream, env.partition), []).append((env.offset, env.key, env.message))


LOG = _Log()


class SyncRecorder(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        LOG.add(envelope)
        if envelope.offset % 97 == 0:
            coordinator.commit()


class InlineRecorder(AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        LOG.add(envelope)
        callback.complete()


class ThreadRecorder(AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        LOG.add(envelope)
        if envelope.offset % 3 == 0:
            threading.Thread(target=callback.complete).start()
        else:
            callback.complete()


MODES = {
    "sync-loop": (SyncRecorder, {}),
    "async-inline": (InlineRecorder, {}),
    "async-threads-c4": (ThreadRecorder, {"task_max_concurrency": 4}),
    "pool2": (SyncRecorder, {"job_container_thread_pool_size": 2}),
    "pool2-c3": (SyncRecorder, {"job_container_thread_pool_size": 2, "task_max_concurrency": 3}),
    "small-buffer": (SyncRecorder, {"task_input_buffer_size": 7}),
}


def _refcounts(expected: dict[tuple[str, int], list[tuple[Any, _Msg]]]) -> list[int]:
    return [sys.getrefcount(m) for items in expected.values() for _, m in items]


@pytest.mark.parametrize("mode", list(MODES))
def test_every_field_in_order_no_loss_no_duplicate(mode: str) -> None:
    # rules 1, 6: each partition's messages exactly once, in offset order, with their keys
    task, config = MODES[mode]
    LOG.seen = {}
    mem, expected = _system(300)
    before = _refcounts(expected)
    result = Container(task, inputs=[f"mem.{s}" for s in STREAMS], systems=[mem], engine="c", **config).run()
    assert result.reason == "end_of_stream"
    assert set(LOG.seen) == set(expected)
    for sp, items in expected.items():
        got = LOG.seen[sp]
        assert [o for o, _, _ in got] == list(range(len(items))), sp
        assert [(k, m) for _, k, m in got] == items, sp
        assert result.committed[SystemStreamPartition("mem", sp[0], sp[1])] == len(items) - 1
    LOG.seen = {}
    del got, items, result
    assert _refcounts(expected) == before


def test_start_after_checkpoint() -> None:
    # rule 20: a restart resumes after the committed offset, also for lazy items
    LOG.seen = {}
    mem, expected = _system(50)
    store = MemoryCheckpointStore()
    store.open("tailrace-job")
    committed = {SystemStreamPartition("mem", s, p): 9 + p for s in STREAMS for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        store.write(f"Partition {p}", {k: v for k, v in committed.items() if k.partition == p})
    result = Container(
        SyncRecorder, inputs=[f"mem.{s}" for s in STREAMS], systems=[mem], checkpoints=store, engine="c"
    ).run()
    assert result.reason == "end_of_stream"
    for (stream, p), items in expected.items():
        got = LOG.seen[(stream, p)]
        assert [o for o, _, _ in got] == list(range(10 + p, len(items)))
        assert [(k, m) for _, k, m in got] == items[10 + p :]


class StopEarly(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if envelope.partition == 1 and envelope.offset == 5:
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)


class FailAt(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if envelope.partition == 2 and envelope.offset == 123:
            raise ValueError("bad message")


@pytest.mark.parametrize("pool", [0, 2])
def test_items_left_buffered_at_shutdown_hold_nothing(pool: int) -> None:
    # rule 14 shutdown with most input still in the rings: lazy items pin nothing,
    # so dropping them must not release any reference (a wrong release crashes here)
    mem, expected = _system(2000)
    before = _refcounts(expected)
    result = Container(
        StopEarly,
        inputs=[f"mem.{s}" for s in STREAMS],
        systems=[mem],
        engine="c",
        job_container_thread_pool_size=pool,
    ).run()
    assert result.reason == "shutdown"
    assert result.processed < sum(len(v) for v in expected.values())
    del result
    assert _refcounts(expected) == before


@pytest.mark.parametrize("pool", [0, 2])
def test_error_names_the_lazy_envelopes_offset(pool: int) -> None:
    # rule 16: the error names task, partition and offset
    mem, _ = _system(300)
    c = Container(FailAt, inputs=["mem.in"], systems=[mem], engine="c", job_container_thread_pool_size=pool)
    with pytest.raises(TaskError) as info:
        c.run()
    assert info.value.offset == 123
    assert info.value.ssp == SystemStreamPartition("mem", "in", 2)
    assert "123" in str(info.value)
