"""task.ordering = key (rule 30): which keys are one key, on both engines (issue 38, item 14).

Two dicts with the same fields in another order (a JSON ``key_field`` gives such keys)
are one key: they used to be two (their ``repr`` differs), so they could run at once.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tailrace import AsyncStreamTask, Container, MemorySystem
from tailrace.ordering import key_identity, unhashable_key_text

from .conftest import ENGINE_NAMES


def test_dicts_with_the_same_fields_in_another_order_are_one_key() -> None:
    assert unhashable_key_text({"b": 2, "a": [1, {"y": 1, "x": 0}]}) == '{"a":[1,{"x":0,"y":1}],"b":2}'
    assert key_identity({"a": 1, "b": 2}) == key_identity({"b": 2, "a": 1})
    assert key_identity({"a": 1}) != key_identity({"a": 2})
    assert key_identity({1: "x", "1": "y"}) == ("text", repr({1: "x", "1": "y"}))  # no canonical JSON


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
