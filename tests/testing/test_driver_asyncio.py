"""``async def`` tasks under tailrace.testing.TestDriver: their asyncio loop runs on the driver's
virtual time, so ``asyncio.sleep`` ends exactly when the test advances past it, and every driver
call returns once the coroutines have run as far as the virtual time lets them (issue 38)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tailrace
from tailrace.testing import TestDriver


@pytest.fixture(params=["python", "c"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Lookup(tailrace.AsyncStreamTask):
    """A remote lookup that takes 50 ms (virtual), then a store write and an output."""

    def init(self, context: Any) -> None:
        self.context = context
        self.counts = context.store("counts")
        self.done: list[tuple[str, float]] = []

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        await asyncio.sleep(0.05)
        self.counts[envelope.message] = self.counts.get(envelope.message, 0) + 1
        self.done.append((envelope.message, self.context.now()))
        collector.send("mem.out", envelope.message.upper())


def test_an_async_def_task_runs_on_virtual_time(engine: str) -> None:
    config = {"task.max.concurrency": 4, "task.commit.ms": 1_000}
    with TestDriver(Lookup, inputs={"in": 1}, stores=["counts"], config=config, engine=engine) as d:
        t0 = d.now
        d.send_all("in", ["a", "b", "a"])
        assert d.outputs("out") == [] and d.pending == []  # sleeping; not the test's to complete
        d.advance(49)
        assert d.outputs("out") == []  # 1 ms to go
        d.advance(1)
        assert sorted(d.outputs("out")) == ["A", "A", "B"]  # all three were in flight at once
        (task,) = d.tasks
        assert {round(t - t0, 3) for _, t in task.done} == {0.05}
        d.advance(1_000)
        assert d.committed_offset("in") == 2
        assert d.store("Partition 0", "counts") == {"a": 2, "b": 1}


def test_concurrency_one_runs_the_coroutines_one_after_another(engine: str) -> None:
    with TestDriver(Lookup, inputs={"in": 1}, stores=["counts"], engine=engine) as d:
        d.send_all("in", ["a", "b", "c"])
        seen = []
        for _ in range(3):
            d.advance(50)
            seen.append(list(d.outputs("out")))
        assert seen == [["A"], ["A", "B"], ["A", "B", "C"]]  # rule 2: one at a time
        result = d.end_input()
        assert result is not None and result.processed == 3


class Stuck(tailrace.AsyncStreamTask):
    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        await asyncio.sleep(3600)


def test_a_callback_timeout_of_a_coroutine_is_virtual(engine: str) -> None:
    config = {"task.callback.timeout.ms": 5_000}
    d = TestDriver(Stuck, inputs={"in": 1}, config=config, engine=engine)
    with d:
        d.send("in", "x")
        d.advance(4_999)
        assert d.running
        with pytest.raises(tailrace.TaskError, match="offset 0"):
            d.advance(1)


class Failing(tailrace.AsyncStreamTask):
    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        await asyncio.sleep(0.01)
        raise ValueError(f"bad {envelope.message}")


def test_a_coroutine_s_error_stops_the_run_and_names_the_message(engine: str) -> None:
    d = TestDriver(Failing, inputs={"in": 1}, engine=engine)
    with pytest.raises(tailrace.TaskError, match="offset 0"):
        with d:
            d.send("in", "x")
            d.advance(10)
