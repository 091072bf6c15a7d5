"""The window runtime of ``tailrace.windows`` on its own (SEMANTICS rules 34-37): assignment,
session merging, aggregates, close order and lateness, against a batch computation.

A small driver stands in for the engine: it moves the watermark (or the wall clock) and
fires the runtime's one timer when it falls due, as a barrier would. The state is a real
``KeyValueStore`` over a real ``MemoryCheckpointStore``; a restart commits it and binds a
new task to the committed state. Job-level tests (both engines) are in
tests/behaviour/test_windows.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace import ConfigError, MemoryCheckpointStore, StreamTask
from tailrace.windows import (
    Collect,
    Fold,
    Hopping,
    Max,
    Mean,
    Min,
    Session,
    Sum,
    Tumbling,
    Window,
    WindowResult,
    _order,
    bind,
    check_windows,
    declared_windows,
    store_specs,
)

TASK = "Partition 0"


class Out:
    """A collector: what was sent, by stream."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, Any]] = []

    def send(self, stream: str, message: Any, key: Any = None, partition: int | None = None) -> None:
        self.sent.append((stream, message, key))

    def on(self, stream: str) -> list[Any]:
        return [m for s, m, _ in self.sent if s == stream]


class Driver:
    """The engine's part: the watermark, the wall clock, one timer per key, the stores."""

    def __init__(self, task_cls: type, backend: MemoryCheckpointStore | None = None) -> None:
        from tailrace.stores import TaskStores

        self.backend = backend or MemoryCheckpointStore()
        self.backend.open("job")
        self.stores = TaskStores(TASK, store_specs(check_windows(task_cls)), self.backend)
        self.task_name = TASK
        self.wm: float = -math.inf
        self.clock = 0.0
        self.event_timers: dict[Any, tuple[int, Callable[..., Any]]] = {}
        self.timers: dict[Any, tuple[float, Callable[..., Any]]] = {}
        self.out = Out()
        self.fires: list[list[Any]] = []  # the finals of each timer run
        self.task = task_cls()
        self.runtimes = bind(self.task, self)

    # the TaskContext surface the runtime uses
    def store(self, name: str) -> Any:
        return self.stores.get(name)

    def watermark(self) -> float:
        return self.wm

    def now(self) -> float:
        return self.clock

    def schedule_event_time(self, key: Any, when: int, fn: Callable[..., Any]) -> None:
        assert type(when) is int
        self.event_timers[key] = (when, fn)

    def cancel_event_time(self, key: Any) -> bool:
        return self.event_timers.pop(key, None) is not None

    def schedule(self, key: Any, when: float, fn: Callable[..., Any]) -> None:
        self.timers[key] = (when, fn)

    def cancel(self, key: Any) -> bool:
        return self.timers.pop(key, None) is not None

    # what the test does
    def send(self, window: str, ts: int, message: Any = None, key: Any = None) -> bool:
        envelope = SimpleNamespace(message=message if message is not None else {}, key=key, timestamp=ts)
        return bool(getattr(self.task, window).add(envelope, self.out, None))

    def _run_due(self, due: Callable[[], list[tuple[Any, Any, Callable[..., Any]]]]) -> None:
        while True:
            ready = sorted(due(), key=lambda t: t[0])
            if not ready:
                return
            _, key, fn = ready[0]
            self.event_timers.pop(key, None)
            self.timers.pop(key, None)
            before = len(self.out.sent)
            fn(key, self.out, None)
            self.fires.append([m for _, m, _ in self.out.sent[before:]])

    def advance(self, wm: float) -> None:
        """The watermark moves to ``wm`` (never back); due event-time timers fire."""
        self.wm = max(self.wm, wm)
        self._run_due(lambda: [(w, k, f) for k, (w, f) in self.event_timers.items() if w <= self.wm])

    def tick(self, seconds: float) -> None:
        self.clock += seconds
        self._run_due(lambda: [(w, k, f) for k, (w, f) in self.timers.items() if w <= self.clock])

    def commit(self) -> None:
        self.backend.write(TASK, {}, self.stores.begin_commit())
        self.stores.end_commit(True)

    def restart(self) -> Driver:
        """A new task over the committed state (the uncommitted state is lost)."""
        d = Driver(type(self.task), self.backend)
        d.wm = self.wm
        d.clock = self.clock
        return d

    def finals(self, stream: str = "out") -> list[tuple[Any, int, int, Any]]:
        return [(m["key"], m["start"], m["end"], m["value"]) for m in self.out.on(stream) if m["final"]]


# -- assignment (rule 34) ------------------------------------------------------------------------
def test_rule34_tumbling_windows_align_to_the_epoch_plus_offset_before_it_too() -> None:
    assert Tumbling(60_000).starts(0) == [0]
    assert Tumbling(60_000).starts(59_999) == [0]
    assert Tumbling(60_000).starts(60_000) == [60_000]
    assert Tumbling(60_000).starts(-1) == [-60_000]  # floor division: before the epoch
    assert Tumbling(60_000, offset_ms=15_000).starts(10_000) == [-45_000]
    assert Tumbling(60_000, offset_ms=15_000).starts(15_000) == [15_000]
    assert Tumbling(10, offset_ms=-3).starts(-14) == [-23]


@pytest.mark.parametrize(
    ("size", "step", "offset"), [(10, 5, 0), (10, 3, 0), (7, 7, 2), (10, 4, -3), (5, 1, 0)]
)
def test_rule34_hopping_membership_is_every_window_that_holds_the_timestamp(
    size: int, step: int, offset: int
) -> None:
    w = Hopping(size, step, offset_ms=offset)
    for ts in range(-40, 40):
        brute = [s for s in range(-200, 200) if (s - offset) % step == 0 and s <= ts < s + size]
        assert w.starts(ts) == brute, ts


class _Bad(StreamTask):
    hop = Hopping(10, 11, output="out")


@pytest.mark.parametrize(
    ("window", "words"),
    [
        (Hopping(10, 11, output="out"), ["Bad.w", "step_ms 11 is larger than size_ms 10"]),
        (Tumbling(0, output="out"), ["size_ms is 0"]),
        (Session(100, aggregate=Fold(0, lambda a, e: a + 1), output="out"), ["cannot merge"]),
        (Tumbling(10), ["exactly one of output= and on_result="]),
        (Tumbling(10, output="o", on_result="emit"), ["exactly one"]),
        (Tumbling(10, on_result="nope"), ["'nope'", "no method of Bad"]),
        (Tumbling(10, output="o", emit="sometimes"), ["emit is 'sometimes'"]),
        (Tumbling(10, output="o", time="ingest"), ["time is 'ingest'"]),
        (Tumbling(10, output="o", grace_ms=-1), ["grace_ms is -1"]),
        (Session(0, output="o"), ["gap_ms is 0"]),
    ],
)
def test_rule34_bad_declarations_are_refused_naming_the_window(window: Window, words: list[str]) -> None:
    Bad = type("Bad", (StreamTask,), {"w": window})
    with pytest.raises(ConfigError) as e:
        check_windows(Bad)
    for word in words:
        assert word in str(e.value)


def test_an_unbound_window_says_how_it_is_bound() -> None:
    class T(StreamTask):
        w = Tumbling(10, output="o")

    assert isinstance(T.w, Tumbling)
    with pytest.raises(RuntimeError, match=r"T\.w is not bound"):
        T().w  # noqa: B018
    assert list(declared_windows(T)) == ["w"]


# -- aggregates ----------------------------------------------------------------------------------
class Aggs(StreamTask):
    count = Tumbling(10, output="count")
    total = Tumbling(10, aggregate=Sum("n"), output="sum")
    low = Tumbling(10, aggregate=Min("n"), output="min")
    high = Tumbling(10, aggregate=Max(lambda e: e.message["n"] * 2), output="max")
    mean = Tumbling(10, aggregate=Mean("n"), output="mean")
    seen = Tumbling(10, aggregate=Collect("n"), output="collect")
    whole = Tumbling(10, aggregate=Collect(), output="whole")
    fold = Tumbling(
        10,
        aggregate=Fold(
            {"n": 0, "odd": []},
            lambda a, e: {"n": a["n"] + 1, "odd": a["odd"] + [e.message["n"]] * (e.message["n"] % 2)},
            result=lambda a: [a["n"], a["odd"]],
        ),
        output="fold",
    )


def test_every_builtin_aggregate_and_a_fold() -> None:
    d = Driver(Aggs)
    for n, ts in [(3, 1), (5, 2), (4, 11), (1, 5)]:
        for w in declared_windows(Aggs):
            d.send(w, ts, {"n": n})
    d.advance(math.inf)

    def values(stream: str) -> list[Any]:
        return [(m["start"], m["value"]) for m in d.out.on(stream)]

    assert values("count") == [(0, 3), (10, 1)]
    assert values("sum") == [(0, 9), (10, 4)]
    assert values("min") == [(0, 1), (10, 4)]
    assert values("max") == [(0, 10), (10, 8)]
    assert values("mean") == [(0, 3.0), (10, 4.0)]
    assert values("collect") == [(0, [3, 5, 1]), (10, [4])]
    assert values("whole") == [(0, [{"n": 3}, {"n": 5}, {"n": 1}]), (10, [{"n": 4}])]
    assert values("fold") == [(0, [3, [3, 5, 1]]), (10, [1, []])]  # the initial value is copied


def test_a_missing_field_names_the_window_and_the_field() -> None:
    class T(StreamTask):
        w = Tumbling(10, key="user", output="o")

    d = Driver(T)
    with pytest.raises(KeyError, match="no field 'user'") as e:
        d.send("w", 1, {"usr": "a"})
    assert any("T.w" in note for note in e.value.__notes__)


# -- closing (rule 35) ---------------------------------------------------------------------------
class PerKey(StreamTask):
    w = Tumbling(10, key="k", output="out", late_output="late")


def test_rule35_out_of_order_within_the_watermark_joins_its_window() -> None:
    d = Driver(PerKey)
    d.send("w", 7, {"k": "a"})
    d.advance(5)
    assert d.send("w", 2, {"k": "a"})  # older than the newest, its window still open
    d.advance(9)
    assert d.finals() == []
    d.advance(10)  # the watermark reaches the end: closed
    assert d.finals() == [("a", 0, 10, 2)]


def test_rule35_a_late_message_never_changes_a_closed_window_is_counted_and_sent_late() -> None:
    d = Driver(PerKey)
    d.send("w", 3, {"k": "a"})
    d.advance(12)
    assert d.finals() == [("a", 0, 10, 1)]
    assert not d.send("w", 4, {"k": "a"})
    assert d.runtimes[0].late == 1
    assert d.out.on("late") == [
        {"message": {"k": "a"}, "key": "a", "timestamp": 4, "windows": [[0, 10]], "watermark": 12}
    ]
    d.advance(math.inf)
    assert d.finals() == [("a", 0, 10, 1)]  # emitted once, unchanged
    assert list(d.store("tailrace.window.w").items()) == []


def test_rule35_grace_keeps_a_window_open_past_its_end() -> None:
    class T(StreamTask):
        w = Tumbling(10, grace_ms=5, output="out", late_output="late")

    d = Driver(T)
    d.send("w", 1)
    d.advance(12)
    assert d.send("w", 9)  # end 10 + grace 5 > 12: still open
    d.advance(14)
    assert d.finals() == []
    d.advance(15)
    assert d.finals() == [(None, 0, 10, 2)]
    assert not d.send("w", 9)


def test_rule35_hopping_late_for_some_windows_joins_the_open_ones_only() -> None:
    class T(StreamTask):
        w = Hopping(10, 5, output="out", late_output="late")

    d = Driver(T)
    d.send("w", 1)  # windows [-5, 5) and [0, 10)
    d.advance(6)  # closes [-5, 5)
    assert d.finals() == [(None, -5, 5, 1)]
    assert d.send("w", 4)  # [-5, 5) is closed, [0, 10) is not: joins [0, 10) only, not late
    assert d.out.on("late") == []
    d.advance(math.inf)
    assert d.finals() == [(None, -5, 5, 1), (None, 0, 10, 2)]


def test_rule35_windows_closed_by_one_move_emit_by_end_then_start_then_key() -> None:
    class T(StreamTask):
        w = Hopping(20, 10, key="k", output="out")

    d = Driver(T)
    for k, ts in [("b", 15), (2, 15), ("a", 15), (None, 25), ("a", 5)]:
        d.send("w", ts, {"k": k})
    d.advance(math.inf)
    assert [(k, s, e) for k, s, e, _ in d.finals()] == [
        ("a", -10, 10),
        (2, 0, 20),  # keys of mixed types in one fixed order: None, numbers, strings
        ("a", 0, 20),
        ("b", 0, 20),
        (None, 10, 30),
        (2, 10, 30),
        ("a", 10, 30),
        ("b", 10, 30),
        (None, 20, 40),
    ]
    assert len(d.fires) == 1 and len(d.fires[0]) == 9


def test_rule35_a_window_that_held_no_message_emits_nothing_and_state_is_dropped() -> None:
    d = Driver(PerKey)
    d.send("w", 35, {"k": "a"})
    d.advance(100)
    assert d.finals() == [("a", 30, 40, 1)]  # no window before or after it
    d.commit()
    assert d.backend.state(TASK, "tailrace.window.w", "job") == {}


def test_rule35_updates_emit_each_new_value_then_the_final_once() -> None:
    class T(StreamTask):
        w = Tumbling(10, key="k", aggregate=Sum("n"), emit="updates", output="out")

    d = Driver(T)
    d.send("w", 1, {"k": "a", "n": 2})
    d.send("w", 2, {"k": "a", "n": 3})
    d.advance(10)
    assert [(m["value"], m["final"]) for m in d.out.on("out")] == [(2, False), (5, False), (5, True)]


def test_rule35_on_result_calls_the_task_method() -> None:
    class T(StreamTask):
        w = Session(5, key="k", aggregate=Collect("p"), on_result="emit")

        def emit(self, result: WindowResult, collector: Any, coordinator: Any) -> None:
            collector.send("mine", [result.key, result.start, result.end, result.value, result.final])

    d = Driver(T)
    d.send("w", 1, {"k": "a", "p": "x"})
    d.send("w", 4, {"k": "a", "p": "y"})
    d.advance(math.inf)
    assert d.out.on("mine") == [["a", 1, 4, ["x", "y"], True]]


# -- sessions ------------------------------------------------------------------------------------
class Sessions(StreamTask):
    s = Session(10, key="k", aggregate=Collect("n"), output="out", late_output="late")


def test_rule34_a_bridging_message_merges_two_sessions() -> None:
    d = Driver(Sessions)
    d.send("s", 0, {"k": "a", "n": 0})
    d.send("s", 20, {"k": "a", "n": 20})  # 20 apart: two sessions
    d.send("s", 10, {"k": "a", "n": 10})  # within 10 of both: one session
    d.advance(math.inf)
    assert d.finals() == [("a", 0, 20, [0, 20, 10])]


def test_rule35_a_session_closes_when_the_watermark_exceeds_last_plus_gap_plus_grace() -> None:
    d = Driver(Sessions)
    d.send("s", 5, {"k": "a", "n": 1})
    d.advance(15)
    assert d.finals() == []
    d.advance(16)
    assert d.finals() == [("a", 5, 5, [1])]


def test_rule35_a_message_within_the_gap_of_a_closed_session_is_late() -> None:
    # the watermark passed 5 + 10 (closed); 14 + 10 >= 16, yet 14 belongs to the closed
    # session: it is late, and never starts a second session a batch would not have
    d = Driver(Sessions)
    d.send("s", 5, {"k": "a", "n": 5})
    d.advance(16)
    assert not d.send("s", 14, {"k": "a", "n": 14})
    assert d.out.on("late")[0]["windows"] == [[5, 5]]
    assert d.send("s", 16, {"k": "a", "n": 16})  # more than the gap after it: a new session
    d.advance(math.inf)
    assert d.finals() == [("a", 5, 5, [5]), ("a", 16, 16, [16])]


# -- processing time -----------------------------------------------------------------------------
def test_rule35_processing_time_windows_use_the_wall_clock() -> None:
    class T(StreamTask):
        w = Tumbling(1000, time="processing", output="out")

    d = Driver(T)
    d.clock = 100.2
    d.send("w", ts=0)  # the envelope's timestamp is not used
    d.tick(0.5)
    d.send("w", ts=0)
    assert d.finals() == []
    d.tick(0.3)  # 101.0: the window [100000, 101000) closes
    assert d.finals() == [(None, 100_000, 101_000, 2)]


# -- restart (rule 36) ---------------------------------------------------------------------------
def test_rule36_a_restart_resumes_open_windows_from_the_committed_store() -> None:
    class T(StreamTask):
        t = Tumbling(10, key="k", aggregate=Sum("n"), output="out")
        s = Session(10, key="k", aggregate=Sum("n"), output="out")

    d = Driver(T)
    for n, ts in [(1, 1), (2, 12), (4, 15)]:
        d.send("t", ts, {"k": "a", "n": n})
        d.send("s", ts, {"k": "a", "n": n})
    d.commit()
    d.send("t", 3, {"k": "a", "n": 100})  # not committed: lost with the crash
    d = d.restart()
    assert d.event_timers  # re-armed from the store
    d.advance(math.inf)
    assert sorted(d.finals()) == [("a", 0, 10, 1), ("a", 1, 1, 1), ("a", 10, 20, 6), ("a", 12, 15, 6)]


# -- the property: the runtime against a batch computation ---------------------------------------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("msg"), st.sampled_from(["a", "b", 3]), st.integers(-30, 30)),
        st.tuples(st.just("wm"), st.integers(-35, 45)),
    ),
    max_size=40,
)


def _feed(d: Driver, window: str, script: list[tuple[Any, ...]]) -> list[tuple[Any, int, int | float, bool]]:
    """Runs the script; each message as (key, ts, watermark at add, joined)."""
    seen = []
    for i, op in enumerate(script):
        if op[0] == "wm":
            d.advance(op[1])
            # timely: nothing that is due stays open after a move
            assert not any(w <= d.wm for w, _ in d.event_timers.values())
        else:
            _, key, ts = op
            seen.append((key, ts, d.wm, d.send(window, ts, {"k": key, "n": i})))
    d.advance(math.inf)
    for fire in d.fires:
        finals = [(m["end"], m["start"], _order(m["key"])) for m in fire if m["final"]]
        assert finals == sorted(finals)
    return seen


@settings(max_examples=300, deadline=None)
@given(
    script=ops,
    size=st.integers(1, 30),
    step=st.integers(1, 30),
    offset=st.integers(-20, 20),
    grace=st.integers(0, 15),
)
def test_rule35_fixed_windows_equal_a_batch_over_the_messages_not_late(
    script: list[tuple[Any, ...]], size: int, step: int, offset: int, grace: int
) -> None:
    step = min(step, size)

    class T(StreamTask):
        w = Hopping(
            size, step, offset_ms=offset, key="k", aggregate=Collect("n"), grace_ms=grace, output="out"
        )

    d = Driver(T)
    seen = _feed(d, "w", script)
    expected: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for i, (key, ts, wm, joined) in enumerate(seen):
        open_ = [s for s in T.w.starts(ts) if s + size + grace > wm]
        assert joined == bool(open_)
        for s in open_:
            expected[key, s].append(i)
    got = {(k, s): v for k, s, e, v in d.finals()}
    ns = {i: n for i, n in enumerate(i for i, op in enumerate(script) if op[0] == "msg")}
    assert got == {k: [ns[i] for i in v] for k, v in expected.items()}
    assert len(d.finals()) == len(got)  # each window once
    assert d.runtimes[0].late == sum(1 for *_, joined in seen if not joined)


@settings(max_examples=300, deadline=None)
@given(script=ops, gap=st.integers(1, 15), grace=st.integers(0, 10))
def test_rule35_sessions_equal_a_batch_over_the_messages_not_late(
    script: list[tuple[Any, ...]], gap: int, grace: int
) -> None:
    class T(StreamTask):
        w = Session(
            gap,
            key="k",
            aggregate=Fold([], lambda a, e: sorted([*a, e.message["n"]]), merge=lambda a, b: sorted(a + b)),
            grace_ms=grace,
            output="out",
            late_output="late",
        )

    d = Driver(T)
    seen = _feed(d, "w", script)
    finals = d.finals()
    ts_of = {}
    idx = 0
    for i, op in enumerate(script):
        if op[0] == "msg":
            ts_of[i] = seen[idx]
            idx += 1
    # batch: sessions of the messages that were not late
    by_key: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for n, (key, ts, _, joined) in ts_of.items():
        if joined:
            by_key[key].append((ts, n))
    expected = set()
    for key, msgs in by_key.items():
        msgs.sort()
        run = [msgs[0]]
        for ts, n in msgs[1:]:
            if ts - run[-1][0] > gap:
                expected.add((key, run[0][0], run[-1][0], tuple(sorted(m for _, m in run))))
                run = []
            run.append((ts, n))
        expected.add((key, run[0][0], run[-1][0], tuple(sorted(m for _, m in run))))
    assert sorted(((k, s, e, tuple(v)) for k, s, e, v in finals), key=repr) == sorted(expected, key=repr)
    # and which messages were late is exactly rule 35's: past ts + gap + grace, or within the
    # gap of a session of its key closed before it came
    closed_at = {}
    for k, s, e, _ in finals:
        closed_at[k, s, e] = e + gap + grace  # it closed once the watermark exceeded this
    for key, ts, wm, joined in seen:
        near_closed = any(
            k == key and limit < wm and s - gap <= ts <= e + gap for (k, s, e), limit in closed_at.items()
        )
        assert joined == (not (ts + gap + grace < wm) and not near_closed), (key, ts, wm)
