"""task.ordering = key (rule 30): which keys are one key, on both engines (issue 38, item 14).

Two dicts with the same fields in another order (a JSON ``key_field`` gives such keys)
are one key: they used to be two (their ``repr`` differs), so they could run at once.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tailrace import AsyncStreamTask, Container, MemorySystem, StreamTask, SystemStreamPartition, TaskError
from tailrace._core import make_envelopes
from tailrace.interfaces import PartitionReader, Producer, System
from tailrace.ordering import key_identity, unhashable_key_text

from .conftest import ENGINE_NAMES


def test_dicts_with_the_same_fields_in_another_order_are_one_key() -> None:
    assert unhashable_key_text({"b": 2, "a": [1, {"y": 1, "x": 0}]}) == '{"a":[1,{"x":0,"y":1}],"b":2}'
    assert key_identity({"a": 1, "b": 2}) == key_identity({"b": 2, "a": 1})
    assert key_identity({"a": 1}) != key_identity({"a": 2})
    # no canonical JSON (field names of mixed types cannot be sorted): no identity at all, as
    # its repr would not do ({1: "x", "1": "y"} == {"1": "y", 1: "x"}, printed differently)
    with pytest.raises(TypeError):
        key_identity({1: "x", "1": "y"})


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_one_key_written_in_two_field_orders_never_runs_twice_at_once(engine: str) -> None:
    lock = threading.Lock()
    running: dict[str, int] = {}
    overlaps: list[Any] = []

    class Hold(AsyncStreamTask):
        def process_async(self, env: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            key = unhashable_key_text(env.key)
            with lock:
                running[key] = running.get(key, 0) + 1
                if running[key] > 1:
                    overlaps.append((env.offset, env.key))

            def done() -> None:
                with lock:
                    running[key] -= 1
                callback.complete()

            threading.Timer(0.01, done).start()

    keys = [{"user": "ann", "region": "eu"}, {"region": "eu", "user": "ann"}] * 10
    mem = MemorySystem().add_stream("in", [list(range(len(keys)))], keys=[keys])
    result = Container(
        Hold,
        inputs=["mem.in"],
        systems=[mem],
        config={"task.ordering": "key", "task.max.concurrency": 4},
        engine=engine,
    ).run()
    assert result.processed == len(keys)
    assert overlaps == []


class _EqualOnly:
    """Equal to every other one, no ``__hash__``: its repr (with its id) would make each
    instance a key of its own."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _EqualOnly)


class _HashFails:
    def __hash__(self) -> int:
        raise RuntimeError("no hash today")


class _RangeReader(PartitionReader):
    """A bounded partition that hands the C loop fresh lists at each ``_tailrace_poll_range``
    call, so the loop builds its envelopes at once (not the lazy items of MemorySystem)."""

    def __init__(self, ssp: SystemStreamPartition, messages: list[Any], keys: list[Any]) -> None:
        super().__init__(ssp)
        self.messages, self.keys, self.pos = messages, keys, 0

    def start(self, after: Any, wakeup: Callable[[], None]) -> None:
        self.pos = 0 if after is None else after + 1

    def poll(self, max_messages: int) -> list[Any]:  # the reference engine's way
        messages, keys, start, end = self._tailrace_poll_range(max_messages)
        s = self.ssp
        return make_envelopes(s.system, s.stream, s.partition, start, messages[start:end], keys[start:end])

    def at_end(self) -> bool:
        return self.pos >= len(self.messages)

    def _tailrace_poll_range(self, n: int) -> tuple[Sequence[Any], Sequence[Any] | None, int, int]:
        start, self.pos = self.pos, min(self.pos + n, len(self.messages))
        return list(self.messages), list(self.keys), start, self.pos


class _NoOutputs(Producer):
    def partitions(self, stream: str) -> int:
        return 1

    def send(self, stream: str, partition: int, key: Any, message: Any) -> None:
        raise AssertionError("no outputs")


class _RangeSystem(System):
    def __init__(self, messages: list[list[Any]], keys: list[list[Any]]) -> None:
        super().__init__("mem")
        self.parts = list(zip(messages, keys))

    def partitions(self, stream: str) -> int:
        return len(self.parts)

    def reader(self, ssp: SystemStreamPartition) -> PartitionReader:
        return _RangeReader(ssp, *self.parts[ssp.partition])

    def producer(self) -> Producer:
        return _NoOutputs()


def _system(how: str, messages: list[list[Any]], keys: list[list[Any]]) -> System:
    if how == "bounded":  # lazy ring items on the C loop
        return MemorySystem().add_stream("in", messages, keys=keys)
    if how == "range":  # envelopes built by the C loop
        return _RangeSystem(messages, keys)
    live = MemorySystem().add_live_stream("in", len(messages))  # envelopes built by the reader
    for p, (ms, ks) in enumerate(zip(messages, keys)):
        for m, k in zip(ms, ks):
            live.append("in", p, m, key=k)
    live.end("in")
    return live


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("how", ["bounded", "range", "live"])
@pytest.mark.parametrize(
    ("key", "named", "why"),
    [
        ({1, 2}, "a set ({1, 2})", "neither hashable nor JSON (TypeError: Object of type set"),
        ({"a": {1}}, "a dict ({'a': {1}})", "neither hashable nor JSON (TypeError: Object of type set"),
        ({1: "x", "1": "y"}, "a dict (", "neither hashable nor JSON (TypeError: '<' not supported"),
        (_EqualOnly(), f"a {__name__}._EqualOnly (", "neither hashable nor JSON (TypeError: Object of type"),
        (_HashFails(), f"a {__name__}._HashFails (", "its hash failed (RuntimeError: no hash today)"),
    ],
)
def test_a_key_without_an_identity_stops_the_run_naming_task_partition_offset_and_type(
    engine: str, how: str, key: Any, named: str, why: str
) -> None:
    # issue 38, item 14: such a key stood for its repr, which two equal keys need not share
    # (so they could run at once), or its hash's error escaped without a word of where
    class Count(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    messages = [[f"m{i}" for i in range(6)] for _ in range(2)]
    keys: list[list[Any]] = [["k"] * 6, ["k", "k", "k", key, "k", "k"]]
    gc.collect()
    before = [sys.getrefcount(m) for part in messages for m in part]
    system = _system(how, messages, keys)
    with pytest.raises(TaskError) as info:
        Container(Count, inputs=["mem.in"], systems=[system], engine=engine, task_ordering="key").run()
    err = info.value
    assert (err.task, err.ssp, err.offset) == ("Partition 1", SystemStreamPartition("mem", "in", 1), 3)
    text = str(err)
    where = "task 'Partition 1' failed in key ordering of mem.in[1] at offset 3: its key, "
    assert text.startswith(where), text
    assert named in text and why in text and "docs/ordering.md" in text, text
    assert err.__cause__ is err.original and err.original is not None
    del info, err, system
    gc.collect()
    assert [sys.getrefcount(m) for part in messages for m in part] == before  # no pin left behind


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_docs_ordering_md_quotes_the_error_as_it_is(engine: str) -> None:
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "ordering.md").read_text().split())
    keys: list[list[Any]] = [["k"] * 4, ["k", "k", "k", {1, 2}]]
    system = MemorySystem().add_stream("in", [list(range(4))] * 2, keys=keys)

    class Count(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    with pytest.raises(TaskError) as info:
        Container(Count, inputs=["mem.in"], systems=[system], engine=engine, task_ordering="key").run()
    assert f"`{info.value}`" in doc, str(info.value)
