"""tailrace.testing.TestDriver and event time (rules 32, 33, 38): ``send(..., timestamp=)``
feeds event time, ``advance`` moves wall time, and each moves only its own timers."""

from __future__ import annotations

import math
from typing import Any

import pytest

import tailrace


@pytest.fixture(params=["python", "c"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Both(tailrace.StreamTask):
    """An event-time timer 1 s of event time after each message, and a wall-clock one 1 s of
    wall time after it."""

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        self.context.schedule_event_time(("event", m), envelope.timestamp + 1000)
        self.context.schedule(("wall", m), self.context.now() + 1, self.wall)

    def on_event_time(self, key: Any, when: int, collector: Any, coordinator: Any) -> None:
        collector.send("mem.fired", [key[0], key[1], when])

    def wall(self, key: Any, collector: Any, coordinator: Any) -> None:
        collector.send("mem.fired", [key[0], key[1]])


def test_timestamps_move_event_time_and_advance_moves_wall_time(tailrace_driver: Any, engine: str) -> None:
    d = tailrace_driver(Both, inputs={"in": 1}, engine=engine)
    d.send("in", "a", timestamp=10_000)
    assert d.watermark() == 10_000
    d.advance(1000)  # a second of wall time: the wall timer fires, the event-time one waits
    assert d.outputs("fired") == [["wall", "a"]]
    assert d.watermark() == 10_000
    d.send("in", "b", timestamp=10_999)
    assert d.outputs("fired") == [["wall", "a"]]
    d.send("in", "c", timestamp=11_000)  # event time reaches a's timer; no wall time passed
    assert d.outputs("fired") == [["wall", "a"], ["event", "a", 11_000]]
    d.send_all("in", ["d", "e"], timestamps=[50_000, 12_500])
    # d moves the watermark to 50000: b's and c's fire before e is processed; e's own (13500)
    # is behind the watermark when set, so it fires right after e (never backwards)
    assert d.outputs("fired")[2:] == [["event", "b", 11_999], ["event", "c", 12_000], ["event", "e", 13_500]]
    assert d.watermark() == 50_000
    d.end_input()
    assert d.outputs("fired")[5:] == [["event", "d", 51_000]]  # rule 37: the rest at the end
    assert d.watermark() == math.inf


def test_send_all_needs_a_timestamp_per_message(tailrace_driver: Any, engine: str) -> None:
    d = tailrace_driver(Both, inputs={"in": 1}, engine=engine)
    with pytest.raises(ValueError, match="2 messages and 1 timestamps"):
        d.send_all("in", ["a", "b"], timestamps=[1])
    with pytest.raises(TypeError, match="timestamp must be an int"):
        d.send("in", "a", timestamp="soon")
