"""Pins taken by the C engine's binding are released exactly once (STYLE habit 5).

Envelopes sit in C input rings as pinned pointers, errors are pinned while the
loop holds them, string offsets are pinned until the watermark passes them.
These tests count references before and after runs: nothing leaked, nothing
freed early (a premature release would crash or show a count below the start).
"""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

import pytest

from tailrace import AsyncStreamTask, Container, StreamTask, TaskError
from tailrace._core import Envelope
from tailrace.interfaces import PartitionReader, Producer, System
from tailrace.types import Offset, SystemStreamPartition


class _Msg:
    """A message object whose references we can count."""


class _ListReader(PartitionReader):
    def __init__(self, ssp: SystemStreamPartition, envelopes: list[Envelope]) -> None:
        super().__init__(ssp)
        self._envelopes = envelopes
        self._pos = 0

    def start(self, after: Offset | None, wakeup: Any) -> None:
        self._pos = 0

    def poll(self, max_messages: int) -> list[Envelope]:
        batch = self._envelopes[self._pos : self._pos + max_messages]
        self._pos += len(batch)
        return batch

    def at_end(self) -> bool:
        return self._pos >= len(self._envelopes)


class _NullProducer(Producer):
    def partitions(self, stream: str) -> int:
        return 1

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        pass


class _ListSystem(System):
    """Prebuilt envelopes (so the test holds them) with any offsets, e.g. strings."""

    def __init__(self, partitions: list[list[Envelope]]) -> None:
        super().__init__("ls")
        self.parts = partitions

    def partitions(self, stream: str) -> int:
        return len(self.parts)

    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        return _ListReader(ssp, self.parts[ssp.partition])

    def producer(self) -> Producer:
        return _NullProducer()


def _envelopes(n: int, partitions: int, string_offsets: bool) -> list[list[Envelope]]:
    out = []
    for p in range(partitions):
        envs = []
        for i in range(n):
            offset: Offset = f"{i:08d}-{p}" if string_offsets else i
            envs.append(Envelope("ls", "in", p, offset, None, _Msg()))
        out.append(envs)
    return out


def _counts(parts: list[list[Envelope]]) -> list[tuple[int, ...]]:
    # int offsets are shared small ints (other code holds them too): count the
    # offset only when it is a string the test created
    return [
        (sys.getrefcount(e), sys.getrefcount(e.message))
        + ((sys.getrefcount(e.offset),) if isinstance(e.offset, str) else ())
        for p in parts
        for e in p
    ]


class _Sync(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass


class _AsyncThreaded(AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        threading.Thread(target=callback.complete).start()


def _run(task: Any, parts: list[list[Envelope]], **config: Any) -> Any:
    c = Container(task, inputs=["ls.in"], systems=[_ListSystem(parts)], engine="c", **config)
    return c.run()


@pytest.mark.parametrize(
    ("task", "config"),
    [
        (_Sync, {}),
        (_Sync, {"job_container_thread_pool_size": 2}),
        (_AsyncThreaded, {"task_max_concurrency": 4}),
    ],
)
@pytest.mark.parametrize("string_offsets", [False, True])
def test_runs_release_every_pin(task: Any, config: dict[str, Any], string_offsets: bool) -> None:
    parts = _envelopes(300, 3, string_offsets)
    gc.collect()
    before = _counts(parts)
    result = _run(task, parts, task_input_buffer_size=16, **config)
    assert result.processed == 900
    del result
    gc.collect()
    assert _counts(parts) == before


def test_error_and_abandoned_envelopes_are_released() -> None:
    boom = ValueError("boom")

    class Failing(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 5:
                raise boom

    parts = _envelopes(200, 2, False)
    gc.collect()
    before = _counts(parts)
    exc_before = sys.getrefcount(boom)
    with pytest.raises(TaskError) as info:
        _run(Failing, parts, task_input_buffer_size=64)
    assert info.value.__cause__ is boom
    info = None  # type: ignore[assignment]
    boom.__traceback__ = None  # its frames reach the engine, which keeps the TaskError
    gc.collect()
    assert sys.getrefcount(boom) == exc_before  # the loop's pin on the error is gone
    assert _counts(parts) == before  # envelopes left in rings / the batch were released


def test_double_completion_error_is_released() -> None:
    class Twice(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            callback.complete()
            callback.complete()

    parts = _envelopes(50, 1, True)
    gc.collect()
    before = _counts(parts)
    with pytest.raises(TaskError):
        _run(Twice, parts)
    gc.collect()
    assert _counts(parts) == before


def test_string_offsets_are_not_pinned_forever() -> None:
    # a long run keeps only a bounded window of pinned offsets (memory stays flat)
    from tailrace.engine.native import NativeEngine

    seen: list[int] = []

    class Watch(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if int(envelope.offset[:8]) % 500 == 0:
                engine = holder[0]
                seen.append(sum(p.pinned_count for s in engine._slots for p in s.parts))

    holder: list[Any] = []
    original_init = NativeEngine.__init__

    def init(self: Any, plan: Any) -> None:
        original_init(self, plan)
        holder.append(self)

    NativeEngine.__init__ = init  # type: ignore[method-assign]
    try:
        _run(Watch, _envelopes(5000, 1, True), task_input_buffer_size=32)
    finally:
        NativeEngine.__init__ = original_init  # type: ignore[method-assign]
    assert seen and max(seen) <= 3 * 32
