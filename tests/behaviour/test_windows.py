"""Windows in jobs (SEMANTICS rules 34-37; docs/windows.md), on both engines, through
``tailrace.testing.TestDriver``: one message at a time, so the watermark each message sees
is known (the largest timestamp read, minus task.watermark.lag.ms).

Event-time windows close in the engine's event-time timers (``context.schedule_event_time``);
processing-time windows in ``context.schedule`` timers on the driver's virtual clock. The
pure runtime against a batch computation: tests/core/test_windows_logic.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    ConfigError,
    Container,
    MemoryCheckpointStore,
    SqliteCheckpointStore,
    StreamTask,
)
from tailrace.interfaces import CheckpointStore
from tailrace.testing import TestDriver
from tailrace.windows import Agg, Collect, Count, Fold, Hopping, Session, Sum, Tumbling, WindowResult

from .helpers import bounded

MIN = 60_000
STAMPED = {"task.timestamp.field": "ts"}


class PerUser(StreamTask):
    # no process(): every message goes to every window
    per_minute = Tumbling(MIN, key="user", aggregate=Count(), output="mem.counts", late_output="mem.late")


def _finals(driver: TestDriver, stream: str = "counts") -> list[tuple[Any, int, int, Any]]:
    return [(m["key"], m["start"], m["end"], m["value"]) for m in driver.outputs(stream) if m["final"]]


def _send(driver: TestDriver, *clicks: tuple[str, int]) -> None:
    for user, ts in clicks:
        driver.send("in", {"user": user, "ts": ts}, key=user)


def test_rule35_a_window_closes_when_the_watermark_reaches_its_end(engine: str) -> None:
    with TestDriver(PerUser, inputs={"in": 1}, config=STAMPED, engine=engine) as d:
        _send(d, ("ann", 1_000), ("bob", 30_000), ("ann", 59_999))
        assert _finals(d) == []
        _send(d, ("bob", MIN))  # the watermark reaches 60000: [0, 60000) closes, by key
        assert _finals(d) == [("ann", 0, MIN, 2), ("bob", 0, MIN, 1)]
        assert d.outputs("counts")[0] == {"key": "ann", "start": 0, "end": MIN, "value": 2, "final": True}
        assert d.records("counts")[0][0] == "ann"  # the message key is the window key


def test_rule35_a_late_message_is_counted_sent_late_and_changes_nothing(engine: str) -> None:
    with TestDriver(PerUser, inputs={"in": 1}, config=STAMPED, engine=engine) as d:
        _send(d, ("ann", 1_000), ("bob", 61_000), ("ann", 2_000))
        assert d.outputs("late") == [
            {
                "message": {"user": "ann", "ts": 2_000},
                "key": "ann",
                "timestamp": 2_000,
                "windows": [[0, MIN]],
                "watermark": 61_000,
            }
        ]
        assert d.metrics()[0]["Partition 0"].late == 1
        d.end_input()
        assert _finals(d) == [("ann", 0, MIN, 1), ("bob", MIN, 2 * MIN, 1)]


def test_rule35_out_of_order_within_the_lag_joins_its_window(engine: str) -> None:
    config = {**STAMPED, "task.watermark.lag.ms": 5_000}
    with TestDriver(PerUser, inputs={"in": 1}, config=config, engine=engine) as d:
        _send(d, ("ann", 1_000), ("ann", 62_000), ("ann", 58_000))  # watermark 57000: still open
        assert _finals(d) == []
        _send(d, ("ann", 66_000), ("ann", 59_000))  # watermark 61000: closed, then late
        assert _finals(d) == [("ann", 0, MIN, 2)]
        assert d.metrics()[0]["Partition 0"].late == 1


class Graced(StreamTask):
    w = Tumbling(MIN, grace_ms=10_000, key="user", output="mem.counts", late_output="mem.late")


def test_rule35_grace_keeps_a_window_open_after_its_end(engine: str) -> None:
    with TestDriver(Graced, inputs={"in": 1}, config=STAMPED, engine=engine) as d:
        _send(d, ("ann", 1_000), ("ann", 65_000), ("ann", 2_000))  # 60000 + 10000 > 65000
        assert _finals(d) == [] and d.outputs("late") == []
        _send(d, ("ann", 70_000))
        assert _finals(d) == [("ann", 0, MIN, 2)]


class Sessions(StreamTask):
    sessions = Session(gap_ms=30 * MIN, key="user", aggregate=Collect("page"), on_result="emit")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if envelope.message.get("page"):
            self.sessions.add(envelope, collector, coordinator)

    def emit(self, result: WindowResult, collector: Any, coordinator: Any) -> None:
        collector.send(
            "mem.sessions",
            {"user": result.key, "from": result.start, "to": result.end, "pages": result.value},
        )


def test_rule34_a_bridging_message_merges_two_sessions(engine: str) -> None:
    # a lag of 30 minutes: the first session is still open when the bridging message comes
    config = {**STAMPED, "task.watermark.lag.ms": 30 * MIN}
    with TestDriver(Sessions, inputs={"in": 1}, config=config, engine=engine) as d:
        d.send("in", {"user": "ann", "ts": 0, "page": "a"})
        d.send("in", {"user": "ann", "ts": 50 * MIN, "page": "c"})  # 50 minutes later: a second session
        d.send("in", {"user": "ann", "ts": 25 * MIN, "page": "b"})  # within 30 of both: one session
        d.send("in", {"user": "ann", "ts": 26 * MIN})  # no page: not added
        d.end_input()
        assert d.outputs("sessions") == [{"user": "ann", "from": 0, "to": 50 * MIN, "pages": ["a", "c", "b"]}]


class Hops(StreamTask):
    w = Hopping(10_000, 4_000, offset_ms=1_000, output="mem.counts")


def test_rule34_hopping_windows_with_an_offset_and_before_the_epoch(engine: str) -> None:
    with TestDriver(Hops, inputs={"in": 1}, config=STAMPED, engine=engine) as d:
        d.send("in", {"ts": -2_000})  # in [-11000, -1000), [-7000, 3000), [-3000, 7000)
        d.send("in", {"ts": 4_000})  # in [-3000, 7000), [1000, 11000)
        d.end_input()
        assert _finals(d) == [
            (None, -11_000, -1_000, 1),
            (None, -7_000, 3_000, 1),
            (None, -3_000, 7_000, 2),
            (None, 1_000, 11_000, 1),
        ]


class Updates(StreamTask):
    w = Tumbling(MIN, key="user", aggregate=Sum("n"), emit="updates", output="mem.counts")


def test_rule35_updates_send_each_new_value_and_the_final_once(engine: str) -> None:
    with TestDriver(Updates, inputs={"in": 1}, config=STAMPED, engine=engine) as d:
        d.send("in", {"user": "ann", "ts": 1, "n": 2})
        d.send("in", {"user": "ann", "ts": 2, "n": 3})
        d.end_input()
        assert [(m["value"], m["final"]) for m in d.outputs("counts")] == [(2, False), (5, False), (5, True)]


class EndOfStream(PerUser):
    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.counts", "end of stream")


def test_rule37_the_end_of_input_closes_every_window_before_end_of_stream(engine: str) -> None:
    # a lag of 5 minutes: every window stays open until the end of the input
    config = {**STAMPED, "task.watermark.lag.ms": 5 * MIN}
    with TestDriver(EndOfStream, inputs={"in": 1}, config=config, engine=engine) as d:
        _send(d, ("bob", 5 * MIN), ("ann", MIN + 1), ("ann", 1))
        d.end_input()
        out = d.outputs("counts")
        # in order of end, then start, then key; end_of_stream after them
        assert [(m["key"], m["start"]) for m in out[:-1]] == [("ann", 0), ("ann", MIN), ("bob", 5 * MIN)]
        assert out[-1] == "end of stream"
        assert d.metrics()[0]["Partition 0"].late == 0  # 1 was not late: its window was open


class ByClock(StreamTask):
    w = Tumbling(MIN, time="processing", output="mem.counts")


def test_rule35_processing_time_windows_close_on_the_wall_clock(engine: str) -> None:
    # the driver's clock starts at 1_700_000_000 s: the minute [1699999980000, 1700000040000)
    with TestDriver(ByClock, inputs={"in": 1}, engine=engine) as d:
        d.send("in", {"any": 1})
        d.send("in", {"any": 2})
        d.advance(39_999)
        assert _finals(d) == []
        d.advance(1)
        assert _finals(d) == [(None, 1_699_999_980_000, 1_700_000_040_000, 2)]
        d.send("in", {"any": 3})
        d.advance(MIN)
        assert _finals(d)[-1] == (None, 1_700_000_040_000, 1_700_000_100_000, 1)


class AsyncWindows(AsyncStreamTask):
    w = Tumbling(MIN, key="user", output="mem.counts")

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.w.add(envelope, collector, coordinator)


def test_rule34_an_async_def_task_adds_to_its_windows(engine: str) -> None:
    with TestDriver(AsyncWindows, inputs={"in": 1}, config=STAMPED, engine=engine) as d:
        _send(d, ("ann", 1), ("ann", 2))
        d.end_input()
        assert _finals(d) == [("ann", 0, MIN, 2)]


def test_rule36_a_restart_resumes_open_windows_from_the_sqlite_store(engine: str, tmp_path: Path) -> None:
    clicks = [
        {"user": u, "ts": ts}
        for u, ts in [
            ("ann", 1),
            ("bob", 2),
            ("ann", MIN + 5),
            ("ann", 3),
            ("bob", MIN + 1),
            ("ann", 2 * MIN),
        ]
    ]
    db = tmp_path / "checkpoints.db"
    with TestDriver(
        PerUser,
        inputs={"in": [clicks[:4]]},
        config=STAMPED,
        engine=engine,
        checkpoints=SqliteCheckpointStore(db),
    ) as d:
        d.advance(60_000)  # a timer commit; close() commits again
        first = _finals(d)
    assert first == [("ann", 0, MIN, 1), ("bob", 0, MIN, 1)]  # ("ann", 3) came late
    with TestDriver(
        PerUser, inputs={"in": [clicks]}, config=STAMPED, engine=engine, checkpoints=SqliteCheckpointStore(db)
    ) as d:
        d.end_input()  # resumes after offset 3 with [60000, 120000) of ann open
        assert _finals(d) == [
            ("ann", MIN, 2 * MIN, 1),
            ("bob", MIN, 2 * MIN, 1),
            ("ann", 2 * MIN, 3 * MIN, 1),
        ]


class OffsetsOnly(MemoryCheckpointStore):
    """A checkpoint store that keeps offsets and no state."""

    state_get = CheckpointStore.state_get


class BadHop(StreamTask):
    w = Hopping(10, 20, output="mem.out")


@pytest.mark.parametrize(
    ("task", "store", "words"),
    [
        (BadHop, None, ["window BadHop.w", "step_ms 20 is larger than size_ms 10"]),
        (PerUser, OffsetsOnly(), ["keeps no state", "window PerUser.per_minute"]),
    ],
)
def test_rule34_a_job_with_bad_windows_is_refused_at_start_up(
    engine: str, task: type, store: Any, words: list[str]
) -> None:
    c = Container(task, inputs=["mem.in"], systems=[bounded([[]])], checkpoints=store, engine=engine)
    with pytest.raises(ConfigError) as e:
        c.run()
    for word in words:
        assert word in str(e.value)


class Undone(StreamTask):
    """Adds, then fails for messages marked boom; a Fold that changes its accumulator in place
    before it can fail (a message without "n")."""

    def _add(acc: list[int], e: Any) -> list[int]:
        acc[0] += 1
        acc[1] += e.message["n"]
        return acc

    w = Tumbling(MIN, key="user", aggregate=Fold([0, 0], _add), output="mem.counts")
    attempts: dict[int, int] = {}

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.w.add(envelope, collector, coordinator)
        m = envelope.message
        if m.get("boom"):
            raise ValueError("boom after the add")
        if m.get("flaky"):
            tries = self.attempts[m["ts"]] = self.attempts.get(m["ts"], 0) + 1
            if tries == 1:
                raise ValueError("flaky: fails the first time")


def test_rules39_40_a_skipped_or_retried_message_leaves_no_trace_in_a_window(engine: str) -> None:
    Undone.attempts = {}
    config = {**STAMPED, "task.error.policy": "skip", "task.error.retries": 1}
    with TestDriver(Undone, inputs={"in": 1}, config=config, engine=engine) as d:
        d.send("in", {"user": "ann", "ts": 1, "n": 1})
        d.send("in", {"user": "ann", "ts": 2, "n": 10, "boom": True})  # added, then failed: skipped
        d.send("in", {"user": "ann", "ts": 3})  # no "n": the fold fails half way through
        d.send("in", {"user": "ann", "ts": 4, "n": 100, "flaky": True})  # retried once: counted once
        d.send("in", {"user": "ann", "ts": 5, "n": 1000})
        d.end_input()
        assert _finals(d) == [("ann", 0, MIN, [3, 1101])]
        assert d.metrics()[0]["Partition 0"].skipped == 2


class Declared(StreamTask):
    """One window and no process: the engine calls the window's add itself."""

    w = Tumbling(MIN, key="user", aggregate=Agg(n=Count(), total=Sum("n")), output="mem.counts")


def test_rules39_40_a_declared_window_skips_a_message_it_cannot_fold(engine: str) -> None:
    config = {**STAMPED, "task.error.policy": "skip"}
    with TestDriver(Declared, inputs={"in": 1}, config=config, engine=engine) as d:
        d.send("in", {"user": "ann", "ts": 1, "n": 1})
        d.send("in", {"user": "ann", "ts": 2})  # no "n": skipped, nothing counted
        d.send("in", {"user": "ann", "ts": 3, "n": 5})
        # the sum fails after the count was folded (in place, in the compiled add): skipped,
        # its count not kept either
        d.send("in", {"user": "ann", "ts": 4, "n": "five"})
        d.send("in", {"user": "ann", "ts": 5, "n": 10})
        d.end_input()
        assert _finals(d) == [("ann", 0, MIN, {"n": 3, "total": 16})]
        assert d.metrics()[0]["Partition 0"].skipped == 2
