"""tailrace.testing.TestDriver refuses what would silently do nothing or something else: input
or time after close(), a str where a partition of messages is expected. On both engines."""

from __future__ import annotations

from typing import Any

import pytest

import tailrace
from tailrace.testing import TestDriver


@pytest.fixture(params=["python", "c"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Echo(tailrace.StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", envelope.message)


def test_a_closed_driver_refuses_input_and_time(engine: Any) -> None:
    # as send() after end_input() does (ValueError), instead of appending to a stream
    # nothing reads any more and returning its offset
    with TestDriver(Echo, inputs={"in": 1}, engine=engine) as d:
        d.send("in", "a")
    result = d.result
    calls = {
        "send": lambda: d.send("in", "b"),
        "send_all": lambda: d.send_all("in", ["b"]),
        "advance": lambda: d.advance(60_000),
        "end_input": lambda: d.end_input(),
        "start": lambda: d.start(),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"^the driver is closed: a closed driver takes no input"):
            call()
        assert d.result is result, name
    # what the run left stays readable, and close() stays idempotent
    assert d.outputs("out") == ["a"] and not d.running
    assert d.close() is result and result is not None and result.processed == 1


def test_a_driver_closed_before_it_started_refuses_input_too(engine: Any) -> None:
    d = TestDriver(Echo, inputs={"in": 1}, engine=engine)
    assert d.close() is None
    with pytest.raises(ValueError, match="the driver is closed"):
        d.send("in", "a")
    assert d.outputs("out") == []


def test_send_after_end_input_is_refused_as_before(engine: Any) -> None:
    with TestDriver(Echo, inputs={"in": 1}, engine=engine) as d:
        d.end_input()
        with pytest.raises(ValueError, match=r"mem\.in\[0\] has ended"):
            d.send("in", "b")


@pytest.mark.parametrize("spec", [["hello"], "hello", [["ok"], b"no"]])
def test_a_str_where_a_partition_is_expected_is_refused_naming_the_stream(engine: Any, spec: Any) -> None:
    with pytest.raises(TypeError, match=r"^stream 'w'.*expected a list of"):
        TestDriver(Echo, inputs={"w": spec}, engine=engine)


def test_initial_partitions_may_be_any_other_sequence(engine: Any) -> None:
    with TestDriver(Echo, inputs={"w": (("a", "b"), range(1))}, engine=engine) as d:
        d.end_input()
    assert sorted(map(str, d.outputs("out"))) == ["0", "a", "b"]


def test_advance_takes_milliseconds_and_says_what_it_was_given(engine: Any) -> None:
    # a negative step was reported in seconds (advance(-0.005) for advance(-5)), a str failed
    # with "unsupported operand type(s) for /"
    with TestDriver(Echo, inputs={"in": 1}, engine=engine) as d:
        now = d.now
        with pytest.raises(ValueError) as e:
            d.advance(-5)
        assert str(e.value) == "a clock never goes back: advance(-5) (milliseconds, >= 0)"
        for bad in ("5", None, True):
            with pytest.raises(TypeError) as e:
                d.advance(bad)
            assert str(e.value) == f"advance takes milliseconds as a number, got {bad!r}"
        with pytest.raises(ValueError, match=r"advance\(nan\)"):
            d.advance(float("nan"))
        assert d.now == now
        d.advance(5)
        assert d.now == now + 0.005


class Counts(tailrace.StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.counts[envelope.message] = self.counts.get(envelope.message, 0) + 1


def test_store_of_an_unknown_task_or_store_names_the_known_ones(engine: Any) -> None:
    # a misspelled task or store name read as an empty store ({})
    d = TestDriver(Counts, inputs={"a": 1, "b": 2}, stores=["counts", "seen"], engine=engine)
    with d:
        d.send("b", "x", partition=1)
        d.advance(60_000)
        assert d.store("Partition 1", "counts", raw=True) == {b'"x"': b"1"}
        assert d.store("Partition 0", "counts") == {}
        with pytest.raises(KeyError) as e:
            d.store("Partition 2", "counts")
        assert e.value.args[0] == "no task 'Partition 2': the tasks are 'Partition 0', 'Partition 1'"
        with pytest.raises(KeyError) as e:
            d.store("Partition 1", "count")
        assert e.value.args[0] == "no state store 'count': the tasks' stores are 'counts', 'seen'"
    with pytest.raises(KeyError) as e:
        TestDriver(Echo, inputs={"in": 1}, engine=engine).store("Partition 0", "counts")
    assert e.value.args[0] == "no state store 'counts': the job has no stores"
