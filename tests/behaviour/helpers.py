"""Shared pieces of the behaviour tests: only the public API, real threads and timers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tailrace import Container, MemoryCheckpointStore, MemorySystem, RunResult, SystemStreamPartition
from tailrace.types import Offset

WAIT = 20.0  # generous: only reached when something is broken


def ssp(partition: int, stream: str = "in", system: str = "mem") -> SystemStreamPartition:
    return SystemStreamPartition(system, stream, partition)


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def bounded(partitions: list[list[Any]], stream: str = "in") -> MemorySystem:
    return MemorySystem().add_stream(stream, partitions)


def run_job(
    engine: str,
    task: Any,
    system: MemorySystem,
    *,
    inputs: list[str] | None = None,
    store: MemoryCheckpointStore | None = None,
    **config: Any,
) -> tuple[RunResult, MemoryCheckpointStore]:
    store = store if store is not None else MemoryCheckpointStore()
    container = Container(
        task, inputs=inputs or ["mem.in"], systems=[system], checkpoints=store, engine=engine, **config
    )
    return container.run(), store


class Background:
    """Runs a container on a thread; ``join`` returns its result or re-raises its error."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.result: RunResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="container-run", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.result = self.container.run()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            self.error = e

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = WAIT) -> RunResult:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("container did not stop")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result

    def join_error(self, timeout: float = WAIT) -> BaseException:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("container did not stop")
        assert self.error is not None, f"expected an error, got {self.result}"
        return self.error


def start(
    engine: str,
    task: Any,
    system: MemorySystem,
    *,
    inputs: list[str] | None = None,
    store: MemoryCheckpointStore | None = None,
    **config: Any,
) -> tuple[Background, MemoryCheckpointStore]:
    store = store if store is not None else MemoryCheckpointStore()
    container = Container(
        task, inputs=inputs or ["mem.in"], systems=[system], checkpoints=store, engine=engine, **config
    )
    return Background(container), store


def live_metric(bg: Background, task: str, field: str) -> Any:
    snap = bg.container.metrics()
    if snap is None:
        return None
    return getattr(snap[0][task], field)


def history_of(store: MemoryCheckpointStore, task: str) -> list[Mapping[SystemStreamPartition, Any]]:
    return [offsets for name, offsets in list(store.history) if name == task]


class HeldCallbacks:
    """Collects callbacks of an async task so the test decides when each completes."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.callbacks: dict[tuple[int, int], Any] = {}  # (partition, offset) -> callback
        self.invoked: list[tuple[int, int]] = []

    def add(self, partition: int, offset: int, callback: Any) -> None:
        with self.cond:
            self.callbacks[(partition, offset)] = callback
            self.invoked.append((partition, offset))
            self.cond.notify_all()

    def wait_for(self, *keys: tuple[int, int], timeout: float = WAIT) -> None:
        with self.cond:
            ok = self.cond.wait_for(lambda: all(k in self.callbacks for k in keys), timeout)
        assert ok, f"not invoked: {[k for k in keys if k not in self.callbacks]}"

    def complete(self, partition: int, offset: int) -> None:
        self.wait_for((partition, offset))
        self.callbacks[(partition, offset)].complete()

    def fail(self, partition: int, offset: int, exc: BaseException) -> None:
        self.wait_for((partition, offset))
        self.callbacks[(partition, offset)].fail(exc)


# -- task.ordering = key (rules 30, 31): shared by test_key_ordering and test_differential
class Tracker:
    """Invocations and completions of one run, checked as they happen."""

    def __init__(self, max_concurrency: int, collide: frozenset[Any] = frozenset()) -> None:
        self.lock = threading.Lock()
        self.max_concurrency = max_concurrency
        self.collide = collide  # keys forced to one hash: one lane
        self.active: dict[tuple[int, Any], int] = {}  # (task partition, lane) -> offset
        self.invoked: list[tuple[int, Any, int]] = []
        self.completed: dict[int, set[int]] = {}
        self.errors: list[str] = []
        self.per_task: dict[int, int] = {}  # one task per partition (the default grouping)
        self.max_seen = 0

    def lane(self, key: Any) -> Any:
        return "<collided>" if key in self.collide else key

    def start(self, partition: int, key: Any, offset: int) -> None:
        with self.lock:
            lane = (partition, self.lane(key))
            if lane in self.active:  # rule 30: at most one outstanding per key
                self.errors.append(f"key {key!r}: {offset} invoked while {self.active[lane]} outstanding")
            self.active[lane] = offset
            self.invoked.append((partition, self.lane(key), offset))
            n = self.per_task[partition] = self.per_task.get(partition, 0) + 1
            self.max_seen = max(self.max_seen, n)
            if n > self.max_concurrency:  # rule 2
                self.errors.append(f"{n} outstanding > max concurrency {self.max_concurrency}")

    def finish(self, partition: int, key: Any, offset: int) -> None:
        with self.lock:
            self.active.pop((partition, self.lane(key)), None)
            self.completed.setdefault(partition, set()).add(offset)
            self.per_task[partition] -= 1

    @property
    def outstanding(self) -> int:
        return sum(self.per_task.values())

    def check_order(self) -> None:
        assert not self.errors, self.errors[:5]
        lanes: dict[tuple[int, Any], list[int]] = {}
        for p, lane, off in self.invoked:
            lanes.setdefault((p, lane), []).append(off)
        for lane, offs in lanes.items():
            assert offs == sorted(offs), f"lane {lane}: invoked out of offset order {offs}"

    def check_commit(self, offsets: Mapping[SystemStreamPartition, Offset], barrier: bool) -> None:
        with self.lock:
            for s, off in offsets.items():
                done = self.completed.get(s.partition, set())
                missing = [o for o in range(int(off) + 1) if o not in done]
                if missing:  # rules 12, 13: a gap-free prefix of completions
                    self.errors.append(f"{s}: committed {off} but {missing[:3]} not completed")
            n = sum(self.per_task.get(s.partition, 0) for s in offsets)
            if barrier and n:  # rule 9 (no async commit): nothing of the task in flight
                self.errors.append(f"commit with {n} outstanding")


class CheckingStore(MemoryCheckpointStore):
    def __init__(self, tracker: Tracker, barrier: bool = True) -> None:
        super().__init__()
        self.tracker = tracker
        self.barrier = barrier

    def write(
        self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset], state: Any = None
    ) -> None:
        self.tracker.check_commit(offsets, self.barrier)
        super().write(task_name, offsets, state)
