"""``async def process`` tasks through Container, on every engine (SEMANTICS.md)."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import random
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from tailrace import (
    AsyncStreamTask,
    CallbackTimeoutError,
    ConfigError,
    Container,
    MemoryCheckpointStore,
    MemorySystem,
    Scope,
    SystemStreamPartition,
    TaskContext,
    TaskError,
)
from tailrace.types import Offset


def ssp(p: int, stream: str = "in") -> SystemStreamPartition:
    return SystemStreamPartition("mem", stream, p)


class RecordingStore(MemoryCheckpointStore):
    """A real in-memory store that also records every write, with a snapshot of
    what the test's tasks had finished at that moment."""

    def __init__(self, finished: dict[SystemStreamPartition, set[int]]) -> None:
        super().__init__()
        self.finished = finished
        self.writes: list[
            tuple[str, dict[SystemStreamPartition, Offset], dict[SystemStreamPartition, set[int]]]
        ] = []
        self.lock = threading.Lock()

    def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        with self.lock:
            snap = {s: set(v) for s, v in self.finished.items()}
            self.writes.append((task_name, dict(offsets), snap))
        super().write(task_name, offsets)


# -- rules 1, 2, 12, 13: order, bound, low watermark ---------------------------------


class Shared:
    """What the tasks of one test observed (loop-thread writes; read after the run)."""

    def __init__(self) -> None:
        self.invoked: dict[SystemStreamPartition, list[int]] = {}
        self.finished: dict[SystemStreamPartition, set[int]] = {}
        self.inflight: dict[str, int] = {}
        self.max_inflight: dict[str, int] = {}


@pytest.mark.parametrize("max_concurrency", [1, 8])
def test_in_order_invocation_bounded_concurrency_under_random_sleeps(
    engine: str, max_concurrency: int
) -> None:
    # rules 1, 2, 12, 13
    rng = random.Random(1234)
    n = 240
    sleeps = {(p, o): rng.choice([0.0, 0.0, rng.random() * 0.003]) for p in range(3) for o in range(n)}
    shared = Shared()
    store = RecordingStore(shared.finished)

    class T(AsyncStreamTask):
        def init(self, context: TaskContext) -> None:
            self.name = context.task_name

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            s = env.ssp
            shared.invoked.setdefault(s, []).append(env.offset)
            cur = shared.inflight.get(self.name, 0) + 1
            shared.inflight[self.name] = cur
            shared.max_inflight[self.name] = max(shared.max_inflight.get(self.name, 0), cur)
            delay = sleeps[(env.partition, env.offset)]
            if delay:
                await asyncio.sleep(delay)
            collector.send("mem.out", (env.partition, env.offset, env.message))
            if env.offset % 50 == 49:
                coordinator.commit()
            shared.inflight[self.name] -= 1
            shared.finished.setdefault(s, set()).add(env.offset)

    mem = MemorySystem("mem").add_stream("in", [[f"m{p}-{o}" for o in range(n)] for p in range(3)])
    result = Container(
        T,
        inputs=["mem.in"],
        systems=[mem],
        checkpoints=store,
        engine=engine,
        task_max_concurrency=max_concurrency,
    ).run()

    assert result.reason == "end_of_stream"
    for p in range(3):
        assert shared.invoked[ssp(p)] == list(range(n)), "invoked in offset order, each once (rule 1)"
    for name, peak in shared.max_inflight.items():
        assert peak <= max_concurrency, f"{name}: {peak} coroutines in flight (rule 2)"
        if max_concurrency > 1:
            assert peak > 1, f"{name}: coroutines never overlapped"
    out = mem.records("out")
    got = sorted(m for _, m in out)
    assert got == sorted((p, o, f"m{p}-{o}") for p in range(3) for o in range(n)), "no loss, no duplicates"
    assert result.committed == {ssp(p): n - 1 for p in range(3)}
    # every checkpoint write is a low watermark: it and everything before it finished (rules 12, 13)
    assert store.writes
    last: dict[SystemStreamPartition, int] = {}
    for task_name, offsets, finished in store.writes:
        for s, off in offsets.items():
            assert isinstance(off, int)
            assert set(range(off + 1)) <= finished.get(s, set()), f"{task_name} committed {s}@{off} too early"
            assert off >= last.get(s, -1), "committed offset went backwards (rule 13)"
            last[s] = off


def test_contextvars_do_not_leak_between_messages(engine: str) -> None:
    var: contextvars.ContextVar[int | None] = contextvars.ContextVar("var", default=None)
    seen: list[tuple[int, int | None, int | None]] = []

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            before = var.get()
            var.set(env.offset)
            if env.offset % 2:
                await asyncio.sleep(0)
            seen.append((env.offset, before, var.get()))

    mem = MemorySystem("mem").add_stream("in", [list(range(20))])
    Container(T, inputs=["mem.in"], systems=[mem], engine=engine, task_max_concurrency=4).run()
    assert sorted(seen) == [(o, None, o) for o in range(20)]


# -- rules 8, 9, 11, 14: barriers with coroutine hooks ----------------------------------


def test_async_window_and_commit_are_barriers(engine: str) -> None:
    # rules 8, 9, 14, 21
    shared = Shared()
    store = RecordingStore(shared.finished)
    windows: list[tuple[int, int, int]] = []
    state = {"windows": 0, "processed": 0, "finished": 0}

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            state["processed"] += 1
            shared.invoked.setdefault(env.ssp, []).append(env.offset)
            await asyncio.sleep(0.0005 * (env.offset % 3))
            collector.send("mem.out", (state["windows"], env.offset))
            state["finished"] += 1
            shared.finished.setdefault(env.ssp, set()).add(env.offset)

        async def window(self, collector: Any, coordinator: Any) -> None:
            # nothing outstanding while a window runs: every invoked message finished
            windows.append((state["windows"], state["processed"], state["finished"]))
            await asyncio.sleep(0.001)
            state["windows"] += 1
            coordinator.commit()
            if state["windows"] == 3:
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    mem = MemorySystem("mem").add_live_stream("in", 1)
    for i in range(2000):
        mem.append("in", 0, i)
    result = Container(
        T,
        inputs=["mem.in"],
        systems=[mem],
        checkpoints=store,
        engine=engine,
        task_max_concurrency=4,
        task_window_ms=20,
        task_commit_ms=-1,
    ).run()

    assert result.reason == "shutdown"
    assert len(windows) == 3
    for _, processed, finished in windows:
        assert processed == finished, "window ran while a coroutine was in flight (rule 8)"
    # happens-before both ways: a message's output carries the count of windows that ran before it
    out = [m for _, m in mem.records("out")]
    by_offset = dict((o, w) for w, o in out)
    offsets = sorted(by_offset)
    assert offsets == list(range(len(offsets)))
    assert all(by_offset[a] <= by_offset[b] for a, b in itertools.pairwise(offsets))
    assert store.writes, "the window's commit request ran"
    for _, offsets_written, finished in store.writes:
        for s, off in offsets_written.items():
            assert isinstance(off, int)
            assert set(range(off + 1)) <= finished[s]


def test_async_end_of_stream_runs_once_after_everything(engine: str) -> None:
    # rule 11
    done: list[int] = []
    eos: list[list[int]] = []

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            await asyncio.sleep(0.0002 * (env.offset % 4))
            done.append(env.offset)

        async def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            await asyncio.sleep(0.001)
            eos.append(sorted(done))
            collector.send("mem.out", "eos")

    mem = MemorySystem("mem").add_stream("in", [list(range(50))])
    result = Container(T, inputs=["mem.in"], systems=[mem], engine=engine, task_max_concurrency=8).run()
    assert result.reason == "end_of_stream"
    assert eos == [list(range(50))]
    assert mem.messages("out") == ["eos"]


# -- the loop is reachable: loop-bound resources made in init, closed in close ------------


def test_init_and_close_coroutines_own_a_loop_bound_resource(engine: str) -> None:
    instances: list[Any] = []

    class EchoTask(AsyncStreamTask):
        async def init(self, context: TaskContext) -> None:
            assert asyncio.get_running_loop() is context.loop
            self.loop = context.loop

            async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                while line := await reader.readline():
                    writer.write(line.upper())
                    await writer.drain()
                writer.close()

            self.server = await asyncio.start_server(echo, "127.0.0.1", 0)
            port = self.server.sockets[0].getsockname()[1]
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
            self.lock = asyncio.Lock()
            self.closed = False
            instances.append(self)

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            assert asyncio.get_running_loop() is self.loop
            async with self.lock:  # one request/response at a time on the connection
                self.writer.write(f"{env.message}\n".encode())
                reply = await self.reader.readline()
            collector.send("mem.out", (env.offset, reply.decode().strip()))

        async def close(self) -> None:
            self.writer.close()
            await self.writer.wait_closed()
            self.server.close()
            await self.server.wait_closed()
            self.closed = True

    mem = MemorySystem("mem").add_stream("in", [[f"msg{i}" for i in range(30)], [f"x{i}" for i in range(30)]])
    Container(EchoTask, inputs=["mem.in"], systems=[mem], engine=engine, task_max_concurrency=4).run()
    assert len(instances) == 2
    for inst in instances:
        assert inst.closed
        assert not inst.server.is_serving()
        assert inst.loop.is_closed(), "the runner stopped and closed its loop"
    got = sorted(mem.messages("out"))
    want = sorted([(i, f"MSG{i}") for i in range(30)] + [(i, f"X{i}") for i in range(30)])
    assert got == want


def test_sync_hooks_see_the_loop_and_coroutine_timers_run(engine: str) -> None:
    # rule 23 with a coroutine timer function
    seen: dict[str, Any] = {}

    class T(AsyncStreamTask):
        def init(self, context: TaskContext) -> None:
            self.context = context
            seen["loop"] = context.loop
            seen["running"] = context.loop is not None and context.loop.is_running()

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            seen.setdefault("process_loop", asyncio.get_running_loop())
            if env.offset == 0:
                self.context.schedule("tick", time.time(), self.tick)

        async def tick(self, key: Any, collector: Any, coordinator: Any) -> None:
            await asyncio.sleep(0.001)
            seen["tick"] = (key, asyncio.get_running_loop())
            seen["loop_thread"] = threading.current_thread()  # resumed by the loop itself
            collector.send("mem.out", "ticked")
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

        def close(self) -> None:
            seen["closed"] = threading.current_thread() is not seen["loop_thread"]

    mem = MemorySystem("mem").add_live_stream("in", 1)
    mem.append("in", 0, "a")

    result = Container(T, inputs=["mem.in"], systems=[mem], engine=engine).run()
    assert result.reason == "shutdown"
    assert seen["running"]
    assert seen["process_loop"] is seen["loop"]
    assert seen["tick"] == ("tick", seen["loop"])
    assert mem.messages("out") == ["ticked"]
    assert seen["closed"], "a sync close runs on the engine's thread, not the loop's"


# -- rule 16: failures ------------------------------------------------------------------


async def _lookup(offset: int, errors: list[BaseException]) -> int:
    await asyncio.sleep(0.001)
    if offset == 7:
        exc = ValueError(f"lookup failed for {offset}")
        errors.append(exc)
        raise exc
    return offset * 2


@pytest.mark.parametrize("where", ["awaited", "before_first_await"])
def test_exception_surfaces_with_task_partition_offset(engine: str, where: str) -> None:
    # rules 16, 18
    errors: list[BaseException] = []
    finished: dict[SystemStreamPartition, set[int]] = {}
    store = RecordingStore(finished)

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            if where == "before_first_await" and env.offset == 7:
                exc = KeyError("no such key")
                errors.append(exc)
                raise exc
            value = await _lookup(env.offset, errors)
            collector.send("mem.out", value)
            finished.setdefault(env.ssp, set()).add(env.offset)

    mem = MemorySystem("mem").add_stream("in", [list(range(40)), list(range(40))])
    container = Container(
        T, inputs=["mem.in"], systems=[mem], checkpoints=store, engine=engine, task_max_concurrency=3
    )
    with pytest.raises(TaskError) as info:
        container.run()
    err = info.value
    assert err.offset == 7
    assert err.ssp in (ssp(0), ssp(1))
    assert err.task == f"Partition {err.ssp.partition}"
    assert err.__cause__ is not None and err.__cause__ in errors, "the original exception, not a copy"
    assert err.original is err.__cause__
    for _, offsets, _ in store.writes:
        for s, off in offsets.items():
            if s == err.ssp:
                assert isinstance(off, int) and off < 7, (
                    "nothing at or after the failed message committed (rule 18)"
                )


def test_async_init_failure_names_the_phase(engine: str) -> None:
    boom = RuntimeError("cannot connect")

    class T(AsyncStreamTask):
        async def init(self, context: TaskContext) -> None:
            await asyncio.sleep(0)
            raise boom

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            raise AssertionError("never dispatched")

    mem = MemorySystem("mem").add_stream("in", [[1, 2]])
    with pytest.raises(TaskError) as info:
        Container(T, inputs=["mem.in"], systems=[mem], engine=engine).run()
    assert info.value.phase == "init"
    assert info.value.__cause__ is boom


def test_use_uvloop_without_uvloop_is_a_config_error_before_any_task_starts(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was "task 'Partition 0' failed in init: ModuleNotFoundError", for a task with no init
    from tailrace import aio

    started: list[str] = []

    class T(AsyncStreamTask):
        def __init__(self) -> None:
            started.append("made")

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            started.append("process")

    monkeypatch.setattr(aio, "USE_UVLOOP", True)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # uvloop does not import
    mem = MemorySystem("mem").add_stream("in", [[1, 2]])
    with pytest.raises(ConfigError) as info:
        Container(T, inputs=["mem.in"], systems=[mem], engine=engine).run()
    message = str(info.value)
    assert message.startswith("tailrace.aio.USE_UVLOOP (or use_uvloop) is True, but uvloop does not import")
    assert "pip install 'tailrace[uvloop]'" in message
    assert started == ["made"]  # planned, never started
    with pytest.raises(ConfigError, match=r"tailrace\.aio\.USE_UVLOOP"):
        aio.new_event_loop(True)


def test_callback_timeout_cancels_the_coroutine(engine: str) -> None:
    # rule 16: task.callback.timeout.ms
    events: list[tuple[int, str]] = []

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            if env.offset == 3:
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    events.append((env.offset, "cancelled"))
                    raise
            events.append((env.offset, "done"))

    mem = MemorySystem("mem").add_stream("in", [list(range(10))])
    started = time.monotonic()
    with pytest.raises(CallbackTimeoutError) as info:
        Container(
            T,
            inputs=["mem.in"],
            systems=[mem],
            engine=engine,
            task_max_concurrency=2,
            task_callback_timeout_ms=150,
        ).run()
    assert time.monotonic() - started < 20, "the 30 s sleep was not waited out"
    assert info.value.offset == 3
    assert info.value.ssp == ssp(0)
    assert (3, "cancelled") in events
    assert (3, "done") not in events


# -- rule 19: cancellation on shutdown ---------------------------------------------------


def test_stop_cancels_sleeping_coroutines_and_commits_the_low_watermark(engine: str) -> None:
    # rules 13, 19
    started: list[int] = []
    cancelled: list[int] = []
    closed: list[str] = []
    finished: dict[SystemStreamPartition, set[int]] = {}
    store = RecordingStore(finished)
    ready = threading.Event()

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            started.append(env.offset)
            if env.offset >= 5:
                if len(started) >= 9:
                    ready.set()
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.append(env.offset)
                    raise
            else:
                await asyncio.sleep(0)
            finished.setdefault(env.ssp, set()).add(env.offset)

        async def close(self) -> None:
            await asyncio.sleep(0)
            closed.append("closed")

    mem = MemorySystem("mem").add_live_stream("in", 1)
    for i in range(50):
        mem.append("in", 0, i)
    container = Container(
        T,
        inputs=["mem.in"],
        systems=[mem],
        checkpoints=store,
        engine=engine,
        task_max_concurrency=4,
        task_shutdown_ms=100,
        task_commit_ms=-1,
    )

    def stopper() -> None:
        assert ready.wait(30)
        container.stop()

    th = threading.Thread(target=stopper)
    th.start()
    t0 = time.monotonic()
    result = container.run()
    th.join()
    assert time.monotonic() - t0 < 30
    assert result.reason == "stop"
    assert started == list(range(9)), "offsets 5..8 fill the four slots; nothing more is dispatched"
    assert sorted(cancelled) == [5, 6, 7, 8]
    assert closed == ["closed"]
    assert result.committed == {ssp(0): 4}, "the low watermark: 0..4 finished, 5 never did"
    assert store.committed("tailrace-job") == {ssp(0): 4}


# -- no Task for a coroutine that never suspends ------------------------------------------


def test_only_suspending_coroutines_get_an_asyncio_task(engine: str) -> None:
    created: list[str] = []
    current: list[bool] = []

    class T(AsyncStreamTask):
        async def init(self, context: TaskContext) -> None:
            loop = asyncio.get_running_loop()

            def factory(lp: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
                created.append(type(coro).__name__)
                return asyncio.Task(coro, loop=lp, **kw)

            loop.set_task_factory(factory)  # type: ignore[arg-type]

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            # a current task exists from the first line (asyncio.timeout needs one)
            current.append(asyncio.current_task() is not None)
            async with asyncio.timeout(5):
                if env.offset % 10 == 0:
                    await asyncio.sleep(0.0005)
            collector.send("mem.out", env.offset)

    mem = MemorySystem("mem").add_stream("in", [list(range(200))])
    Container(T, inputs=["mem.in"], systems=[mem], engine=engine, task_max_concurrency=16).run()
    assert sorted(mem.messages("out")) == list(range(200))
    assert all(current)
    continued = [q for q in created if q == "_Continuation"]
    assert len(continued) == 20, (
        "one Task per message that suspended (offsets 0, 10, ..., 190), none for the rest"
    )


def test_asyncio_timeout_entered_before_suspending_cancels_the_right_task(engine: str) -> None:
    outcomes: dict[int, str] = {}

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            try:
                async with asyncio.timeout(0.01 if env.offset % 2 else 5):
                    await asyncio.sleep(10 if env.offset % 2 else 0.001)
                outcomes[env.offset] = "finished"
            except TimeoutError:
                outcomes[env.offset] = "timed out"
            assert asyncio.current_task() is not None
            assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]

    mem = MemorySystem("mem").add_stream("in", [list(range(12))])
    Container(T, inputs=["mem.in"], systems=[mem], engine=engine, task_max_concurrency=12).run()
    assert outcomes == {o: "timed out" if o % 2 else "finished" for o in range(12)}


class IgnoresCancellation(AsyncStreamTask):
    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if envelope.offset != 3:
            return
        while True:  # swallows every cancellation
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass


def test_a_coroutine_that_ignores_cancellation_is_waited_for_once(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/asyncio.md: coroutines that ignore cancellation are abandoned after
    # CANCEL_GRACE_S with a warning; the runner's own shutdown does not wait for them again
    from tailrace import aio

    monkeypatch.setattr(aio, "CANCEL_GRACE_S", 1.0)
    mem = MemorySystem().add_live_stream("in", 1)
    for i in range(6):
        mem.append("in", 0, i)
    c = Container(
        IgnoresCancellation,
        inputs=["mem.in"],
        systems=[mem],
        engine=engine,
        task_max_concurrency=4,
        task_shutdown_ms=200,
    )
    threading.Timer(0.3, c.stop).start()
    started = time.monotonic()
    result = c.run()
    took = time.monotonic() - started
    assert result.committed == {ssp(0): 2}  # the low watermark: offset 3 never completed
    assert took < 0.3 + 0.2 + 2 * 1.0 - 0.2, f"the stop took {took:.2f} s: the coroutine was waited for twice"


def _run_within(container: Container, seconds: float = 20.0) -> Any:
    """container.run() on a thread; a run that does not end in ``seconds`` fails the test."""
    out: dict[str, Any] = {}

    def main() -> None:
        try:
            out["result"] = container.run()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    th = threading.Thread(target=main, daemon=True)
    th.start()
    th.join(seconds)
    if th.is_alive():
        container.stop()
        raise AssertionError(f"the run did not end within {seconds} s (a message never completed)")
    if "error" in out:
        raise out["error"]
    return out["result"]


@pytest.mark.parametrize("how", ["timeout0", "self_cancel"])
def test_a_cancellation_before_the_task_s_first_step_reaches_the_await(engine: str, how: str) -> None:
    # docs/asyncio.md: asyncio.timeout() and current_task() work from the first line; a
    # cancellation that reached the continuing Task before its first step killed it
    # unstarted: the message never completed and the container never ended
    seen: list[tuple[str, int]] = []

    class T(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            if how == "timeout0":
                try:
                    async with asyncio.timeout(0):
                        await asyncio.sleep(1)
                except TimeoutError:
                    seen.append(("timed out", env.offset))
            else:
                task = asyncio.current_task()
                assert task is not None
                task.cancel()
                try:
                    await asyncio.sleep(1)
                except asyncio.CancelledError:
                    seen.append(("cancelled", env.offset))
                    task.uncancel()
            collector.send("mem.out", env.offset)

    mem = MemorySystem("mem").add_stream("in", [[0, 1, 2]])
    result = _run_within(Container(T, inputs=["mem.in"], systems=[mem], engine=engine))
    assert result.reason == "end_of_stream"
    assert mem.messages("out") == [0, 1, 2]
    assert [o for _, o in seen] == [0, 1, 2]


@pytest.mark.parametrize("style", ["async_def", "callback"])
def test_a_call_that_holds_the_loop_thread_past_the_callback_timeout_fails(engine: str, style: str) -> None:
    # rule 16: a message completed inline, after blocking before any await, is as late as
    # a sync call that returns late (only the await path was timed out)
    if style == "async_def":

        class T(AsyncStreamTask):
            async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
                if env.offset == 1:
                    time.sleep(0.3)
    else:

        class T(AsyncStreamTask):  # type: ignore[no-redef]
            def process_async(self, env: Any, collector: Any, coordinator: Any, callback: Any) -> None:
                if env.offset == 1:
                    time.sleep(0.3)
                callback.complete()

    mem = MemorySystem("mem").add_stream("in", [[0, 1, 2]])
    store = MemoryCheckpointStore()
    with pytest.raises(CallbackTimeoutError) as info:
        Container(
            T,
            inputs=["mem.in"],
            systems=[mem],
            checkpoints=store,
            engine=engine,
            task_callback_timeout_ms=100,
        ).run()
    assert info.value.offset == 1 and "task.callback.timeout.ms=100" in str(info.value)
    assert store.committed("tailrace-job").get(ssp(0)) in (None, 0)


def test_a_stream_task_with_async_def_process_runs_on_the_loop(engine: str) -> None:
    # docs/asyncio.md: a task whose process is a coroutine function runs on the container's
    # loop; a StreamTask subclass ran it as a sync process (coroutines never awaited, their
    # offsets committed: the messages were lost)
    from tailrace import StreamTask

    class T(StreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:  # type: ignore[override]
            await asyncio.sleep(0)
            collector.send("mem.out", env.message)

    mem = MemorySystem("mem").add_stream("in", [["a", "b", "c"]])
    result = Container(T, inputs=["mem.in"], systems=[mem], engine=engine).run()
    assert mem.messages("out") == ["a", "b", "c"]
    assert result.committed == {ssp(0): 2}


@pytest.mark.parametrize("style", ["sync", "callback"])
def test_async_def_hooks_of_a_task_without_async_def_process_are_refused(engine: str, style: str) -> None:
    # docs/asyncio.md: coroutine hooks run only for a task with async def process; any other
    # task called them, got coroutines, never ran them, and the run "succeeded" (timers its
    # async init set never existed)
    from tailrace import ConfigError, StreamTask

    ran: list[str] = []

    class Sync(StreamTask):
        async def init(self, context: Any) -> None:  # type: ignore[override]
            ran.append("init")

        def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            ran.append("process")

        async def end_of_stream(self, collector: Any, coordinator: Any) -> None:  # type: ignore[override]
            ran.append("eos")

    class Callback(AsyncStreamTask):
        def process_async(self, env: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            ran.append("process")
            callback.complete()

        async def close(self) -> None:  # type: ignore[override]
            ran.append("close")

    mem = MemorySystem("mem").add_stream("in", [["a"]])
    with pytest.raises(ConfigError, match=r"async def.*only a task with async def process\(\)") as info:
        task = Sync if style == "sync" else Callback
        Container(task, inputs=["mem.in"], systems=[mem], engine=engine).run()
    assert ("init(), end_of_stream()" if style == "sync" else "close()") in str(info.value)
    assert ran == []


def test_an_async_def_timer_of_a_sync_task_is_refused_at_schedule(engine: str) -> None:
    from tailrace import StreamTask

    class Sync(StreamTask):
        def init(self, context: Any) -> None:
            self.context = context

        def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            self.context.schedule("t", self.context.now(), self.fire)

        async def fire(self, key: Any, collector: Any, coordinator: Any) -> None:
            pass

    mem = MemorySystem("mem").add_stream("in", [["a"]])
    with pytest.raises(TaskError) as info:
        Container(Sync, inputs=["mem.in"], systems=[mem], engine=engine).run()
    assert isinstance(info.value.__cause__, TypeError)
    assert "timer callback for key 't' is an async def" in str(info.value.__cause__)


@pytest.mark.parametrize("debug", [False, True])
def test_each_message_has_its_own_current_task_which_is_done_once_it_is(engine: str, debug: bool) -> None:
    # docs/asyncio.md: current_task() works from the first line of process; the queued path
    # (always taken in asyncio debug mode) gave every message that finished without suspending
    # the same object, never done
    seen: list[tuple[int, bool, bool | None]] = []

    class T(AsyncStreamTask):
        async def init(self, context: TaskContext) -> None:
            asyncio.get_running_loop().set_debug(debug)
            self.prev: Any = None

        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            me = asyncio.current_task()
            prev = self.prev
            seen.append((env.offset, prev is me, None if prev is None else prev.done()))
            self.prev = me

    mem = MemorySystem("mem").add_stream("in", [[0, 1, 2, 3]])
    Container(T, inputs=["mem.in"], systems=[mem], engine=engine, task_max_concurrency=4).run()
    assert seen == [(0, False, None), (1, False, True), (2, False, True), (3, False, True)]


def test_coroutines_that_ignore_cancellation_cost_one_grace_for_all_tasks(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/asyncio.md: abandoned after CANCEL_GRACE_S; each of N tasks waited its own grace
    from tailrace import aio

    monkeypatch.setattr(aio, "CANCEL_GRACE_S", 0.5)

    class Stubborn(AsyncStreamTask):
        async def process(self, env: Any, collector: Any, coordinator: Any) -> None:
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    pass

    mem = MemorySystem("mem").add_live_stream("in", 4)
    for p in range(4):
        mem.append("in", p, "x")
    c = Container(Stubborn, inputs=["mem.in"], systems=[mem], engine=engine, task_shutdown_ms=100)
    threading.Timer(0.3, c.stop).start()
    began = time.monotonic()
    result = c.run()
    assert result.reason == "stop"
    assert time.monotonic() - began < 0.3 + 0.1 + 0.5 + 0.6  # one grace, not four (2 s)


class MixedSleeps(AsyncStreamTask):
    """Completions on both threads: coroutines that finish without suspending complete on
    the dispatch thread, the others on the asyncio loop's; "hang" never finishes in time."""

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        kind = envelope.message
        if kind == "commit":
            coordinator.commit(Scope.CURRENT_TASK)
        elif kind == "hang":
            await asyncio.sleep(30)
        elif kind:
            await asyncio.sleep(kind / 1000)


def test_a_callback_timeout_fires_when_completions_of_both_threads_interleave(engine: str) -> None:
    # rule 16: a coroutine past task.callback.timeout.ms fails the run. The C loop released a
    # message once it had seen as many completions as messages before it: an inline completion
    # could stand for an earlier one still on its way from the asyncio thread, whose late
    # arrival then marked a later message's timeout slot done. That message's timeout never
    # fired (the adapter had cancelled its coroutine) and the run hung: about one run in five
    messages = [[0, "commit", 5, "hang", 1], [None, 5, None, 0]]
    config = {
        "task.max.concurrency": 2,
        "task.commit.ms": 20,
        "task.input.buffer.size": 2,
        "task.callback.timeout.ms": 100,
        "task.shutdown.ms": 200,
    }
    for _ in range(12):
        system = MemorySystem().add_stream("a", [messages[0]]).add_stream("b", [messages[1]])
        c = Container(MixedSleeps, inputs=["mem.a", "mem.b"], systems=[system], engine=engine, config=config)
        box: dict[str, BaseException] = {}

        def run(c: Container = c, box: dict[str, BaseException] = box) -> None:
            try:
                c.run()
            except BaseException as e:  # noqa: BLE001 - checked below
                box["error"] = e

        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(10)
        assert not th.is_alive(), "the run hung: the timed-out callback's timeout never fired"
        assert isinstance(box.get("error"), CallbackTimeoutError), box
