"""Event-time timers (SEMANTICS rule 38, with rules 35 and 37): ``context.schedule_event_time``
fires once the task's watermark reaches its time, in time order, as a barrier; without a
callback it runs ``on_event_time`` and survives restarts. Both engines."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    Container,
    MemoryCheckpointStore,
    MemorySystem,
    Scope,
    SqliteCheckpointStore,
    StreamTask,
)
from tailrace.errors import ConfigError

TS = {"task.timestamp.field": "ts"}


def run(engine: str, task: Any, partitions: list[list[Any]], store: Any = None, **config: Any) -> Any:
    system = MemorySystem().add_stream(
        "in", [[m if isinstance(m, dict) else {"ts": m} for m in p] for p in partitions]
    )
    container = Container(
        task,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=store if store is not None else MemoryCheckpointStore(),
        engine=engine,
        config={**TS, **config},
    )
    return container.run()


class Log(StreamTask):
    """Logs its messages (with the watermark each saw) and its timers; sets a durable timer
    at ``ts + 1500`` for messages with ``ts % 1000 == 0``."""

    log: list[Any] = []

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        ts = envelope.message["ts"]
        self.log.append(("msg", ts))
        if ts % 1000 == 0:
            self.context.schedule_event_time(ts, ts + 1500)

    def on_event_time(self, key: Any, when: int, collector: Any, coordinator: Any) -> None:
        self.log.append(("timer", key, when, self.context.watermark()))

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        self.log.append(("eos", self.context.watermark()))


def test_rule38_a_timer_fires_once_when_the_watermark_reaches_it_between_messages(engine: str) -> None:
    Log.log = []
    run(engine, Log, [list(range(0, 4000, 250))])
    log = Log.log
    # each timer runs right after the message that moved the watermark to its time, before
    # the next message (a barrier), once, with the watermark at its time
    assert log.index(("timer", 0, 1500, 1500)) == log.index(("msg", 1500)) + 1
    assert log.index(("timer", 1000, 2500, 2500)) == log.index(("msg", 2500)) + 1
    assert log.index(("timer", 2000, 3500, 3500)) == log.index(("msg", 3500)) + 1
    # rule 37: at the end the watermark is +infinity: the rest fire, in time order, before
    # end_of_stream
    assert log[-2:] == [("timer", 3000, 4500, math.inf), ("eos", math.inf)]
    assert [e for e in log if e[0] == "timer"] == sorted(
        (e for e in log if e[0] == "timer"), key=lambda e: e[2]
    )
    assert len([e for e in log if e[0] == "timer"]) == 4


def test_rule38_the_watermark_follows_messages_handed_to_the_task_not_read_ahead(engine: str) -> None:
    # all five are read in one poll: the watermark as read is 9000 at once, but a timer at
    # 2000 must not fire before the messages read with it that come before 9000's
    Log.log = []
    run(engine, Log, [[1000, 1200, 9000, 1300, 1400]], **{"task.watermark.lag.ms": 0})
    log = Log.log
    assert log[:4] == [("msg", 1000), ("msg", 1200), ("msg", 9000), ("timer", 1000, 2500, 9000)]
    assert log[4:] == [("msg", 1300), ("msg", 1400), ("timer", 9000, 10500, math.inf), ("eos", math.inf)]


def test_rule38_several_partitions_hold_the_watermark_at_their_minimum(engine: str) -> None:
    Log.log = []
    # one task, two input streams: its watermark is the slower one's
    system = MemorySystem().add_stream("a", [[{"ts": t} for t in (0, 1000, 2000, 3000, 4000)]])
    system.add_stream("b", [[{"ts": t} for t in (0, 100, 200)]])
    Container(
        Log,
        inputs=["mem.a", "mem.b"],
        systems=[system],
        checkpoints=MemoryCheckpointStore(),
        engine=engine,
        config=TS,
    ).run()
    timers = [e for e in Log.log if e[0] == "timer"]
    # b never reaches 1500 before it ends; after its end (drained) it counts as +infinity
    assert timers[0][:3] == ("timer", 0, 1500)
    assert timers[0][3] >= 1500
    assert [e[1] for e in timers] == [0, 1000, 2000, 3000, 4000]


class Cancels(StreamTask):
    fired: list[Any] = []

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        ts = envelope.message["ts"]
        if ts == 0:
            self.context.schedule_event_time("a", 500, self.fire)
            self.context.schedule_event_time("b", 600, self.fire)
            self.context.schedule_event_time("c", 700, self.fire)
        if ts == 100:
            assert self.context.cancel_event_time("b")
            assert not self.context.cancel_event_time("nope")
            self.context.schedule_event_time("c", 400, self.fire)  # replaced: earlier now

    def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
        self.fired.append((key, self.context.watermark()))


def test_rule38_cancel_and_replace(engine: str) -> None:
    Cancels.fired = []
    run(engine, Cancels, [[0, 100, 450, 650, 800]])
    assert Cancels.fired == [("c", 450), ("a", 650)]


class Slow(AsyncStreamTask):
    """Completes every message from another thread later; its timer must wait for them."""

    log: list[Any] = []

    def init(self, context: Any) -> None:
        self.context = context
        self.lock = threading.Lock()

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        ts = envelope.message["ts"]
        if ts == 0:
            self.context.schedule_event_time("t", 300, self.fire)

        def later() -> None:
            time.sleep(0.02)
            with self.lock:
                self.log.append(("done", ts))
            callback.complete()

        threading.Thread(target=later).start()

    def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
        with self.lock:
            self.log.append(("timer", key))


def test_rule38_the_timer_is_a_barrier_after_every_outstanding_message(engine: str) -> None:
    Slow.log = []
    run(engine, Slow, [[0, 100, 200, 300, 400, 500]], **{"task.max.concurrency": 4})
    log = Slow.log
    at = log.index(("timer", "t"))
    # every message handed out before the watermark reached 300 (0..300) completed first
    assert {("done", t) for t in (0, 100, 200, 300)} <= set(log[:at])
    assert len(log) == 7


def test_rule38_on_the_thread_pool(engine: str) -> None:
    Log.log = []
    run(engine, Log, [list(range(0, 4000, 250)), list(range(0, 4000, 250))], job_container_thread_pool_size=2)
    timers = [e for e in Log.log if e[0] == "timer"]
    assert sorted(e[1] for e in timers) == sorted([0, 1000, 2000, 3000] * 2)
    assert all(e[3] >= e[2] for e in timers)  # never before the watermark reached it


class Durable(StreamTask):
    log: list[Any] = []

    def init(self, context: Any) -> None:
        self.context = context

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        self.log.append(("msg", m["ts"]))
        if "timer" in m:
            self.context.schedule_event_time(m["timer"], m["at"])
        if m.get("stop"):
            coordinator.commit(Scope.CURRENT_TASK)
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    def on_event_time(self, key: Any, when: int, collector: Any, coordinator: Any) -> None:
        self.log.append(("timer", key, when))


@pytest.mark.parametrize("checkpoints", ["memory", "sqlite"])
def test_rule38_a_timer_without_callback_survives_a_restart(
    engine: str, checkpoints: str, tmp_path: Any
) -> None:
    store: Any = (
        MemoryCheckpointStore() if checkpoints == "memory" else SqliteCheckpointStore(tmp_path / "c.db")
    )
    system = MemorySystem().add_live_stream("in", 1)

    def go() -> None:
        Container(
            Durable, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine, config=TS
        ).run()

    Durable.log = []
    system.append("in", 0, {"ts": 0, "timer": "x", "at": 5000})
    system.append("in", 0, {"ts": 100, "timer": "y", "at": 200})
    system.append("in", 0, {"ts": 300})
    system.append("in", 0, {"ts": 350, "stop": True})
    go()
    assert Durable.log == [("msg", 0), ("msg", 100), ("msg", 300), ("timer", "y", 200), ("msg", 350)]
    # restarted: "x" (committed) is still there, "y" fired and is gone
    Durable.log = []
    system.append("in", 0, {"ts": 6000})
    system.append("in", 0, {"ts": 6100, "stop": True})
    go()
    assert Durable.log == [("msg", 6000), ("timer", "x", 5000), ("msg", 6100)]


def test_rule38_on_event_time_needs_a_checkpoint_store_that_keeps_state(engine: str) -> None:
    from tailrace.interfaces import CheckpointStore

    class NoState(CheckpointStore):
        def open(self, job: str) -> None: ...
        def load(self, task: str) -> dict[Any, Any]:
            return {}

        def write(self, task: str, offsets: Any, state: Any = None, **kw: Any) -> None: ...
        def close(self) -> None: ...

    with pytest.raises(ConfigError, match=r"keeps no state.*tailrace\.event-timers"):
        run(engine, Durable, [[0]], store=NoState())


def test_rule38_a_timer_callback_error_names_the_timer(engine: str) -> None:
    class Raises(StreamTask):
        def init(self, context: Any) -> None:
            context.schedule_event_time("boom", 100, self.fire)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            raise ValueError("bad timer")

    from tailrace.errors import TaskError

    with pytest.raises(TaskError, match="event-time timer 'boom'"):
        run(engine, Raises, [[0, 200, 300]])


def test_rule38_when_must_be_a_number(engine: str) -> None:
    class Bad(StreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.context.schedule_event_time("k", "soon", lambda *a: None)

    from tailrace.errors import TaskError

    with pytest.raises(TaskError, match="when_ms must be an int"):
        run(engine, Bad, [[0]])


class SystemTime(StreamTask):
    """Windows on the system's own timestamps (no field): its watermark is committed too."""

    from tailrace.windows import Count as _Count
    from tailrace.windows import Tumbling as _Tumbling

    w = _Tumbling(1000, aggregate=_Count(), output="mem.counts")
    seen: list[Any] = []

    def init(self, context: Any) -> None:
        self.context = context
        self.seen.append(("init", context.watermark()))

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.w.add(envelope, collector, coordinator)
        if envelope.message.get("stop"):
            coordinator.commit(Scope.CURRENT_TASK)
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)


def test_rule33_a_task_with_windows_on_system_time_resumes_from_its_committed_watermark(
    engine: str, tmp_path: Any
) -> None:
    # a message that was late before a restart must not join a window after it (rule 36)
    store = SqliteCheckpointStore(tmp_path / "c.db")
    system = MemorySystem().add_live_stream("in", 1)

    def go() -> None:
        Container(SystemTime, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine).run()

    SystemTime.seen = []
    system.append("in", 0, {"n": 0}, timestamp=5_000)
    system.append("in", 0, {"n": 1, "stop": True}, timestamp=7_000)
    go()
    system.append("in", 0, {"n": 2}, timestamp=100)  # late: its window [0, 1000) passed
    system.append("in", 0, {"n": 3, "stop": True}, timestamp=7_100)
    go()
    assert SystemTime.seen == [("init", -math.inf), ("init", 7_000)]
    assert system.messages("counts") == [
        {"key": None, "start": 5_000, "end": 6_000, "value": 1, "final": True}
    ]
