"""The adapter and its loop, driven by hand (no engine): what the engines cannot
show from outside, e.g. that a cancelled coroutine never resolves its callback."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tailrace import AsyncStreamTask, TaskContext, aio
from tailrace._core import make_envelopes
from tailrace.api import Collector, Coordinator
from tailrace.collector import Collector as RealCollector
from tailrace.config import parse_config
from tailrace.metrics import TaskMetrics
from tailrace.systems import MemorySystem
from tailrace.types import SystemStreamPartition


class Recorder:
    """A callback that records its resolutions (the engines' own callbacks make a
    second resolution an error; this one lets the test see it)."""

    def __init__(self) -> None:
        self.resolutions: list[tuple[str, BaseException | None]] = []
        self.done = threading.Event()

    def complete(self) -> None:
        self.resolutions.append(("complete", None))
        self.done.set()

    def fail(self, exc: BaseException) -> None:
        self.resolutions.append(("fail", exc))
        self.done.set()


class NoTimers:
    def schedule(self, key: Any, when: float, fn: Callable[..., Any]) -> None:
        raise AssertionError("not used")

    def cancel(self, key: Any) -> bool:
        return False


SSP = SystemStreamPartition("mem", "in", 0)


def make(task: Any, **config: Any) -> tuple[aio.AsyncioTask, aio.AsyncioRunner, Collector]:
    runner = aio.AsyncioRunner()
    adapter = aio.AsyncioTask(task, runner, parse_config(**config))
    adapter.init(
        TaskContext("Partition 0", [SSP], parse_config(), NoTimers(), lambda: TaskMetrics("Partition 0"))
    )
    mem = MemorySystem("mem")
    return adapter, runner, RealCollector({"mem": mem.producer()})


@pytest.fixture
def closing() -> Iterator[list[aio.AsyncioRunner]]:
    runners: list[aio.AsyncioRunner] = []
    yield runners
    for r in runners:
        r.close()


def envelopes(n: int) -> list[Any]:
    return make_envelopes("mem", "in", 0, 0, list(range(n)))


def test_inline_completion_and_failure_resolve_once_in_order(closing: list[aio.AsyncioRunner]) -> None:
    order: list[int] = []
    boom = ValueError("bad message 3")

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            order.append(env.offset)
            if env.offset == 3:
                raise boom

    adapter, runner, collector = make(T())
    closing.append(runner)
    cbs = [Recorder() for _ in range(10)]
    for env, cb in zip(envelopes(10), cbs):
        adapter.process_async(env, collector, Coordinator(), cb)
    for cb in cbs:
        assert cb.done.wait(10)
    assert order == list(range(10))
    assert [cb.resolutions for i, cb in enumerate(cbs) if i != 3] == [[("complete", None)]] * 9
    assert cbs[3].resolutions == [("fail", boom)]
    adapter.close()
    assert not runner.running


def test_submissions_wake_the_loop_once_per_burst_not_per_message(closing: list[aio.AsyncioRunner]) -> None:
    # rule 1 across both paths: inline steps while the loop idles, the queue while it
    # is busy (and until that queue is drained), inline again afterwards
    order: list[int] = []

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            order.append(env.offset)

    adapter, runner, collector = make(T())
    closing.append(runner)
    drains = 0
    inner = runner._drain

    def counting_drain() -> None:
        nonlocal drains
        drains += 1
        inner()

    runner._drain = counting_drain  # type: ignore[method-assign]
    n = 3000
    envs = envelopes(n)
    cbs = [Recorder() for _ in range(n)]
    coordinator = Coordinator()
    for env, cb in zip(envs[:1000], cbs[:1000]):
        adapter.process_async(env, collector, coordinator, cb)
    busy, gate = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        gate.wait(10)

    runner.loop.call_soon_threadsafe(hold)
    assert busy.wait(10)
    for env, cb in zip(envs[1000:2000], cbs[1000:2000]):
        adapter.process_async(env, collector, coordinator, cb)
    assert drains <= 1 and len(runner._pending) == 1000, "the busy loop got them queued"
    before = drains
    gate.set()
    for cb in cbs[:2000]:
        assert cb.done.wait(10)
    # the whole burst queued while the loop was busy took one wake-up (at most one more
    # if the first submission's wake-up ran before the hold), not one per message
    assert drains - before <= 2, f"{drains - before} loop wake-ups for a burst of 1000"
    for env, cb in zip(envs[2000:], cbs[2000:]):
        adapter.process_async(env, collector, coordinator, cb)
    for cb in cbs:
        assert cb.done.wait(10)
    assert all(cb.resolutions == [("complete", None)] for cb in cbs)
    assert order == list(range(n))
    adapter.close()


def test_inline_steps_own_the_loop_and_wake_it_for_what_they_scheduled(
    closing: list[aio.AsyncioRunner], loop_kind: str
) -> None:
    # a coroutine that never suspends may still schedule work on the loop: a timer,
    # a background task; it must run although nothing else wakes the idle loop
    fired = threading.Event()
    background = threading.Event()
    seen: list[tuple[bool, bool]] = []

    async def bg() -> None:
        await asyncio.sleep(0)
        background.set()

    tasks: set[asyncio.Task[None]] = set()

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            loop = asyncio.get_running_loop()
            seen.append((loop is runner.loop, asyncio.current_task() is not None))
            if env.offset == 0:
                loop.call_later(0.005, fired.set)
            else:
                t = asyncio.create_task(bg())
                tasks.add(t)
                t.add_done_callback(tasks.discard)

    adapter, runner, collector = make(T())
    closing.append(runner)
    time.sleep(0.05)  # let the loop settle into select with no timer pending
    for env in envelopes(2):
        cb = Recorder()
        adapter.process_async(env, collector, Coordinator(), cb)
        assert cb.done.wait(10) and cb.resolutions == [("complete", None)]
        assert asyncio.events._get_running_loop() is None, "this thread's running loop is restored"
    assert fired.wait(5), "the timer made by an inline step fired"
    assert background.wait(5), "the task made by an inline step ran"
    assert seen == [(True, True), (True, True)]
    if loop_kind == "asyncio":  # the settled selector loop was free for the first one
        assert runner._stepper.steps >= 1
    adapter.close()


def test_inline_and_loop_thread_never_run_coroutine_code_at_once(closing: list[aio.AsyncioRunner]) -> None:
    # the dispatch thread steps new coroutines while the loop thread resumes older
    # ones: never both at once (time.sleep(0) hands the GIL over mid-section)
    active = 0
    overlaps: list[int] = []
    rng = random.Random(7)
    delays = [rng.choice([0.0, 0.0, 0.0005, 0.002]) for _ in range(600)]

    def section(offset: int) -> None:
        nonlocal active
        active += 1
        if active != 1:
            overlaps.append(offset)
        time.sleep(0)
        active -= 1

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            section(env.offset)
            if delays[env.offset]:
                await asyncio.sleep(delays[env.offset])
                section(env.offset)

    adapter, runner, collector = make(T())
    closing.append(runner)
    cbs = [Recorder() for _ in range(600)]
    window = 16  # what task.max.concurrency would allow
    for i, (env, cb) in enumerate(zip(envelopes(600), cbs)):
        if i >= window:
            assert cbs[i - window].done.wait(10)
        adapter.process_async(env, collector, Coordinator(), cb)
    for cb in cbs:
        assert cb.done.wait(10)
    assert overlaps == []
    adapter.close()


@pytest.mark.parametrize("swallow", [False, True])
def test_timeout_cancels_and_never_resolves(closing: list[aio.AsyncioRunner], swallow: bool) -> None:
    seen: list[str] = []
    finished = threading.Event()

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError as e:
                seen.append(str(e.args[0]) if e.args else "")
                if not swallow:
                    raise
            finally:
                finished.set()

    adapter, runner, collector = make(T(), task_callback_timeout_ms=50)
    closing.append(runner)
    cb = Recorder()
    adapter.process_async(envelopes(1)[0], collector, Coordinator(), cb)
    assert finished.wait(10)
    time.sleep(0.05)  # a resolution, if any were made, would have landed by now
    assert len(seen) == 1 and "task.callback.timeout.ms" in seen[0]
    assert cb.resolutions == [], "the engine reports the timeout; the adapter must not resolve (rule 17)"
    adapter.close()


def test_close_cancels_in_flight_runs_async_close_and_stops_the_loop(
    closing: list[aio.AsyncioRunner],
) -> None:
    cancelled: list[int] = []
    started = threading.Semaphore(0)
    log: list[str] = []

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            started.release()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(env.offset)
                raise

        async def close(self) -> None:
            log.append(f"close, {len(cancelled)} cancelled before")

    adapter, runner, collector = make(T())
    closing.append(runner)
    cbs = [Recorder() for _ in range(4)]
    for env, cb in zip(envelopes(4), cbs):
        adapter.process_async(env, collector, Coordinator(), cb)
    for _ in range(4):
        assert started.acquire(timeout=10)
    loop = runner.loop
    adapter.close()
    assert sorted(cancelled) == [0, 1, 2, 3]
    assert log == ["close, 4 cancelled before"]
    assert all(cb.resolutions == [] for cb in cbs)
    assert not runner.running and loop.is_closed()


def test_runner_close_without_adapter_close_abandons_quietly(closing: list[aio.AsyncioRunner]) -> None:
    started = threading.Event()

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            started.set()
            await asyncio.sleep(30)

    adapter, runner, collector = make(T())
    cb = Recorder()
    adapter.process_async(envelopes(1)[0], collector, Coordinator(), cb)
    assert started.wait(10)
    runner.close()
    assert not runner.running
    assert cb.resolutions == []
    runner.close()  # idempotent


def test_loop_choice(loop_kind: str) -> None:
    runner = aio.AsyncioRunner()
    try:
        loop = runner.loop
        is_uvloop = type(loop).__module__.startswith("uvloop")
        assert is_uvloop == (loop_kind == "uvloop")
    finally:
        runner.close()
    if importlib.util.find_spec("uvloop") is not None:
        assert type(aio.new_event_loop(None)).__module__.startswith("uvloop")
    plain = aio.new_event_loop(False)
    try:
        assert not type(plain).__module__.startswith("uvloop")
    finally:
        plain.close()


def test_run_from_the_loop_thread_is_refused(closing: list[aio.AsyncioRunner]) -> None:
    runner = aio.AsyncioRunner()
    closing.append(runner)

    async def inner() -> int:
        return 1

    async def outer() -> str:
        try:
            runner.run(inner())
        except RuntimeError as e:
            return str(e)
        return "no error"

    assert "loop thread" in runner.run(outer())
