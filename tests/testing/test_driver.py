"""tailrace.testing.TestDriver: virtual time fires exactly the windows, commits and timers that
are due, in time order, without sleeping; callbacks complete in any order; results are exposed."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import tailrace
import tailrace.ordering
from tailrace.clock import ManualClock
from tailrace.testing import TestDriver

WINDOW = {"task.window.ms": 1000, "task.commit.ms": 5000}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(params=["python", "c"])
def engine(request: pytest.FixtureRequest) -> str:
    """Every test body runs on both engines: both take their time from the driver's clock."""
    return str(request.param)


class Recorder(tailrace.StreamTask):
    """Logs every hook with the virtual time it ran at."""

    def init(self, context: Any) -> None:
        self.context = context
        self.log: list[tuple[str, Any, float]] = []
        self.buffer: list[Any] = []

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.log.append(("process", envelope.message, self.context.now()))
        self.buffer.append(envelope.message)
        if isinstance(envelope.message, tuple) and envelope.message[0] == "schedule":
            _, key, delay = envelope.message
            self.context.schedule(key, self.context.now() + delay, self.fire)

    def window(self, collector: Any, coordinator: Any) -> None:
        self.log.append(("window", tuple(self.buffer), self.context.now()))
        collector.send("mem.windows", list(self.buffer))
        self.buffer.clear()

    def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
        self.log.append(("timer", key, self.context.now()))
        collector.send("mem.timers", key)


def test_windows_fire_exactly_when_due_and_never_before(tailrace_driver: Any, engine: str) -> None:  # rule 8
    d = tailrace_driver(Recorder, inputs={"in": 1}, config=WINDOW, engine=engine)
    start = d.now
    d.send_all("in", [1, 2])
    for _ in range(9):
        d.advance(100)
    assert d.outputs("windows") == []
    d.advance(100)
    assert d.outputs("windows") == [[1, 2]]
    d.send("in", 3)
    d.advance(999)
    assert d.outputs("windows") == [[1, 2]]
    d.advance(1)
    assert d.outputs("windows") == [[1, 2], [3]]
    (task,) = d.tasks
    assert [(kind, at - start) for kind, _, at in task.log if kind == "window"] == [
        ("window", 1.0),
        ("window", 2.0),
    ]
    assert d.metrics()[0]["Partition 0"].windows == 2


def test_a_long_advance_fires_a_window_once(tailrace_driver: Any, engine: str) -> None:  # rule 8: coalesced
    d = tailrace_driver(Recorder, inputs={"in": 1}, config=WINDOW, engine=engine)
    d.send("in", "x")
    d.advance(10_000)
    assert d.outputs("windows") == [["x"]]
    d.advance(999)
    assert d.outputs("windows") == [["x"]]  # the next period counts from when the window ran
    d.advance(1)
    assert d.outputs("windows") == [["x"], []]


def test_timers_fire_in_time_order_at_their_due_time(tailrace_driver: Any, engine: str) -> None:  # rule 23
    d = tailrace_driver(Recorder, inputs={"in": 1}, engine=engine)
    start = d.now
    d.send("in", ("schedule", "late", 3.0))
    d.send("in", ("schedule", "early", 1.0))
    d.send("in", ("schedule", "middle", 2.0))
    d.send("in", ("schedule", "replaced", 1.5))
    d.send("in", ("schedule", "replaced", 2.5))  # re-registering a key replaces its timer
    d.advance(999)
    assert d.outputs("timers") == []
    d.advance(1)
    assert d.outputs("timers") == ["early"]
    d.advance(5000)  # one step over several timers: all due ones, in time order
    assert d.outputs("timers") == ["early", "middle", "replaced", "late"]
    (task,) = d.tasks
    fired = [(key, round(at - start, 3)) for kind, key, at in task.log if kind == "timer"]
    assert fired == [("early", 1.0), ("middle", 6.0), ("replaced", 6.0), ("late", 6.0)]
    # (the ``timers`` metric is not compared: the C engine counts timer barriers, the reference
    # engine timer functions)


@pytest.mark.parametrize("steps", [[200], [100, 100], [50, 50, 50, 50], [150, 50], [37, 163]])
@pytest.mark.parametrize("delay", [0.2, 0.3, 1.7, 0.001])
def test_a_timer_fires_when_time_reaches_it_exactly(engine: str, steps: list[int], delay: float) -> None:
    # rule 23: the C loop's deadline was the timer's epoch seconds minus the clock's, in ns: those
    # floats are ~240 ns apart, so a timer due at the very time advance() reached stayed unfired
    fired: list[float] = []

    class Timed(tailrace.StreamTask):
        def init(self, context: Any) -> None:
            self.context = context
            context.schedule("t", context.now() + delay, self.fire)

        def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            fired.append(self.context.now())

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    scale = delay / 0.2
    with TestDriver(Timed, inputs={"in": 1}, engine=engine) as d:
        start = d.now
        for i, ms in enumerate(steps):
            assert fired == [], f"fired before step {i}"
            d.advance(ms * scale)
        assert len(fired) == 1 and fired[0] >= start + delay


def test_the_first_reading_at_which_a_manual_clock_reaches_a_time() -> None:
    import random

    rng = random.Random(7)
    for _ in range(2000):
        clock = ManualClock(start=rng.uniform(0, 2e9))
        when = clock.time() + rng.choice([0.0, 1e-9, rng.uniform(0, 1), rng.uniform(0, 1e6), -1.0])
        ns = clock.reading_at(when)
        assert clock._start + ns / 1e9 >= when
        assert ns == 0 or clock._start + (ns - 1) / 1e9 < when
        clock.advance(ns / 1e9)
        assert clock.time() >= when


def test_commits_follow_the_virtual_commit_period(tailrace_driver: Any, engine: str) -> None:  # rule 9
    d = tailrace_driver(Recorder, inputs={"in": 2}, config=WINDOW, engine=engine)
    d.send("in", "a", partition=0)
    d.send("in", "b", partition=1)
    d.send("in", "c", partition=1)
    d.advance(4999)
    assert d.committed() == {}
    d.advance(1)
    assert d.committed_offset("in", 0) == 0 and d.committed_offset("in", 1) == 1
    assert d.checkpoints.committed() == d.committed()  # what the store holds
    d.send("in", "d", partition=0)
    d.advance(5000)
    assert d.committed_offset("in", 0) == 1


def test_no_real_time_passes_for_virtual_hours(tailrace_driver: Any, engine: str) -> None:
    d = tailrace_driver(Recorder, inputs={"in": 1}, config={"task.window.ms": 60_000}, engine=engine)
    began = time.monotonic()
    for i in range(60):  # an hour of one-minute windows
        d.send("in", i)
        d.advance(60_000)
    assert len(d.outputs("windows")) == 60
    assert time.monotonic() - began < 30  # milliseconds per step in practice; never a real minute


class Lookup(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        collector.send("mem.asked", envelope.message)


def test_callbacks_complete_in_any_order_and_commit_the_low_watermark(
    tailrace_driver: Any, engine: str
) -> None:  # rule 12
    d = tailrace_driver(
        Lookup, inputs={"in": 1}, config={"task.max.concurrency": 4, "task.commit.ms": 100}, engine=engine
    )
    d.send_all("in", list(range(6)))
    assert [p.offset for p in d.pending] == [0, 1, 2, 3]  # rule 2: at most 4 outstanding
    by_offset = {p.offset: p for p in d.pending}
    for offset in (3, 1, 2):
        by_offset[offset].complete()
    d.advance(100)
    assert d.committed_offset("in") is None  # 0 is still out (rule 13)
    by_offset[0].complete()
    assert [p.offset for p in d.pending] == [4, 5]
    d.advance(100)
    assert d.committed_offset("in") == 3
    for p in reversed(d.pending):
        p.complete()
    d.advance(100)
    assert d.committed_offset("in") == 5
    assert d.outputs("asked") == list(range(6))


def test_callback_timeout_is_virtual(tailrace_driver: Any, engine: str) -> None:  # rule 16
    d = tailrace_driver(Lookup, inputs={"in": 1}, config={"task.callback.timeout.ms": 30_000}, engine=engine)
    d.send("in", "slow")
    d.advance(29_999)
    assert d.running
    with pytest.raises(tailrace.CallbackTimeoutError):
        d.advance(1)
    assert not d.running


def test_end_of_input_runs_end_of_stream_and_a_restart_resumes_from_the_checkpoint(
    engine: str,
) -> None:  # rule 11, 13
    class Last(Recorder):
        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            collector.send("mem.last", list(self.buffer))

    with TestDriver(Last, inputs={"in": 1}, engine=engine) as first:
        first.send_all("in", ["a", "b"])
        first.end_input()
        assert first.outputs("last") == [["a", "b"]]
        assert not first.running and first.result is not None
        assert first.result.reason == "end_of_stream"
    # the same job again over the same input plus one message: offsets 0 and 1 were committed
    with TestDriver(
        Last, inputs={"in": [["a", "b", "c"]]}, checkpoints=first.checkpoints, engine=engine
    ) as second:
        second.end_input()
        assert second.outputs("last") == [["c"]]


def test_close_waits_for_pending_callbacks_for_task_shutdown_ms_of_virtual_time(
    engine: str,
) -> None:  # rule 19
    d = TestDriver(
        Lookup,
        inputs={"in": 1},
        config={"task.max.concurrency": 2, "task.shutdown.ms": 60_000},
        engine=engine,
    )
    d.start()
    d.send_all("in", ["done", "never"])
    d.pending[0].complete()
    began = time.monotonic()
    result = d.close()
    assert result is not None and result.committed[tailrace.SystemStreamPartition("mem", "in", 0)] == 0
    assert time.monotonic() - began < 30


def test_the_driver_refuses_what_it_cannot_make_deterministic() -> None:
    with pytest.raises(tailrace.ConfigError, match=r"thread\.pool\.size"):
        TestDriver(Recorder, inputs={"in": 1}, config={"job.container.thread.pool.size": 2})


def test_manual_clock_moves_only_forward() -> None:
    clock = ManualClock(start=100.0)
    assert (clock.time(), clock.monotonic()) == (100.0, 0.0)
    clock.advance(1.5)
    assert (clock.time(), clock.monotonic()) == (101.5, 1.5)
    with pytest.raises(ValueError, match="never goes back"):
        clock.advance(-1)


def test_both_engines_fire_the_same_hooks_at_the_same_virtual_times() -> None:
    logs = []
    for engine in ("python", "c"):
        with TestDriver(Recorder, inputs={"in": 1}, config=WINDOW, engine=engine) as d:
            start = d.now
            d.send("in", ("schedule", "t", 1.5))
            for i in range(4):
                d.send("in", i)
                d.advance(500)
            (task,) = d.tasks
            logs.append([(kind, what, round(at - start, 6)) for kind, what, at in task.log])
    assert logs[0] == logs[1]
    assert [entry for entry in logs[0] if entry[0] != "process"] == [
        ("window", (("schedule", "t", 1.5), 0, 1), 1.0),
        ("timer", "t", 1.5),
        ("window", (2, 3), 2.0),
    ]


def test_a_job_file_runs_under_the_driver(tmp_path: Path, engine: str) -> None:
    job = tmp_path / "wordcount"
    shutil.copytree(EXAMPLES / "wordcount", job, ignore=shutil.ignore_patterns("state", "output"))
    with TestDriver.from_job(job, engine=engine, overrides={"task.commit.ms": 5000}) as d:
        assert d.system.name == "files" and d.system.partitions("lines") == 3
        d.send("lines", "Call me Ishmael, call me", partition=1)
        assert d.outputs("counts") == []
        d.advance(1000)  # the job's task.window.ms
        counts = {m["word"]: m["count"] for m in d.outputs("counts")}
        assert counts == {"call": 2, "me": 2, "ishmael": 1}
        assert {m["task"] for m in d.outputs("counts")} == {"Partition 1"}
        d.advance(4000)
        assert d.committed_offset("lines", 1) == 0
    assert not (job / "state").exists()  # the driver's checkpoints stay in memory


class _WindowClock(tailrace.StreamTask):
    def init(self, context: Any) -> None:
        self.context = context

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass

    def window(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.w", self.context.now())


def test_late_window_and_commit_keep_their_period_grid(engine: str) -> None:
    # rules 8, 9: the window and commit timers run at a fixed rate, as Samza's; a firing
    # that came late (the clock jumped past it) does not shift the ones after it, and both
    # engines fire at the same virtual times
    config = {"task.window.ms": 10_000, "task.commit.ms": 10_000}
    with TestDriver(_WindowClock, inputs={"in": 1}, config=config, engine=engine) as d:
        t0 = d.now
        windows: list[list[int]] = []
        commits: list[int] = []
        for step in (15_000, 5_000, 5_000, 5_000, 10_000):
            d.send("in", "x")
            d.advance(step)
            windows.append([round(t - t0) for t in d.outputs("w")])
            commits.append(d.metrics()[0]["Partition 0"].commits)
    assert windows == [[15], [15, 20], [15, 20], [15, 20, 30], [15, 20, 30, 40]]
    assert commits == [1, 2, 2, 3, 4]


class Counts(tailrace.StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.counts[envelope.message] = self.counts.get(envelope.message, 0) + 1


def test_store_shows_the_committed_contents_during_and_after_the_run(engine: str) -> None:
    # docs/testing.md: store(task, name) is the committed contents of a state store; what
    # the final commit wrote is still there once the run ended (close, end of input)
    d = TestDriver(Counts, inputs={"w": 1}, stores=["counts"], config={"task.commit.ms": 1000}, engine=engine)
    d.start()
    d.send_all("w", ["a", "b", "a"])
    d.advance(1000)
    during = d.store("Partition 0", "counts", raw=True)
    assert during == {b'"a"': b"2", b'"b"': b"1"}
    d.send("w", "b")
    d.close()
    assert d.store("Partition 0", "counts", raw=True) == {b'"a"': b"2", b'"b"': b"2"}


class ThreeTimers(tailrace.StreamTask):
    def init(self, context: Any) -> None:
        self.context = context
        self.fired: list[str] = []

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        for key in ("a", "b", "c"):  # all due at the same moment
            self.context.schedule(key, self.context.now() + 1.0, self.fire)

    def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
        self.fired.append(key)


def test_the_timers_metric_counts_every_timer_that_fired(engine: str) -> None:
    # rule 23 and the metrics: three timers due at once are three timers on both engines
    d = TestDriver(ThreeTimers, inputs={"w": 1}, engine=engine)
    d.start()
    d.send("w", "go")
    d.advance(1000)
    assert sorted(d.tasks[0].fired) == ["a", "b", "c"]
    tasks, _ = d.metrics()
    assert tasks["Partition 0"].timers == 3
    d.close()


class Flush(tailrace.StreamTask):
    """Sends what it buffered from its window and at the end of the stream."""

    def init(self, context: Any) -> None:
        self.name = context.task_name
        self.seen: list[Any] = []

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.seen.append(envelope.message)

    def window(self, collector: Any, coordinator: Any) -> None:
        for m in self.seen:
            collector.send("mem.out", m)
        self.seen.clear()

    def end_of_stream(self, collector: Any, coordinator: Any) -> None:
        collector.send("mem.out", f"end of {self.name}")


def test_hooks_due_together_run_in_task_order_on_both_engines(engine: str) -> None:
    # docs/testing.md: the engines fire the same hooks at the same virtual times, so a test
    # parametrized over both sees the same outputs: hooks of several tasks that fall due
    # together (windows, end of stream) run in task order
    d = TestDriver(Flush, inputs={"in": 3}, config={"task.window.ms": 1000}, engine=engine)
    d.start()
    for p in (2, 0, 1):
        d.send("in", f"p{p}", partition=p)
    d.advance(1000)
    assert d.outputs("out") == ["p0", "p1", "p2"]
    d.end_input()
    assert d.outputs("out")[3:] == [f"end of Partition {p}" for p in range(3)]
    d.close()


class NeverCompletes(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        pass  # the callback is never completed


def test_a_drain_that_runs_out_of_task_shutdown_ms_is_logged(engine: str, caplog: Any) -> None:
    # rule 19: a stop waits task.shutdown.ms for outstanding callbacks, then commits the low
    # watermarks; both engines say how many callbacks it gave up on
    config = {"task.max.concurrency": 3, "task.shutdown.ms": 20000}
    d = TestDriver(NeverCompletes, inputs={"in": 1}, config=config, engine=engine)
    d.start()
    d.send_all("in", ["a", "b", "c"])
    with caplog.at_level("WARNING", logger="tailrace"):
        result = d.close()
    assert result is not None and result.committed == {}
    warned = [r.getMessage() for r in caplog.records if "still outstanding" in r.getMessage()]
    assert warned == [
        "shutdown: 3 callbacks still outstanding after task.shutdown.ms=20000; committing low watermarks"
    ]


class Holds(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        pass  # completed by the test


def test_a_message_with_a_free_key_that_arrives_later_runs_at_once(engine: str) -> None:
    # rule 30: a slow message delays only later messages with its own key. a0 is slow and a1
    # waits for it; b0 and c0 arrive after that, one by one, with free keys: they run at once
    # (the C loop stopped reading a partition whose buffered keys were all busy)
    config = {"task.max.concurrency": 3, "task.ordering": "key"}
    d = TestDriver(Holds, inputs={"in": 1}, config=config, engine=engine)
    for message, key in [("a0", "a"), ("a1", "a"), ("b0", "b"), ("c0", "c")]:
        d.send("in", message, key=key)
    assert [p.message for p in d.pending] == ["a0", "b0", "c0"]
    d.pending[0].complete()
    assert sorted(p.message for p in d.pending) == ["a1", "b0", "c0"]
    for p in list(d.pending):
        p.complete()
    d.close()


# a hash whose key lands where hash 0's does in any table of up to 2**20 slots indexed by the top
# bits of hash * 0x9E3779B97F4A7C15 (Fibonacci hashing): 0x9E37... * SAME_SLOT == 2**60 (mod 2**64)
SAME_SLOT = (1 << 60) * pow(0x9E3779B97F4A7C15, -1, 1 << 64) % (1 << 64)


@pytest.mark.parametrize("max_concurrency", [3, 64])
def test_keys_whose_hashes_share_a_slot_do_not_wait_for_each_other(engine: str, max_concurrency: int) -> None:
    # rule 30: only the key itself waits. The C loop kept one busy flag per slot of a 1,024-slot
    # table: "c" waited for "a" when Python's randomised hashes put both in one slot (CI saw it
    # once in a few hundred runs of the test above)
    hashes = {"a": 0, "b": 1, "c": SAME_SLOT}
    tailrace.ordering.set_key_hash_override(hashes.__getitem__)
    try:
        config = {"task.max.concurrency": max_concurrency, "task.ordering": "key"}
        d = TestDriver(Holds, inputs={"in": 1}, config=config, engine=engine)
        for message, key in [("a0", "a"), ("c0", "c"), ("a1", "a"), ("b0", "b"), ("c1", "c")]:
            d.send("in", message, key=key)
        assert [p.message for p in d.pending] == ["a0", "c0", "b0"]
        d.pending[1].complete()  # c0: c1 may start, a1 still waits for a0
        assert [p.message for p in d.pending] == ["a0", "b0", "c1"]
        d.pending[0].complete()
        assert [p.message for p in d.pending] == ["b0", "c1", "a1"]
        for p in list(d.pending):
            p.complete()
        d.end_input()
        result = d.close()
        assert result is not None and result.reason == "end_of_stream"
        assert d.committed_offset("in") == 4
    finally:
        tailrace.ordering.set_key_hash_override(None)


@pytest.mark.parametrize(("before_ms", "timeout_ms"), [(137, 4000), (18_001, 30_000), (7000, 1001)])
def test_a_callback_times_out_when_time_lands_exactly_on_its_deadline(
    engine: str, before_ms: int, timeout_ms: int
) -> None:  # rule 16: a deadline summed in float seconds stayed 1 ulp above the clock's reading
    d = TestDriver(Lookup, inputs={"in": 1}, config={"task.callback.timeout.ms": timeout_ms}, engine=engine)
    d.start()
    d.advance(before_ms)
    d.send("in", "slow")
    d.advance(timeout_ms - 1)
    assert d.running
    with pytest.raises(tailrace.CallbackTimeoutError):
        d.advance(1)
    assert not d.running


@pytest.mark.parametrize("before_ms", [18_001, 48_001, 137])
def test_close_lets_task_shutdown_ms_pass_at_any_virtual_time(engine: str, before_ms: int) -> None:  # rule 19
    d = TestDriver(Lookup, inputs={"in": 1}, engine=engine)
    d.start()
    d.advance(before_ms)
    d.send("in", "never")
    began = time.monotonic()
    result = d.close()
    assert result is not None and result.reason == "stop"
    assert time.monotonic() - began < 10


def test_a_100_ms_window_fires_every_100_ms_of_small_steps(engine: str) -> None:  # rule 8
    # 0.1 + 0.1 + 0.1 > 0.3 in float seconds: each window must still fire at its whole millisecond
    d = TestDriver(
        Recorder, inputs={"in": 1}, config={"task.window.ms": 100, "task.commit.ms": 300}, engine=engine
    )
    with d:
        for step in range(1, 31):
            d.advance(100)
            (task,) = d.tasks
            assert len([e for e in task.log if e[0] == "window"]) == step, f"after {step * 100} ms"


class CompletesEvenInline(tailrace.AsyncStreamTask):
    """Answers even messages at once (a cache hit, say) and leaves odd ones to the test."""

    def init(self, context: Any) -> None:
        self.callbacks: dict[Any, Any] = {}

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        self.callbacks[envelope.offset] = callback
        if envelope.message % 2 == 0:
            callback.complete()


def test_pending_leaves_out_what_the_task_completed_inline(tailrace_driver: Any, engine: str) -> None:
    d = tailrace_driver(
        CompletesEvenInline,
        inputs={"in": 1},
        config={"task.max.concurrency": 8, "task.commit.ms": 100},
        engine=engine,
    )
    d.send_all("in", list(range(6)))
    assert [p.message for p in d.pending] == [1, 3, 5]
    (task,) = d.tasks
    assert all(p.callback is task.callbacks[p.offset] for p in d.pending)  # what the task got
    for p in d.pending:  # every entry listed is the test's to resolve: no second completion
        p.complete()
    assert d.pending == []
    d.advance(100)
    assert d.committed_offset("in") == 5


class CompletesLaterFromItsThread(tailrace.AsyncStreamTask):
    """Hands "later" messages to a thread of its own that completes them once released."""

    def init(self, context: Any) -> None:
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        if envelope.message.startswith("later"):

            def answer() -> None:
                self.release.wait(30)
                callback.complete()

            thread = threading.Thread(target=answer, daemon=True)
            self.threads.append(thread)
            thread.start()


def test_pending_leaves_out_what_the_task_completed_later_from_another_thread(
    tailrace_driver: Any, engine: str
) -> None:  # rule 22
    d = tailrace_driver(
        CompletesLaterFromItsThread,
        inputs={"in": 1},
        config={"task.max.concurrency": 200, "task.commit.ms": 100},
        engine=engine,
    )
    messages = [f"{'later' if i % 2 == 0 else 'keep'}-{i}" for i in range(150)]
    d.send_all("in", messages)
    assert [p.message for p in d.pending] == messages  # none resolved yet
    (task,) = d.tasks
    task.release.set()
    keep = set(messages[1::2])
    while any(t.is_alive() for t in task.threads):  # reads racing with the threads' completions
        listed = [p.message for p in d.pending]
        assert keep <= set(listed)  # what nobody resolved stays listed, in invocation order
        assert listed == [m for m in messages if m in set(listed)]
    for thread in task.threads:
        thread.join()
    d.settle()
    assert [p.message for p in d.pending] == messages[1::2]
    for p in reversed(d.pending):
        p.complete()
    assert d.pending == []
    d.advance(100)
    assert d.committed_offset("in") == 149


class FailsInline(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        if envelope.message == "bad":
            callback.fail(ValueError("bad message"))


def test_pending_leaves_out_what_the_task_failed_inline(tailrace_driver: Any, engine: str) -> None:  # rule 16
    d = tailrace_driver(FailsInline, inputs={"in": 1}, config={"task.max.concurrency": 4}, engine=engine)
    d.send("in", "ok")
    with pytest.raises(tailrace.TaskError, match="offset 1"):
        d.send("in", "bad")
    assert [p.message for p in d.pending] == ["ok"]


class CompletesTwice(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        callback.complete()
        callback.complete()


def test_the_task_s_own_second_completion_is_still_the_engine_s_error(
    tailrace_driver: Any, engine: str
) -> None:  # rule 17
    d = tailrace_driver(CompletesTwice, inputs={"in": 1}, engine=engine)
    with pytest.raises(tailrace.CallbackError, match="second time"):
        d.send("in", "x")
    assert d.pending == []


class CommitsAllOnRequest(tailrace.StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if envelope.message == "commit-all":
            coordinator.commit(tailrace.Scope.ALL_TASKS_IN_CONTAINER)


@pytest.mark.parametrize("how", ["commit ALL", "commit period"])
def test_a_task_at_end_of_stream_is_still_committed(engine: str, how: str) -> None:
    # rules 9, 11, 14: "Partition 0" (a[0], b[0]) reaches end of stream with a[0] offset 0 not yet
    # committed while "Partition 1" (b[1]) runs on; a commit ALL request of Partition 1, or the
    # commit period, commits it (the C loop skipped done tasks until the container stopped)
    config = {"task.commit.ms": -1 if how == "commit ALL" else 100}
    d = TestDriver(CommitsAllOnRequest, inputs={"a": 1, "b": 2}, config=config, engine=engine)
    d.send("a", "x", partition=0)
    d.end_input("a")
    d.system.end("b", 0)
    d.settle()
    assert d.committed_offset("a", 0) is None
    if how == "commit ALL":
        d.send("b", "commit-all", partition=1)
        assert d.committed_offset("b", 1) == 0
    else:
        d.advance(150)
    assert d.committed_offset("a", 0) == 0
    assert d.running  # Partition 1 is not at its end
    d.close()


class StopsAllOrHolds(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        if envelope.message == "stop":
            coordinator.shutdown(tailrace.Scope.ALL_TASKS_IN_CONTAINER)
            callback.complete()


@pytest.mark.parametrize("stop", ["close", "shutdown request"])
def test_a_callback_that_times_out_while_a_stop_waits_for_it_fails_the_run(engine: str, stop: str) -> None:
    # rules 16, 19: the graceful stop waits up to task.shutdown.ms for outstanding callbacks, but
    # one outstanding past task.callback.timeout.ms still fails the run (the C loop ended the
    # drain as a clean stop: its stop reason was set first)
    config = {"task.callback.timeout.ms": 300, "task.max.concurrency": 2, "task.shutdown.ms": 5000}
    d = TestDriver(StopsAllOrHolds, inputs={"a": 2}, config=config, engine=engine)
    d.send("a", "slow", partition=0)
    if stop == "close":
        with pytest.raises(tailrace.CallbackTimeoutError, match="offset 0"):
            d.close()
        return
    d.send("a", "stop", partition=1)
    d.advance(200)
    assert d.running
    with pytest.raises(tailrace.CallbackTimeoutError, match="offset 0"):
        d.advance(200)
    assert not d.running
    d.close()


class WindowStopsAll(tailrace.StreamTask):
    def init(self, context: Any) -> None:
        self.name = context.task_name
        self.log: list[str] = []

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass

    def window(self, collector: Any, coordinator: Any) -> None:
        self.log.append("window")
        if self.name == "Partition 0":
            coordinator.shutdown(tailrace.Scope.ALL_TASKS_IN_CONTAINER)


def test_no_window_of_another_task_runs_once_a_shutdown_all_took_effect(engine: str) -> None:
    # rules 14, 19: both tasks' windows fall due at one instant and task 0's window asks to stop
    # the container: task 1's window does not run (the C loop ran it: it was in the same batch)
    d = TestDriver(WindowStopsAll, inputs={"a": 2}, config={"task.window.ms": 50}, engine=engine)
    d.advance(50)
    assert not d.running
    result = d.close()
    assert result is not None and result.reason == "shutdown"
    assert [t.log for t in d.tasks] == [["window"], []]


def test_a_message_taken_but_never_invoked_after_a_failure_is_not_counted(engine: str) -> None:
    # rule 2, "Metrics that must exist": processed counts invocations. A failure frees the key of
    # m0, so m1 was taken into the C loop's batch, and the stop left it there uninvoked yet
    # counted in processed and outstanding (about one run in five; 40 runs)
    invoked: list[int] = []

    class Records(tailrace.AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            invoked.append(envelope.offset)

    for _ in range(40):
        invoked.clear()
        config = {"task.max.concurrency": 4, "task.ordering": "key"}
        d = TestDriver(Records, inputs={"a": 1}, config=config, engine=engine)
        d.send("a", "m0", key="y")
        d.send("a", "m1", key="y")
        with pytest.raises(tailrace.TaskError):
            d.pending[0].fail(ValueError("boom"))
        m = d.metrics()[0]["Partition 0"]
        assert invoked == [0]
        assert (m.processed, m.outstanding, m.failed) == (1, 1, 1)
        d.close()


class AsksAfterComplete(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        callback.complete()
        if envelope.message == "commit":
            coordinator.commit(tailrace.Scope.CURRENT_TASK)
        elif envelope.message == "stop":
            coordinator.shutdown(tailrace.Scope.ALL_TASKS_IN_CONTAINER)
        elif envelope.message == "twice":
            callback.complete()
        elif envelope.message == "then fail":
            callback.fail(ValueError("late"))


@pytest.mark.parametrize("max_concurrency", [1, 4])
def test_a_request_made_after_complete_in_the_same_call_counts(engine: str, max_concurrency: int) -> None:
    # rule 14: the coordinator given to a call can request; the C engine read the requests when
    # the callback completed, so one made after complete() in the same call was lost
    config = {"task.commit.ms": -1, "task.max.concurrency": max_concurrency}
    d = TestDriver(AsksAfterComplete, inputs={"a": 1}, config=config, engine=engine)
    d.send("a", "x")
    d.send("a", "commit")
    assert d.committed_offset("a") == 1
    d.send("a", "stop")
    assert not d.running
    result = d.close()
    assert result is not None and result.reason == "shutdown"


@pytest.mark.parametrize("second", ["twice", "then fail"])
def test_a_second_resolution_in_the_same_call_is_an_error(engine: str, second: str) -> None:  # rule 17
    d = TestDriver(AsksAfterComplete, inputs={"a": 1}, engine=engine)
    d.send("a", "x")
    with pytest.raises(tailrace.CallbackError, match="second time"):
        d.send("a", second)
    assert not d.running


def test_end_input_returns_the_result_once_the_run_stopped(engine: str) -> None:
    """docs/testing.md: end_input() and close() both give the run's result."""
    d = TestDriver(Recorder, inputs={"in": 1, "other": 1}, engine=engine)
    d.send_all("in", [1, 2, 3])
    assert d.end_input("in") is None  # "other" keeps the run going
    assert d.result is None
    result = d.end_input("other")
    assert result is not None and result is d.result
    assert result.processed == 3
    assert d.close() is result


def test_a_restart_skips_the_committed_messages_of_a_log_sent_again(engine: str) -> None:
    """Rule 13, docs/testing.md (the same store for a second driver tests a restart): the log
    given again with send_all after start resumes after the committed offset, as it does when
    given through inputs=."""
    store = tailrace.MemoryCheckpointStore()
    seen: list[int] = []

    class Task(tailrace.StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            seen.append(envelope.offset)

    with TestDriver(Task, inputs={"in": 1}, engine=engine, checkpoints=store) as d:
        d.send_all("in", ["m0", "m1", "m2"])
    assert d.committed_offset("in") == 2 and seen == [0, 1, 2]
    seen.clear()
    with TestDriver(Task, inputs={"in": 1}, engine=engine, checkpoints=store) as d2:
        d2.start()
        d2.send_all("in", ["m0", "m1", "m2", "m3"])
        d2.send("in", "m4")
    assert seen == [3, 4]
    assert d2.committed_offset("in") == 4


class _NeverCompletes(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        pass  # never completed: each callback runs into task.callback.timeout.ms


@pytest.mark.parametrize(("later", "named"), [(0, "Partition 0"), (40, "Partition 1")])
def test_of_callbacks_past_their_deadlines_the_earliest_deadline_times_out(
    engine: str, later: float, named: str
) -> None:
    # rule 16 on virtual time, one answer on both engines: partition 1's callback starts
    # first; partition 0's `later` ms after. One advance passes both deadlines: the one that
    # fell due first names the error; at one deadline, the first task's
    d = TestDriver(_NeverCompletes, inputs={"in": 2}, engine=engine, config={"task.callback.timeout.ms": 100})
    d.send("in", "m", partition=1)
    d.advance(later)
    d.send("in", "m", partition=0)
    with pytest.raises(tailrace.CallbackTimeoutError) as info:
        d.advance(200)
    assert info.value.task == named
    d.close()


def test_at_one_deadline_the_first_task_times_out_after_a_completion_of_the_other(engine: str) -> None:
    # rule 16, as above: partition 1 had a callback that completed before its deadline; the
    # C loop kept that callback's deadline in its timer heap, checked partition 1 first when
    # it fell due, and named partition 1's later callback (its deadline equal to partition 0's)
    d = TestDriver(_NeverCompletes, inputs={"in": 2}, engine=engine, config={"task.callback.timeout.ms": 100})
    d.send("in", "early", partition=1)
    d.advance(10)
    d.pending[0].complete()
    d.send("in", "m", partition=1)
    d.send("in", "m", partition=0)
    with pytest.raises(tailrace.CallbackTimeoutError) as info:
        d.advance(100)
    assert (info.value.task, info.value.offset) == ("Partition 0", 0)
    d.close()


class _HoldsUnlessStop(tailrace.AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        if envelope.message == "stop":
            coordinator.shutdown(tailrace.Scope.ALL_TASKS_IN_CONTAINER)
            callback.complete()  # "hold" is left pending: the stop's drain waits for it


def test_a_drain_runs_no_periodic_commit_and_ends_with_one_final_commit(engine: str) -> None:
    # rule 19: a graceful stop awaits the outstanding callbacks (task.shutdown.ms), then one
    # final commit; the commit period does not run meanwhile, on either engine (the
    # reference engine committed partition 2 every task.commit.ms during the drain)
    d = TestDriver(_HoldsUnlessStop, inputs={"in": 3}, engine=engine, config={"task.commit.ms": 50})
    d.send("in", "hold", partition=0)
    d.send("in", "stop", partition=2)
    d.advance(200)
    assert d.running
    assert d.committed() == {}
    assert sum(m.commits for m in d.metrics()[0].values()) == 0
    result = d.close()
    assert result is not None and result.reason == "shutdown"
    assert {str(k): v for k, v in d.committed().items()} == {"mem.in[2]": 0}


def test_a_failure_after_the_run_stopped_changes_no_metric(engine: str) -> None:
    # a callback left pending at close() and failed later, from another thread: the run has
    # ended, its failure affects nothing and counts nowhere (C counted it in `failed`)
    d = TestDriver(_NeverCompletes, inputs={"a": 1}, engine=engine)
    d.send("a", "x")
    late = d.pending[0].callback
    result = d.close()
    assert result is not None
    thread = threading.Thread(target=late.fail, args=(RuntimeError("after close"),))
    thread.start()
    thread.join()
    assert result.tasks["Partition 0"].failed == 0
    assert d.metrics()[0]["Partition 0"].failed == 0


class TypedCounts(tailrace.StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")
        self.pairs = context.store("pairs")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        user, page = envelope.message
        self.counts[user] = self.counts.get(user, 0) + 1
        self.pairs[user, page] = {"last": page, "n": self.pairs.get((user, page), {"n": 0})["n"] + 1}


def test_store_is_decoded_as_the_task_put_it_and_raw_on_request(engine: str) -> None:
    # issue 38: store() reads like the user's data: keys and values decoded by the store's
    # serdes (tuple keys of json come back as tuples, as the task reads them), in the order
    # of the encoded keys; raw=True gives the encoded bytes the checkpoint store keeps
    stores = {"counts": {"key.serde": "str", "value.serde": "int"}, "pairs": {}}
    with TestDriver(TypedCounts, inputs={"clicks": 1}, stores=stores, engine=engine) as d:
        d.send_all("clicks", [("bob", "/a"), ("ann", "/b"), ("bob", "/a")])
        assert d.store("Partition 0", "counts") == {}  # nothing committed yet
        d.advance(60_000)
        counts = d.store("Partition 0", "counts")
        assert counts == {"ann": 1, "bob": 2} and list(counts) == ["ann", "bob"]
        assert d.store("Partition 0", "pairs") == {
            ("ann", "/b"): {"last": "/b", "n": 1},
            ("bob", "/a"): {"last": "/a", "n": 2},
        }
        raw = d.store("Partition 0", "counts", raw=True)
        assert raw == {b"ann": (1 ^ 1 << 63).to_bytes(8, "big"), b"bob": (2 ^ 1 << 63).to_bytes(8, "big")}
        assert d.store("Partition 0", "pairs", raw=True)[b'["bob","/a"]'] == b'{"last":"/a","n":2}'


def test_memory_checkpoint_store_state_is_decoded_and_raw_on_request() -> None:
    # the README's example: MemoryCheckpointStore.state() reads the committed contents with
    # the store's serdes (json by default, as a store's), or raw
    store = tailrace.MemoryCheckpointStore()
    mem = tailrace.MemorySystem("mem").add_stream("clicks", [[("bob", "/a"), ("ann", "/b"), ("bob", "/a")]])
    tailrace.Container(
        TypedCounts,
        inputs=["mem.clicks"],
        systems=[mem],
        checkpoints=store,
        stores={"counts": {"key.serde": "str", "value.serde": "int"}, "pairs": {}},
    ).run()
    assert store.state("Partition 0", "counts", "tailrace-job", key_serde="str", value_serde="int") == {
        "ann": 1,
        "bob": 2,
    }
    assert store.state("Partition 0", "pairs", "tailrace-job") == {
        ("ann", "/b"): {"last": "/b", "n": 1},
        ("bob", "/a"): {"last": "/a", "n": 2},
    }
    assert store.state("Partition 0", "counts", "tailrace-job", raw=True)[b"ann"] == (1 ^ 1 << 63).to_bytes(
        8, "big"
    )
    with pytest.raises(tailrace.serdes.SerdeError):  # int bytes are no JSON
        store.state("Partition 0", "counts", "tailrace-job")
