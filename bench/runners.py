"""What runs a workload: a tailrace engine, the bare-loop floor, or a peer framework.

Each runner's ``run(workload, messages)`` processes about ``messages`` messages
once and returns how many it processed and the wall seconds that took (the
timed region is the run itself; building the input is outside it). It raises
BenchError when the run finished but the result shows a lost or duplicated
message, and Unsupported when a guarded workload is refused by the engine.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from workloads import KEYS, Workload, payload, split

if TYPE_CHECKING:
    from tailrace.container import EngineName

FLOOR_BLOCK = 200_000  # envelopes built once and replayed by the floor loop
STREAM = "in"
SYSTEM = "bench"


class BenchError(Exception):
    """A run finished wrongly (lost/duplicated messages, wrong end state, timeout)."""


class Unsupported(Exception):
    """The engine refused a guarded workload (the note says why)."""


class Runner:
    """Base: a named way of running workloads."""

    name = ""
    kind = ""  # "engine", "floor" or "peer"

    def unavailable(self) -> str | None:
        """Why this runner cannot run here (a note to print), or None."""
        return None

    def supports(self, workload: Workload) -> bool:
        return True

    def max_messages(self, cap: int) -> int:
        """Largest message count per run, given the suite's cap on input sizes."""
        return cap

    def run(self, workload: Workload, messages: int, timeout: float) -> tuple[int, float]:
        raise NotImplementedError

    def version(self) -> str | None:
        return None


def _release(tasks: Sequence[Any]) -> None:
    """Close every task again: the bench tasks' close() is idempotent, and a run that
    failed may not have closed them (ThreadAsync's helper thread would linger)."""
    for task in tasks:
        close = getattr(task, "close", None)
        if close is not None:
            close()


class TailraceRunner(Runner):
    """``tailrace.Container(..., engine=name).run()`` over a MemorySystem stream."""

    kind = "engine"

    def __init__(self, engine: EngineName) -> None:
        self.name = engine
        self.engine: EngineName = engine

    def unavailable(self) -> str | None:
        try:
            from tailrace.container import load_engine

            load_engine(self.name)
        except Exception as e:  # noqa: BLE001 - any import failure means "not built yet"
            return f"engine {self.name!r} is not importable here ({type(e).__name__}: {e})"
        return None

    def run(self, workload: Workload, messages: int, timeout: float) -> tuple[int, float]:
        import tailrace

        counts = split(messages, workload.partitions)
        keys = None if workload.keys is None else [workload.keys(0, c) for c in counts]
        mem = tailrace.MemorySystem(SYSTEM).add_stream(STREAM, [payload(0, c) for c in counts], keys=keys)
        tasks: list[Any] = []

        def factory() -> Any:
            task = workload.task()
            tasks.append(task)
            return task

        try:
            container = tailrace.Container(
                factory,
                inputs=[f"{SYSTEM}.{STREAM}"],
                systems=[mem],
                config=dict(workload.config),
                engine=self.engine,
            )
            fired = threading.Event()

            def on_timeout() -> None:
                fired.set()
                container.stop()

            watchdog = threading.Timer(timeout, on_timeout)
            watchdog.daemon = True
            gc.collect()
            watchdog.start()
            try:
                t0 = time.perf_counter()
                try:
                    result = container.run()
                except Exception as e:
                    if workload.guard is not None:
                        raise Unsupported(f"{workload.guard} ({type(e).__name__}: {e})") from e
                    raise
                seconds = time.perf_counter() - t0
            finally:
                watchdog.cancel()
            if fired.is_set():
                raise BenchError(
                    f"stopped by the {timeout:.0f}s watchdog, processed {result.processed} of {messages}"
                )
            if result.reason != "end_of_stream":
                raise BenchError(f"run ended with reason {result.reason!r}, expected 'end_of_stream'")
            if result.processed != messages:
                raise BenchError(f"processed {result.processed} messages, expected {messages}")
            for ssp, offset in result.committed.items():
                if offset != counts[ssp.partition] - 1:
                    raise BenchError(
                        f"{ssp} committed offset {offset!r} at end of stream, "
                        f"expected {counts[ssp.partition] - 1}"
                    )
            if workload.check is not None:
                problem = workload.check(tasks, counts)
                if problem is not None:
                    raise BenchError(problem)
            return messages, seconds
        finally:
            _release(tasks)


class _NullCallback:
    __slots__ = ()

    def complete(self) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        raise exc


def _drive_sync_one(proc: Callable[..., Any], envs: list[Any], reps: int, col: Any, coord: Any) -> None:
    for _ in range(reps):
        for env in envs:
            proc(env, col, coord)


def _drive_sync(calls: list[tuple[Callable[..., Any], Any]], reps: int, col: Any, coord: Any) -> None:
    for _ in range(reps):
        for proc, env in calls:
            proc(env, col, coord)


def _drive_async(calls: list[tuple[Callable[..., Any], Any]], reps: int, col: Any, coord: Any) -> None:
    cb = _NullCallback()
    for _ in range(reps):
        for proc, env in calls:
            proc(env, col, coord, cb)


def _drive_asyncio(calls: list[tuple[Callable[..., Any], Any]], reps: int, col: Any, coord: Any) -> None:
    for _ in range(reps):
        for proc, env in calls:
            coro = proc(env, col, coord)
            try:
                coro.send(None)
            except StopIteration:
                continue
            coro.close()
            raise BenchError("a coroutine suspended: the asyncio floor only fits tasks that never await")


class FloorRunner(Runner):
    """A bare Python loop calling the task's own process with prebuilt arguments.

    Envelopes (at most FLOOR_BLOCK, from ``tailrace._core.make_envelopes``, the
    same payload as the engines get) are built once per workload, interleaved
    round robin across the workload's tasks, and replayed until ``messages``
    calls were made. One collector and one coordinator serve every call.
    """

    name = "floor"
    kind = "floor"

    def __init__(self) -> None:
        self._blocks: dict[tuple[str, int], tuple[list[Any], list[tuple[Callable[..., Any], Any]]]] = {}

    def unavailable(self) -> str | None:
        try:
            from tailrace._core import make_envelopes  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"tailrace._core is not importable ({type(e).__name__}: {e})"
        return None

    def supports(self, workload: Workload) -> bool:
        return workload.floor is not None

    def max_messages(self, cap: int) -> int:
        return 50 * cap  # replays one block: no input list grows with the count

    def _block(
        self, workload: Workload, messages: int
    ) -> tuple[list[Any], list[tuple[Callable[..., Any], Any]]]:
        from tailrace._core import make_envelopes

        size = max(workload.partitions, min(messages, FLOOR_BLOCK))
        key = (workload.name, size)
        block = self._blocks.get(key)
        if block is None:
            self._blocks.clear()
            tasks = [workload.task() for _ in range(workload.partitions)]
            attr = "process_async" if workload.floor == "async" else "process"
            per_part = [
                make_envelopes(SYSTEM, STREAM, p, 0, payload(0, c))
                for p, c in enumerate(split(size, workload.partitions))
            ]
            procs = [getattr(t, attr) for t in tasks]
            calls = []
            for i in range(max(len(e) for e in per_part)):
                for p, envs in enumerate(per_part):
                    if i < len(envs):
                        calls.append((procs[p], envs[i]))
            block = (tasks, calls)
            self._blocks[key] = block
        return block

    def run(self, workload: Workload, messages: int, timeout: float) -> tuple[int, float]:
        from tailrace._core import Coordinator
        from tailrace.collector import Collector

        tasks, calls = self._block(workload, messages)
        reps = max(1, round(messages / len(calls)))
        col = Collector({})
        coord = Coordinator()
        gc.collect()
        if workload.floor == "sync" and workload.partitions == 1:
            proc = calls[0][0]
            envs = [env for _, env in calls]
            t0 = time.perf_counter()
            _drive_sync_one(proc, envs, reps, col, coord)
        elif workload.floor == "sync":
            t0 = time.perf_counter()
            _drive_sync(calls, reps, col, coord)
        elif workload.floor == "async":
            t0 = time.perf_counter()
            _drive_async(calls, reps, col, coord)
        elif workload.floor == "asyncio":
            t0 = time.perf_counter()
            _drive_asyncio(calls, reps, col, coord)
        else:
            raise ValueError(f"workload {workload.name}: unknown floor driver {workload.floor!r}")
        seconds = time.perf_counter() - t0
        counted = sum(sum(t.counts.values()) for t in tasks if hasattr(t, "counts"))
        if counted:
            # Counter tasks keep state across replays of the block: reset for the next run.
            for t in tasks:
                t.counts.clear()
            if counted != reps * len(calls):
                raise BenchError(f"floor counted {counted} messages, expected {reps * len(calls)}")
        return reps * len(calls), seconds


class BytewaxRunner(Runner):
    """bytewax: TestingSource -> map (identity) -> TestingSink, run with ``run_main``.

    Measured on ``sync_noop_1task`` only (one worker, one input partition); the
    source emits batches of 1024, like tailrace's default input buffer.
    """

    name = "bytewax"
    kind = "peer"
    WORKLOADS = frozenset({"sync_noop_1task"})

    def unavailable(self) -> str | None:
        try:
            importlib.import_module("bytewax.testing")
        except Exception as e:  # noqa: BLE001
            return f"bytewax is not installed ({type(e).__name__}: {e}); `pip install bytewax` to measure it"
        return None

    def version(self) -> str | None:
        try:
            return importlib.metadata.version("bytewax")
        except importlib.metadata.PackageNotFoundError:
            return None

    def supports(self, workload: Workload) -> bool:
        return workload.name in self.WORKLOADS

    def run(self, workload: Workload, messages: int, timeout: float) -> tuple[int, float]:
        import bytewax.operators as op
        from bytewax.dataflow import Dataflow
        from bytewax.testing import TestingSink, TestingSource, run_main

        data = payload(0, messages)
        out: list[Any] = []
        flow = Dataflow("tailrace_bench")
        stream = op.input("in", flow, TestingSource(data, batch_size=1024))
        mapped = op.map("noop", stream, _identity)
        op.output("out", mapped, TestingSink(out))
        gc.collect()
        t0 = time.perf_counter()
        run_main(flow)
        seconds = time.perf_counter() - t0
        if len(out) != messages or out[-1] != KEYS[(messages - 1) % len(KEYS)]:
            raise BenchError(f"bytewax emitted {len(out)} messages, expected {messages}")
        return messages, seconds


def _identity(x: Any) -> Any:
    return x


def all_runners() -> dict[str, Runner]:
    """Every runner by name, in table order: engines, floor, peers."""
    runners: list[Runner] = [TailraceRunner("c"), TailraceRunner("python"), FloorRunner(), BytewaxRunner()]
    return {r.name: r for r in runners}
