"""task.ordering = key (rules 30, 31): order per key inside a partition, on both engines.

Completions come from real threads in random order; a checkpoint store that checks
every write pins that commits never pass an incomplete message (rules 12, 13).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailrace import AsyncStreamTask, Container, MemoryCheckpointStore, MemorySystem, StreamTask
from tailrace.errors import ConfigError
from tailrace.ordering import set_key_hash_override

from .conftest import ENGINE_NAMES
from .helpers import WAIT, Background, CheckingStore, Tracker, ssp, wait_until


def make_async(
    tracker: Tracker, seed: int, delay: float = 0.002, slow: dict[Any, float] | None = None
) -> type:
    rng = random.Random(seed)
    rng_lock = threading.Lock()

    class KeyedAsync(AsyncStreamTask):
        def process_async(self, env: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            p, key, off = env.ssp.partition, env.key, env.offset
            tracker.start(p, key, off)
            with rng_lock:
                wait = rng.random() * delay
            if slow and key in slow:
                wait = slow[key]

            def done() -> None:
                tracker.finish(p, key, off)
                callback.complete()

            if wait <= 0 and rng.random() < 0.3:
                done()  # inline completion, on the loop thread
            else:
                threading.Timer(wait, done).start()

    return KeyedAsync


def make_asyncio(tracker: Tracker, seed: int) -> type:
    rng = random.Random(seed)

    class KeyedAsyncio(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            p, key, off = env.ssp.partition, env.key, env.offset
            tracker.start(p, key, off)
            r = rng.random()
            if r < 0.7:  # else completes without suspending (inline)
                await asyncio.sleep(r * 0.003)
            tracker.finish(p, key, off)

    return KeyedAsyncio


def make_sync(tracker: Tracker, seed: int) -> type:
    rng = random.Random(seed)

    class KeyedSync(StreamTask):
        def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            p, key, off = env.ssp.partition, env.key, env.offset
            tracker.start(p, key, off)
            if rng.random() < 0.2:
                time.sleep(0.0005)
            tracker.finish(p, key, off)

    return KeyedSync


def keyed_system(keys: list[list[Any]]) -> MemorySystem:
    return MemorySystem().add_stream("in", [list(range(len(k))) for k in keys], keys=keys)


KEYS = [None, "a", "b", "c", "d", b"e", 7]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["async", "asyncio", "sync", "sync_pool"]),
    keys=st.lists(st.lists(st.sampled_from(KEYS), max_size=40), min_size=1, max_size=2),
    mc=st.integers(1, 6),
    buf=st.integers(1, 16),
    seed=st.integers(0, 2**16),
    engine=st.sampled_from(ENGINE_NAMES),
)
def test_per_key_order_random_completion(
    kind: str, keys: list[list[Any]], mc: int, buf: int, seed: int, engine: str
) -> None:
    """rule 30: per key, invocation order = offset order, never two outstanding;
    rules 12, 13: every commit is a gap-free prefix of completions; rule 31 with a
    small input buffer (look-ahead bounded by it)."""
    tracker = Tracker(mc)
    makers = {"async": make_async, "asyncio": make_asyncio}
    task = makers.get(kind, make_sync)(tracker, seed)
    store = CheckingStore(tracker)
    c = Container(
        task,
        inputs=["mem.in"],
        systems=[keyed_system(keys)],
        checkpoints=store,
        engine=engine,
        task_ordering="key",
        task_max_concurrency=mc,
        task_input_buffer_size=buf,
        task_commit_ms=3,
        job_container_thread_pool_size=2 if kind == "sync_pool" else 0,
    )
    result = c.run()
    tracker.check_order()
    assert result.processed == sum(len(k) for k in keys)
    for p, k in enumerate(keys):
        if k:
            assert result.committed[ssp(p)] == len(k) - 1
    for m in result.tasks.values():
        assert m.keys_in_flight == 0 and m.outstanding == 0


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_slow_key_does_not_delay_other_keys(engine: str) -> None:
    """rule 30: a slow message delays only its own key; the watermark stays below it (with
    Python's randomised str hashes: the C loop once kept one busy flag per slot of a table, and
    "slow" shared a slot with one of the ten keys about one process in forty)."""
    tracker = Tracker(8)
    keys = [f"k{i % 10}" for i in range(40)]
    keys[5] = "slow"
    task = make_async(tracker, 1, delay=0.001, slow={"slow": 1.0})
    c = Container(
        task,
        inputs=["mem.in"],
        systems=[keyed_system([keys])],
        checkpoints=CheckingStore(tracker),
        engine=engine,
        task_ordering="key",
        task_max_concurrency=8,
    )
    bg = Background(c)
    t0 = time.monotonic()
    wait_until(lambda: len(tracker.completed.get(0, ())) == 39, what="the other keys to complete")
    elapsed = time.monotonic() - t0
    assert 5 not in tracker.completed[0]
    assert elapsed < 0.9, f"other keys took {elapsed:.2f}s: they waited for the slow one"

    def metrics() -> Any:
        snap = c.metrics()
        assert snap is not None
        return next(iter(snap[0].values()))

    # the callbacks' completions reach the loop just after tracker.finish
    wait_until(lambda: metrics().keys_in_flight == 1, timeout=0.5, what="only the slow key in flight")
    m = metrics()
    assert 5 not in tracker.completed[0]
    assert m.low_watermark.get(ssp(0), -1) <= 4  # never past the slow message (rule 13)
    assert m.head_of_line_ms > 0
    result = bg.join()
    tracker.check_order()
    assert result.committed[ssp(0)] == 39


@pytest.fixture
def collide() -> Iterator[None]:
    set_key_hash_override(lambda k: 12345 if k in ("a", "b") else hash(k))
    try:
        yield
    finally:
        set_key_hash_override(None)


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_hash_collision_serialises_never_reorders(engine: str, collide: None) -> None:
    """rule 30: two keys forced to one hash share one lane: serialised, in offset order."""
    tracker = Tracker(6, collide=frozenset({"a", "b"}))
    rng = random.Random(3)
    keys = [rng.choice(["a", "b", "c", "d"]) for _ in range(120)]
    task = make_async(tracker, 5)
    c = Container(
        task,
        inputs=["mem.in"],
        systems=[keyed_system([keys])],
        checkpoints=CheckingStore(tracker),
        engine=engine,
        task_ordering="key",
        task_max_concurrency=6,
    )
    result = c.run()
    tracker.check_order()  # "a" and "b" checked as one lane: never two outstanding
    assert result.committed[ssp(0)] == 119
    assert tracker.max_seen >= 2  # "c" and "d" still ran beside the collided lane


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_window_and_commit_barriers_with_lanes_in_flight(engine: str) -> None:
    """rules 8, 9, 31: window and commit wait for every outstanding message of the task."""
    tracker = Tracker(16)
    windows: list[int] = []
    base = make_async(tracker, 9, delay=0.004)

    class WithWindow(base):  # type: ignore[misc, valid-type]
        def window(self, collector: Any, coordinator: Any) -> None:
            windows.append(tracker.outstanding)
            if tracker.outstanding:
                tracker.errors.append(f"window with {tracker.outstanding} outstanding")

        def process_async(self, env: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if env.offset % 97 == 0:
                coordinator.commit()
            super().process_async(env, collector, coordinator, callback)

    keys = [f"k{i % 13}" for i in range(600)]
    c = Container(
        WithWindow,
        inputs=["mem.in"],
        systems=[keyed_system([keys])],
        checkpoints=CheckingStore(tracker),
        engine=engine,
        task_ordering="key",
        task_max_concurrency=16,
        task_window_ms=5,
        task_commit_ms=7,
    )
    result = c.run()
    tracker.check_order()
    assert windows, "no window ran"
    assert result.committed[ssp(0)] == 599
    assert next(iter(result.tasks.values())).commits >= 2


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_shutdown_with_lanes_in_flight(engine: str) -> None:
    """rule 19: a stop while lanes are in flight waits for them; the final commit is gap-free."""
    tracker = Tracker(8)
    keys = [f"k{i % 5}" for i in range(5000)]
    task = make_async(tracker, 11, delay=0.003)
    store = CheckingStore(tracker)
    c = Container(
        task,
        inputs=["mem.in"],
        systems=[keyed_system([keys])],
        checkpoints=store,
        engine=engine,
        task_ordering="key",
        task_max_concurrency=8,
    )
    bg = Background(c)
    wait_until(lambda: len(tracker.invoked) > 100, what="dispatch")
    c.stop()
    result = bg.join(WAIT)
    tracker.check_order()
    assert result.reason == "stop"
    assert tracker.outstanding == 0
    done = tracker.completed[0]
    committed = result.committed[ssp(0)]
    assert all(o in done for o in range(committed + 1))
    assert result.processed < 5000


def test_ordering_config_rejects_unknown_value() -> None:
    with pytest.raises(ConfigError) as e:
        Container(
            make_sync(Tracker(1), 0), inputs=["mem.in"], systems=[keyed_system([[]])], task_ordering="offset"
        )
    assert "task.ordering" in str(e.value) and "partition, key" in str(e.value)


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_live_stream_keyed(engine: str) -> None:
    """rules 30, 31 on a live source (envelopes polled, not a range): order per key, gap-free."""
    tracker = Tracker(4)
    system = MemorySystem().add_live_stream("in", 1)
    task = make_async(tracker, 21, delay=0.002)
    c = Container(
        task,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=CheckingStore(tracker),
        engine=engine,
        task_ordering="key",
        task_max_concurrency=4,
        task_input_buffer_size=8,
    )
    bg = Background(c)
    rng = random.Random(2)
    for i in range(300):
        system.append("in", 0, i, key=rng.choice([None, "x", "y", "z"]))
    system.end("in", 0)
    result = bg.join()
    tracker.check_order()
    assert result.committed[ssp(0)] == 299


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_failure_with_lanes_in_flight(engine: str) -> None:
    """rules 16, 18 with key lanes: the failure stops the run; nothing at or past the
    failed offset is committed, even though later keys completed."""
    from tailrace import TaskError

    tracker = Tracker(8)
    keys = [f"k{i % 7}" for i in range(200)]
    base = make_async(tracker, 4, delay=0.002)

    class Failing(base):  # type: ignore[misc, valid-type]
        def process_async(self, env: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if env.offset == 40:
                tracker.start(0, env.key, 40)

                def fail() -> None:
                    with tracker.lock:  # resolved (failed), not completed: no gap filled
                        tracker.per_task[0] -= 1
                        tracker.active.pop((0, env.key), None)
                    callback.fail(RuntimeError("boom at 40"))

                threading.Timer(0.05, fail).start()  # others complete meanwhile
                return
            super().process_async(env, collector, coordinator, callback)

    store = CheckingStore(tracker)
    c = Container(
        Failing,
        inputs=["mem.in"],
        systems=[keyed_system([keys])],
        checkpoints=store,
        engine=engine,
        task_ordering="key",
        task_max_concurrency=8,
        task_commit_ms=5,
    )
    with pytest.raises(TaskError) as e:
        c.run()
    assert e.value.offset == 40
    tracker.check_order()
    assert all(offsets.get(ssp(0), -1) < 40 for _, offsets in store.history)  # rule 18


@pytest.mark.parametrize("pool", [1, 2])
def test_a_sync_keyed_task_on_the_pool_runs_its_messages_in_offset_order(engine: str, pool: int) -> None:
    """rules 21, 30: a task's pool thread runs its messages one at a time, so handing them
    over in offset order keeps every key in order; nothing is taken ahead of a waiting key."""
    order: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 0:
                time.sleep(0.05)  # a: busy while the dispatcher looks at the rest
            order.append(envelope.offset)

    keys = ["a", "a", "b", "c", "a", "d", "b"]
    result = Container(
        Task,
        inputs=["mem.in"],
        systems=[keyed_system([keys])],
        engine=engine,
        task_ordering="key",
        task_max_concurrency=4,
        job_container_thread_pool_size=pool,
    ).run()
    assert order == list(range(len(keys)))
    assert result.committed == {ssp(0): len(keys) - 1}


def test_a_stop_of_a_keyed_pool_task_with_a_store_commits_it_and_replays_nothing(engine: str) -> None:
    """rules 19, 26, 30: the final commit of a graceful stop writes state and offsets, so the
    restart processes each message exactly once (the C loop's look-ahead left it uncommittable)."""
    keys = [f"k{(i * 7) % 37}" for i in range(3000)]
    calls: list[int] = []

    class Counts(StreamTask):
        def init(self, context: Any) -> None:
            self.counts = context.store("counts")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            calls.append(envelope.offset)
            self.counts[envelope.key] = self.counts.get(envelope.key, 0) + 1
            if envelope.offset % 97 == 0:
                time.sleep(0.002)

    checkpoints = MemoryCheckpointStore()

    def container() -> Container:
        return Container(
            Counts,
            inputs=["mem.in"],
            systems=[keyed_system([keys])],
            checkpoints=checkpoints,
            engine=engine,
            stores={"counts": {"key.serde": "str"}},
            task_ordering="key",
            task_max_concurrency=4,
            job_container_thread_pool_size=1,
            task_commit_ms=600_000,
        )

    first = container()
    bg = Background(first)
    wait_until(lambda: len(calls) > 300, what="dispatch")
    first.stop()
    result = bg.join(WAIT)
    assert result.reason == "stop" and len(calls) < len(keys)
    assert result.committed == {ssp(0): len(calls) - 1}  # everything invoked, nothing replayed
    second = container().run()
    assert second.reason == "end_of_stream"
    assert sorted(calls) == list(range(len(keys)))  # each message exactly once
    state = checkpoints.state("Partition 0", "counts", "tailrace-job", raw=True)
    assert len(state) == 37 and sum(json.loads(v) for v in state.values()) == len(keys)


@pytest.mark.parametrize("arrival", ["one by one", "at once"])
def test_the_look_ahead_is_the_whole_input_buffer_however_the_input_arrives(
    engine: str, arrival: str
) -> None:
    # rule 31 and docs/ordering.md: the loop looks ahead as far as the partition's input
    # buffer for a free key. With input arriving one message at a time both engines read on
    # only while the buffer was at most half full: a free key 9 messages behind a busy one
    # waited for it to complete, with a buffer of 16
    from tailrace.testing import TestDriver

    class Holds(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            pass  # completed by the test

    config = {"task.ordering": "key", "task.max.concurrency": 4, "task.input.buffer.size": 16}
    with TestDriver(Holds, inputs={"in": 1}, config=config, engine=engine) as driver:
        keys = ["a"] * 15 + ["b"]
        for key in keys:
            if arrival == "one by one":
                driver.send("in", "m", key=key)
            else:
                driver.system.append("in", 0, "m", key=key)
        driver.settle()
        assert [(p.offset, p.envelope.key) for p in driver.pending] == [(0, "a"), (15, "b")]
        driver.pending[1].complete()
        driver.send("in", "m", key="c")  # the buffer is full (16 from the watermark): not read
        assert [(p.offset, p.envelope.key) for p in driver.pending] == [(0, "a")]
        driver.pending[0].complete()
        driver.settle()
        assert [(p.offset, p.envelope.key) for p in driver.pending] == [(1, "a"), (16, "c")]


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_task_s_partitions_take_turns_after_a_message_that_escaped_a_run(
    engine: str, ordering: str
) -> None:
    # rule 5: one task owns in[0] and in2[0]; after in2 was served, in is next. The C loop
    # rewound its round robin to in2 (the partition of the next message when the run was
    # filled, in being empty then), so in2's second message ran before in's
    from tailrace.testing import TestDriver

    log: list[str] = []

    class Holds(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            log.append(f"{envelope.stream}:{envelope.offset}")

    config = {"task.ordering": ordering}
    with TestDriver(Holds, inputs={"in": 1, "in2": 1}, config=config, engine=engine) as d:
        d.send("in", "A0", key="x")
        d.send("in2", "B0", key="x")
        d.send("in2", "B1", key="x")
        d.pending[0].complete()  # A0 done: B0 runs
        d.send("in", "A1", key="x")
        for _ in range(3):
            d.pending[0].complete()
    assert log == ["in:0", "in2:0", "in:1", "in2:1"]


def test_a_free_key_behind_completed_messages_is_read_and_invoked(engine: str) -> None:
    # rules 30, 31: one task, two partitions, buffers of 3. in2's first two messages completed
    # but wait for the watermark behind in@2 (slow, key x); in2@2 (key y, free again) is in
    # the look-ahead and must run. The C loop never read it: in2's buffer was above half full
    # from the watermark, so no refill was queued, and the wake-up of its arrival found the
    # partition active and changed nothing
    from tailrace.testing import TestDriver

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            if (envelope.stream, envelope.offset) == ("in2", 0):
                callback.complete()

    def ids(d: Any) -> list[str]:
        return [f"{p.envelope.stream}@{p.offset}" for p in d.pending]

    config = {"task.max.concurrency": 4, "task.ordering": "key", "task.input.buffer.size": 3}
    with TestDriver(Task, inputs={"in": 1, "in2": 1}, engine=engine, config=config) as d:
        d.send("in", 0, key="z")
        d.send("in", 1, key="z")
        d.pending[0].complete()  # in@0
        d.send("in", 2, key="x")
        d.send("in2", 0, key="y")  # completed in its call
        d.send("in2", 1, key="y")
        d.send("in2", 2, key="y")
        assert ids(d) == ["in@1", "in@2", "in2@1"]
        d.pending[0].complete()  # in@1
        d.pending[1].complete()  # in2@1: key y is free
        assert ids(d) == ["in@2", "in2@2"]
