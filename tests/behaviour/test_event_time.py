"""Event timestamps (SEMANTICS rule 32): from a message field in a unit, the task's
``timestamp`` method, the system's own record time, or ingestion time; an unreadable one is a
bad message (rule 39) under task.error.policy. Both engines, bounded memory streams (the C
loop's lazy ranges) and live ones (its envelopes from ``poll``)."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from tailrace import (
    ConfigError,
    Container,
    Envelope,
    MemoryCheckpointStore,
    MemorySystem,
    Scope,
    SqliteCheckpointStore,
    StreamTask,
    TaskError,
)
from tailrace._core import entry_envelope
from tailrace.testing import TestDriver
from tailrace.timestamps import TimestampUnreadable

from .helpers import bounded, ssp

JOB = "tailrace-job"


class Stamps(StreamTask):
    """Sends each message's (n, timestamp)."""

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        collector.send("mem.out", [m["n"] if isinstance(m, dict) else m, envelope.timestamp])


def _run(engine: str, task: Any, partitions: list[list[Any]], **config: Any) -> tuple[Any, Any, Any]:
    system = bounded(partitions)
    store = MemoryCheckpointStore()
    c = Container(task, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine, **config)
    return c.run(), system, store


_EDGES = [0, 2**30 - 1, 2**30, -(2**30), 2**60 - 1, 2**60, -(2**60), 2**62, 2**63 - 1, -(2**63) + 1]


@pytest.mark.parametrize(
    ("unit", "values", "expected"),
    [
        ("ms", [1_700_000_000_123, 5, -7], [1_700_000_000_123, 5, -7]),
        # ints of every size the compiled reader converts inline (one and two 30-bit digits)
        # and past it (three), to the int64 bounds
        ("ms", _EDGES, _EDGES),
        ("ms", [1.9, -1.5], [1, -2]),  # floor, as for every unit
        ("s", [1_700_000_000, 1.5, 2.0009], [1_700_000_000_000, 1500, 2000]),
        ("us", [1_500_999, -1], [1500, -1]),
        ("ns", [1_500_999_999, 2.5e9], [1500, 2500]),
        (
            "iso8601",
            ["1970-01-01T00:00:01.5Z", "2023-11-14T22:13:20+01:00", "1970-01-02"],
            [1500, 1_699_996_400_000, 86_400_000],
        ),
    ],
)
def test_rule32_timestamp_from_a_message_field_in_its_unit(
    engine: str, unit: str, values: list[Any], expected: list[int]
) -> None:
    messages = [{"n": i, "at": v} for i, v in enumerate(values)]
    _, system, _ = _run(engine, Stamps, [messages], task_timestamp_field="at", task_timestamp_unit=unit)
    assert system.messages("out") == [[i, ms] for i, ms in enumerate(expected)]


class MethodStamps(Stamps):
    def timestamp(self, envelope: Any) -> int:
        return 1000 * envelope.message["n"] + envelope.partition


def test_rule32_timestamp_from_the_task_method(engine: str) -> None:
    _, system, _ = _run(engine, MethodStamps, [[{"n": 1}, {"n": 2}], [{"n": 3}]])
    assert sorted(system.messages("out")) == [[1, 1000], [2, 2000], [3, 3001]]


def test_rule32_a_configured_field_wins_over_the_method(engine: str) -> None:
    _, system, _ = _run(engine, MethodStamps, [[{"n": 1, "t": 42}]], task_timestamp_field="t")
    assert system.messages("out") == [[1, 42]]


@pytest.mark.parametrize("live", [False, True])
def test_rule32_ingestion_time_is_the_clock_when_read(engine: str, live: bool) -> None:
    # the driver's virtual clock: each message gets the time the engine read it
    with TestDriver(Stamps, inputs={"in": 1}, engine=engine) as d:  # type: ignore[arg-type]
        t0 = round(d.now * 1000)
        d.send("in", "a")
        d.advance(1500)
        d.send_all("in", ["b", "c"])
        assert d.outputs("out") == [["a", t0], ["b", t0 + 1500], ["c", t0 + 1500]]
    if not live:
        # a bounded stream read before the run: the run's wall clock, an int of ms
        _, system, _ = _run(engine, Stamps, [["x", "y"]])
        (x, tx), (y, ty) = system.messages("out")
        assert (x, y) == ("x", "y") and isinstance(tx, int) and tx == ty and tx > 1_600_000_000_000


def test_rule32_system_time_of_a_redis_entry_is_its_id() -> None:
    e = entry_envelope("redis", "s", 0, "1700000000123-4", None, "m")
    assert e.timestamp == 1_700_000_000_123 and e.offset == "1700000000123-4"
    assert entry_envelope("redis", "s", 0, "not-an-id", None, "m").timestamp is None


def test_envelope_timestamp_is_an_int_and_survives_pickling() -> None:
    e = Envelope("mem", "in", 0, 3, None, "m", timestamp=1234)
    assert e.timestamp == 1234 and pickle.loads(pickle.dumps(e)).timestamp == 1234
    assert Envelope("mem", "in", 0, 3, None, "m").timestamp is None  # read by no engine yet
    with pytest.raises(TypeError, match="timestamp must be an int"):
        Envelope("mem", "in", 0, 3, None, "m", timestamp=1.5)  # type: ignore[arg-type]


BAD = [{"n": 0, "at": 10}, {"n": 1}, {"n": 2, "at": "soon"}, {"n": 3, "at": True}, {"n": 4, "at": 40}]


def test_rule32_an_unreadable_timestamp_fails_naming_partition_and_offset(engine: str) -> None:
    # rule 39, policy fail: the container stops; what came before is committed (rule 40)
    with pytest.raises(TaskError) as info:
        _run(engine, Stamps, [BAD], task_timestamp_field="at")
    e = info.value
    assert (e.phase, e.ssp, e.offset) == ("timestamp", ssp(0), 1)
    assert "message field 'at' (ms)" in str(e) and "has no field 'at'" in str(e)
    assert isinstance(e.original, TimestampUnreadable)


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_rule32_unreadable_timestamps_are_skipped(engine: str, ordering: str) -> None:
    result, system, store = _run(
        engine, Stamps, [BAD], task_timestamp_field="at", task_error_policy="skip", task_ordering=ordering
    )
    assert system.messages("out") == [[0, 10], [4, 40]]
    assert result.tasks["Partition 0"].skipped == 3
    assert store.committed(JOB)[ssp(0)] == 4


def test_rule32_unreadable_timestamps_are_dead_lettered(engine: str) -> None:
    result, system, _ = _run(
        engine,
        Stamps,
        [BAD],
        task_timestamp_field="at",
        task_error_policy="dead-letter",
        task_error_stream="mem.dead",
    )
    assert system.messages("out") == [[0, 10], [4, 40]]
    letters = system.messages("dead")
    assert [(d["offset"], d["value"]) for d in letters] == [(1, BAD[1]), (2, BAD[2]), (3, BAD[3])]
    assert all(d["error"]["type"].endswith("TaskError") for d in letters)
    assert "failed in timestamp" in letters[0]["error"]["message"]
    assert "expected a number of ms, got 'soon'" in letters[1]["error"]["message"]
    assert result.tasks["Partition 0"].dead_lettered == 3


class RaisingStamps(Stamps):
    def timestamp(self, envelope: Any) -> int:
        if envelope.message["n"] == 1:
            raise KeyError("when")
        if envelope.message["n"] == 2:
            return "later"  # type: ignore[return-value]
        return 7


def test_rule32_a_raising_or_wrong_timestamp_method_makes_a_bad_message(engine: str) -> None:
    result, system, _ = _run(engine, RaisingStamps, [[{"n": i} for i in range(4)]], task_error_policy="skip")
    assert system.messages("out") == [[0, 7], [3, 7]]
    assert result.tasks["Partition 0"].skipped == 2


def test_rule32_a_live_stream_stamps_from_the_field(engine: str) -> None:
    # the driver's streams are read with poll (the C loop's eager envelopes)
    config = {"task.timestamp.field": "at", "task.error.policy": "skip"}
    with TestDriver(Stamps, inputs={"in": 1}, config=config, engine=engine) as d:  # type: ignore[arg-type]
        d.send_all("in", [{"n": 0, "at": 5}, {"n": 1}, {"n": 2, "at": 3}])
        assert d.outputs("out") == [[0, 5], [2, 3]]


@pytest.mark.parametrize(
    ("config", "allowed"),
    [
        ({"task.timestamp.unit": "minutes"}, "ms, s, us, ns, iso8601"),
        ({"task.timestamp.field": 3}, "field"),
        ({"task.timestamp.unit": "s"}, "unless task.timestamp.field names a field"),
    ],
)
def test_timestamp_config_is_checked(config: dict[str, Any], allowed: str) -> None:
    (key,) = config
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as info:
        Container(Stamps, inputs=["mem.in"], systems=[bounded([[1]])], config=config)
    assert allowed in str(info.value)


# -- the event-time watermark (rules 33, 37) ---------------------------------------


class Marks(StreamTask):
    """Sends (stream, n, its timestamp, the task's watermark when it is processed)."""

    def init(self, context: Any) -> None:
        self.context = context
        self.first = context.watermark()

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        m = envelope.message
        collector.send("mem.out", [envelope.stream, m["n"], envelope.timestamp, self.context.watermark()])

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", ["eos", self.first, None, self.context.watermark()])


def _watermark(d: TestDriver) -> Any:
    return d.metrics()[0]["Partition 0"].event_time_watermark


def test_rule33_out_of_order_within_the_lag(engine: str) -> None:
    # one message read at a time: the watermark is the largest timestamp so far minus the lag
    config = {"task.timestamp.field": "t", "task.watermark.lag.ms": 1000}
    with TestDriver(Marks, inputs={"in": 1}, config=config, engine=engine) as d:  # type: ignore[arg-type]
        assert _watermark(d) == -math.inf
        for n, t in enumerate([1000, 3000, 2500, 2000, 4000]):
            d.send("in", {"n": n, "t": t})
        assert [(o[2], o[3]) for o in d.outputs("out")] == [
            (1000, 0),
            (3000, 2000),
            (2500, 2000),  # out of order, within the lag: the watermark stays
            (2000, 2000),
            (4000, 3000),
        ]
        m = d.metrics()[0]["Partition 0"]
        assert m.event_time_watermark == 3000
        assert m.event_time_lag_ms == round(d.now * 1000) - 3000


def test_rule33_an_idle_partition_is_released_and_rejoins_without_moving_it_back(engine: str) -> None:
    # one task reading a[0] and b[0]; b stays silent, then comes back behind
    config = {"task.timestamp.field": "t", "task.watermark.idle.ms": 1000}
    with TestDriver(Marks, inputs={"a": 1, "b": 1}, config=config, engine=engine) as d:  # type: ignore[arg-type]
        d.send("a", {"n": 0, "t": 5000})
        assert _watermark(d) == -math.inf  # b never read, not idle yet: it holds the watermark
        d.advance(999)
        assert _watermark(d) == -math.inf
        d.advance(501)  # both idle now (b since the start, a since its empty poll)
        assert _watermark(d) == 5000  # every partition idle: the largest of theirs
        d.send("a", {"n": 1, "t": 6000})
        assert _watermark(d) == 6000  # b still idle: skipped
        d.send("b", {"n": 2, "t": 2000})  # b rejoins behind the watermark
        d.send("a", {"n": 3, "t": 7000})
        assert _watermark(d) == 6000  # never backwards (b holds the minimum at 2000)
        d.send("b", {"n": 4, "t": 8000})
        assert _watermark(d) == 7000
        assert [o[3] for o in d.outputs("out")] == [-math.inf, 6000, 6000, 6000, 7000]


def test_rule33_idle_off_a_silent_partition_holds_the_watermark(engine: str) -> None:
    config = {"task.timestamp.field": "t", "task.watermark.idle.ms": 0}
    with TestDriver(Marks, inputs={"a": 1, "b": 1}, config=config, engine=engine) as d:  # type: ignore[arg-type]
        d.send("a", {"n": 0, "t": 5000})
        d.advance(3_600_000)
        assert _watermark(d) == -math.inf


def test_rule37_end_of_input_is_plus_infinity_before_end_of_stream(engine: str) -> None:
    msgs = [[{"n": i, "t": 100 * i} for i in range(5)], [{"n": 9, "t": 50}]]
    result, system, _ = _run(engine, Marks, msgs, task_timestamp_field="t", stores=[])
    # one task per partition: each one's end_of_stream sees +infinity; init saw none yet
    eos = [o for o in system.messages("out") if o[0] == "eos"]
    assert eos == [["eos", -math.inf, None, math.inf]] * 2
    for m in result.tasks.values():
        assert (m.event_time_watermark, m.event_time_lag_ms) == (math.inf, 0.0)


def test_rule33_a_bad_message_does_not_move_the_watermark(engine: str) -> None:
    config = {"task.timestamp.field": "t", "task.error.policy": "skip"}
    with TestDriver(Marks, inputs={"in": 1}, config=config, engine=engine) as d:  # type: ignore[arg-type]
        d.send_all("in", [{"n": 0, "t": 10}, {"n": 1, "t": "late"}])
        assert _watermark(d) == 10
        assert d.metrics()[0]["Partition 0"].skipped == 1


def test_rule33_ingestion_time_watermark_follows_the_clock(engine: str) -> None:
    with TestDriver(Stamps, inputs={"in": 1}, engine=engine) as d:  # type: ignore[arg-type]
        d.send("in", "a")
        t0 = round(d.now * 1000)
        assert _watermark(d) == t0
        d.advance(250)
        d.send("in", "b")
        assert _watermark(d) == t0 + 250


@pytest.mark.parametrize(
    ("key", "value"), [("task.watermark.lag.ms", -1), ("task.watermark.idle.ms", "soon")]
)
def test_watermark_config_is_checked(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        Container(Stamps, inputs=["mem.in"], systems=[bounded([[1]])], config={key: value})


class Resumes(Marks):
    """Marks, stopping the container at the message marked ``stop``."""

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        super().process(envelope, collector, coordinator)
        if envelope.message.get("stop"):
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)


@pytest.mark.parametrize("checkpoints", ["memory", "sqlite"])
def test_rule33_resumes_from_at_least_the_committed_watermark(
    engine: str, checkpoints: str, tmp_path: Any
) -> None:
    store: Any = (
        MemoryCheckpointStore() if checkpoints == "memory" else SqliteCheckpointStore(tmp_path / "c.db")
    )
    system = MemorySystem().add_live_stream("in", 1)
    config = {"task.timestamp.field": "t", "task.watermark.lag.ms": 100}

    def run() -> None:
        c = Container(
            Resumes, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine, config=config
        )
        c.run()

    for n, t in enumerate([1000, 5000, 3000]):
        system.append("in", 0, {"n": n, "t": t, "stop": n == 2})
    run()
    # the watermark follows the messages handed to the task, not those read ahead with them
    # in one poll (rules 33, 35)
    assert [o[3] for o in system.messages("out")] == [900, 4900, 4900]
    # restarted: it resumes from 4900 (committed with offset 2); a message behind it cannot
    # move it back
    system.append("in", 0, {"n": 3, "t": 2000, "stop": True})
    run()
    assert system.messages("out")[3:] == [["in", 3, 2000, 4900]]


def test_rule33_the_watermark_read_in_process_counts_every_message_handed_over(engine: str) -> None:
    # one task reading two streams of bounded input, timestamps out of order: the C loop
    # hands them over in runs of many messages and recomputes the watermark only when it is
    # read (tr_loop_event_seen_run); what process reads must be what a recompute after every
    # message gives: the largest min(largest timestamp of each input) - lag so far
    import random

    rng = random.Random(7)
    lag = 50
    system = MemorySystem()
    for stream in ("a", "b"):
        system.add_stream(stream, [[{"n": i, "t": 10 * i + rng.randrange(0, 400)} for i in range(400)]])
    c = Container(
        Marks,
        inputs=["mem.a", "mem.b"],
        systems=[system],
        checkpoints=MemoryCheckpointStore(),
        engine=engine,
        task_timestamp_field="t",
        task_watermark_lag_ms=lag,
        task_watermark_idle_ms=0,
    )
    result = c.run()
    rows = [o for o in system.messages("out") if o[0] != "eos"]
    assert len(rows) == 800
    assert {o[0] for o in rows[:20]} == {"a", "b"}  # the run interleaves the inputs
    seen = {"a": -math.inf, "b": -math.inf}
    left = {"a": 400, "b": 400}
    expected = -math.inf
    for stream, n, t, wm in rows:
        seen[stream] = max(seen[stream], t)
        expected = max(expected, min(seen.values()) - lag)
        assert wm == expected, (stream, n, t, wm, expected)
        left[stream] -= 1
        if not left[stream]:
            break  # past an input's last message its end counts once its calls are done
    assert all(m.event_time_watermark == math.inf for m in result.tasks.values())
