"""Every commit of a task with stores holds exactly the effects of the messages at or below
the offsets it writes, also while messages complete out of order, under key ordering's
look-ahead and on the thread pool; and such commits keep happening during the run
(rules 9, 26, 27, 30). Checked inside each checkpoint write, both engines."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest

from tailrace import AsyncStreamTask, Container, MemoryCheckpointStore, MemorySystem, StreamTask
from tailrace.serdes import serde

N = 500
KEYS = 12
_rng = random.Random(7)
_KEY = [f"k{_rng.randrange(KEYS)}" for _ in range(N)]
_DELAY = [_rng.random() * 0.003 for _ in range(N)]
_LOCK = threading.Lock()


def _count(store: Any, key: str) -> None:
    with _LOCK:  # async callbacks and pool threads update the store concurrently
        store[key] = store.get(key, 0) + 1


class _Async(AsyncStreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        await asyncio.sleep(_DELAY[envelope.offset])
        _count(self.counts, envelope.key)


class _Callback(AsyncStreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        def finish() -> None:
            _count(self.counts, envelope.key)
            callback.complete()

        threading.Timer(_DELAY[envelope.offset], finish).start()


class _Sync(StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        time.sleep(_DELAY[envelope.offset] / 3)
        _count(self.counts, envelope.key)


class _Checked(MemoryCheckpointStore):
    """Compares the state of each write with the effects of the offsets it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.wrong: list[str] = []

    def write(self, task: str, offsets: Any, state: Any = None) -> None:
        super().write(task, offsets, state)
        self.writes += 1
        if not offsets:
            return
        (offset,) = offsets.values()
        want: dict[str, int] = {}
        for i in range(offset + 1):
            want[_KEY[i]] = want.get(_KEY[i], 0) + 1
        value = serde("int")
        got = {k.decode(): value.decode(v) for k, v in self.state(task, "counts", raw=True).items()}
        if got != want:
            self.wrong.append(f"offset {offset}: {sum(got.values()) - sum(want.values()):+d} effects")


@pytest.mark.parametrize(
    ("kind", "ordering"),
    [("async", "key"), ("callback", "key"), ("pool", "key"), ("pool", "partition"), ("async", "partition")],
)
def test_each_commit_holds_exactly_its_prefix(engine: str, kind: str, ordering: str) -> None:
    # rules 26, 27, 30: with key ordering, messages run ahead of an earlier one whose key
    # is busy; a commit must not write their effects with offsets below them
    task = {"async": _Async, "callback": _Callback, "pool": _Sync}[kind]
    config: dict[str, Any] = {"task.ordering": ordering, "task.max.concurrency": 8, "task.commit.ms": 5}
    if kind == "pool":
        config["job.container.thread.pool.size"] = 2
    system = MemorySystem("mem").add_stream("in", [list(range(N))], keys=[_KEY])
    checkpoints = _Checked()
    result = Container(
        task,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=checkpoints,
        engine=engine,
        config=config,
        stores={"counts": {"key.serde": "str", "value.serde": "int"}},
    ).run()
    assert checkpoints.wrong == []
    assert result.committed == {next(iter(result.committed)): N - 1}
    # rule 9: commits happen during the run, not only the final one (a pool task with
    # stores once committed only at the end on the C engine)
    assert checkpoints.writes >= 5, checkpoints.writes
