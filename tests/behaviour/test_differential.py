"""Differential property test: random jobs on every engine give identical results.

A job has 1-3 tasks (one partition each), 0-12 messages per partition, a max
concurrency, commit requests at chosen offsets, and optionally one way to end
early (shutdown ALL, a failed callback, an exception from process). Completion
order is driven by the test, deterministically: for an async task a driver
thread waits until the task's next batch (max concurrency messages, or what is
left) has been invoked, then completes the batch in an order permuted by a
seeded RNG. When the job ends early (shutdown or a failed callback), or
requests commits without ``task.async.commit``, the last invocation of each
batch waits inside ``process_async`` until the driver has resolved the whole
batch. Completed while the loop is free, part of a batch could let an engine
invoke the next message before the rest arrives: rule 14 then makes how far
invocation goes depend on thread timing, and a commit barrier (rule 9) would
wait for that message while the driver waits for its batch to fill. Completed
while the loop is inside the call, every engine sees the whole batch before it
can dispatch again. Each run is also checked against a model of what SEMANTICS.md
prescribes, and against invariants: outstanding <= max concurrency (rule 2),
committed offsets never past an incomplete message (rules 12, 13, 18) and
never going backwards (rule 13).

The first engine also runs twice, so the test pins determinism even when only
one engine is installed.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tailrace import (
    AsyncStreamTask,
    Container,
    MemoryCheckpointStore,
    MemorySystem,
    Scope,
    StreamTask,
    SystemStreamPartition,
    TaskError,
)

from .conftest import ENGINE_NAMES
from .helpers import CheckingStore, Tracker, ssp


class Boom(Exception):
    pass


@dataclass(frozen=True)
class Job:
    kind: str  # "async" or "sync"
    sizes: tuple[int, ...]  # messages per task (task i owns partition i)
    max_concurrency: int
    pool: int
    buffer: int
    async_commit: bool
    commits: frozenset[tuple[int, int]]  # (task, offset) requesting commit(CURRENT_TASK)
    eos_commit: bool
    end: str  # "none", "shutdown", "fail", "raise"
    end_at: tuple[int, int]
    seed: int


@st.composite
def jobs(draw: Any) -> Job:
    kind = draw(st.sampled_from(["async", "sync"]))
    end = draw(st.sampled_from(["none", "none", "shutdown", "fail", "raise"]))
    if kind == "sync" and end == "fail":
        end = "raise"
    # Shutdown ALL with several tasks would stop the others at timing-dependent points.
    n_tasks = 1 if end == "shutdown" else draw(st.integers(1, 3))
    sizes = tuple(draw(st.lists(st.integers(0, 12), min_size=n_tasks, max_size=n_tasks)))
    end_task = draw(st.integers(0, n_tasks - 1))
    end_at = (end_task, draw(st.integers(0, max(0, sizes[end_task] - 1))))
    if end != "none" and sizes[end_task] == 0:
        end = "none"
    commits = draw(st.frozensets(st.tuples(st.integers(0, n_tasks - 1), st.integers(0, 11)), max_size=4))
    return Job(
        kind=kind,
        sizes=sizes,
        max_concurrency=draw(st.integers(1, 4)) if kind == "async" else 1,
        pool=draw(st.integers(0, 2)) if kind == "sync" else 0,
        buffer=draw(st.integers(1, 6)),
        async_commit=draw(st.booleans()),
        commits=commits,
        eos_commit=draw(st.booleans()),
        end=end,
        end_at=end_at,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@dataclass
class Outcome:
    reason: str | None
    error: tuple[str, str, int | None] | None  # (class name, task, offset)
    invoked: dict[int, list[int]]
    history: dict[str, list[dict[SystemStreamPartition, Any]]]
    committed: dict[SystemStreamPartition, Any]
    outputs: dict[int, list[Any]]
    violations: list[str] = field(default_factory=list)


class Driver:
    """Completes async callbacks batch by batch, in a seeded permuted order."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.cond = threading.Condition()
        n = len(job.sizes)
        self.pending: dict[int, list[tuple[int, Any]]] = {t: [] for t in range(n)}
        self.completed: dict[int, set[int]] = {t: set() for t in range(n)}  # completed successfully
        self.resolved = dict.fromkeys(range(n), 0)  # callbacks taken into batches
        self.finished = dict.fromkeys(range(n), 0)  # callbacks completed or failed
        self.batches = dict.fromkeys(range(n), 0)
        self.violations: list[str] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._main, daemon=True)

    def invoked(self, task: int, offset: int, callback: Any) -> None:
        with self.cond:
            if len(self.pending[task]) >= self.job.max_concurrency:
                self.violations.append(f"task {task}: more than max concurrency outstanding at {offset}")
            self.pending[task].append((offset, callback))
            self.cond.notify_all()

    def wait_batch_resolved(self, task: int, offset: int) -> None:
        """From the invocation of ``offset``: when it completes a batch, wait until that batch is resolved."""
        last = min(self.job.sizes[task], batch_end(self.job, offset) + 1) - 1
        if offset != last:
            return
        with self.cond:
            if not self.cond.wait_for(lambda: self.finished[task] > offset or self.stopped, 10):
                self.violations.append(f"task {task}: batch ending at {offset} not resolved within 10 s")

    def completed_sync(self, task: int, offset: int) -> None:
        with self.cond:
            self.completed[task].add(offset)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(10)

    def _ready(self) -> int | None:
        for t, pending in self.pending.items():
            expected = min(self.job.max_concurrency, self.job.sizes[t] - self.resolved[t])
            if pending and len(pending) == expected:
                return t
        return None

    def _main(self) -> None:
        while True:
            with self.cond:
                t = self._ready()
                while t is None:
                    if self.stopped:
                        return
                    self.cond.wait(0.05)
                    t = self._ready()
                batch, self.pending[t] = self.pending[t], []
                self.resolved[t] += len(batch)
                number = self.batches[t]
                self.batches[t] += 1
            random.Random(f"{self.job.seed}/{t}/{number}").shuffle(batch)
            for offset, callback in batch:
                if self.job.end == "fail" and (t, offset) == self.job.end_at:
                    callback.fail(Boom(f"fail {t}/{offset}"))
                else:
                    with self.cond:
                        self.completed[t].add(offset)
                    callback.complete()
                with self.cond:
                    self.finished[t] += 1
                    self.cond.notify_all()


def run_once(job: Job, engine: str) -> Outcome:
    driver = Driver(job)
    invoked: dict[int, list[int]] = {t: [] for t in range(len(job.sizes))}
    system = MemorySystem().add_stream("in", [list(range(n)) for n in job.sizes])
    system.set_output_partitions("out", len(job.sizes))

    def act(task: int, offset: int, coordinator: Any) -> None:
        invoked[task].append(offset)
        if (task, offset) in job.commits:
            coordinator.commit(Scope.CURRENT_TASK)
        if (task, offset) == job.end_at:
            if job.end == "shutdown":
                coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)
            elif job.end == "raise":
                raise Boom(f"raise {task}/{offset}")

    class Hooks:
        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            collector.send("mem.out", "eos", partition=self.index)  # type: ignore[attr-defined]
            if job.eos_commit:
                coordinator.commit()

    class AsyncTask(Hooks, AsyncStreamTask):
        def init(self, context: Any) -> None:
            self.index = context.partitions[0].partition

        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            act(self.index, envelope.offset, coordinator)
            collector.send("mem.out", envelope.offset, partition=self.index)
            driver.invoked(self.index, envelope.offset, callback)
            if job.end in ("shutdown", "fail") or (job.commits and not job.async_commit):
                driver.wait_batch_resolved(self.index, envelope.offset)

    class SyncTask(Hooks, StreamTask):
        def init(self, context: Any) -> None:
            self.index = context.partitions[0].partition

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            act(self.index, envelope.offset, coordinator)
            collector.send("mem.out", envelope.offset, partition=self.index)
            driver.completed_sync(self.index, envelope.offset)

    violations: list[str] = []

    class CheckingStore(MemoryCheckpointStore):
        def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Any]) -> None:
            last = self.committed()
            with driver.cond:
                for part, off in offsets.items():
                    done = driver.completed[part.partition]
                    if not all(o in done for o in range(off + 1)):
                        violations.append(f"{task_name}: committed {part} {off} past an incomplete message")
                    if off < last.get(part, -1):
                        violations.append(f"{task_name}: committed {part} went back to {off}")
            super().write(task_name, offsets)

    store = CheckingStore()
    container = Container(
        AsyncTask if job.kind == "async" else SyncTask,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=store,
        engine=engine,
        task_max_concurrency=job.max_concurrency,
        job_container_thread_pool_size=job.pool,
        task_input_buffer_size=job.buffer,
        task_async_commit=job.async_commit,
        task_commit_ms=-1,
        task_shutdown_ms=5000,
    )
    driver.thread.start()
    reason: str | None = None
    error = None
    try:
        reason = container.run().reason
    except TaskError as e:
        error = (type(e).__name__, e.task, e.offset)
    finally:
        driver.stop()
    history: dict[str, list[dict[SystemStreamPartition, Any]]] = {}
    for name, offsets in store.history:
        history.setdefault(name, []).append(offsets)
    sent = bool(system.messages("out"))
    outputs = {t: system.messages("out", t) if sent else [] for t in range(len(job.sizes))}
    return Outcome(
        reason,
        error,
        invoked,
        history,
        store.committed(container.config.job_name),
        outputs,
        violations + driver.violations,
    )


def batch_end(job: Job, offset: int) -> int:
    """The last offset of the async batch containing ``offset``."""
    mc = job.max_concurrency
    return (offset // mc + 1) * mc - 1


def check_model(job: Job, out: Outcome) -> None:
    """What SEMANTICS.md prescribes for this job, independent of any engine."""
    assert out.violations == []
    end_task, end_offset = job.end_at
    for t, n in enumerate(job.sizes):
        assert out.invoked[t] == list(range(len(out.invoked[t])))  # rule 1: a prefix, in order
        committed = out.committed.get(ssp(t), -1)
        assert committed <= len(out.invoked[t]) - 1
        if job.end == "none":
            assert out.invoked[t] == list(range(n))
            assert committed == n - 1  # rule 19: the final commit covers everything
            assert out.outputs[t] == [*range(n), "eos"]
    if job.end in ("none", "shutdown"):
        for t in range(len(job.sizes)):
            # rules 14, 15, 19: each requested commit writes exactly its offset, in order;
            # the final commit (or the end-of-stream one) writes the last released offset
            last = len(out.invoked[t]) - 1
            expected = {k for tt, k in job.commits if tt == t and k <= last} | (
                {last} if last >= 0 else set()
            )
            assert [h[ssp(t)] for h in out.history.get(f"Partition {t}", [])] == sorted(expected)
    if job.end == "none":
        assert (out.reason, out.error) == ("end_of_stream", None)
    elif job.end == "shutdown":
        last = min(job.sizes[0] - 1, batch_end(job, end_offset) if job.kind == "async" else end_offset)
        assert (out.reason, out.error) == ("shutdown", None)
        assert out.invoked[0] == list(range(last + 1))
        assert out.committed[ssp(0)] == last
    else:
        name = f"Partition {end_task}"
        assert out.reason is None
        assert out.error == ("TaskError", name, end_offset)
        assert out.committed.get(ssp(end_task), -1) < end_offset  # rule 18
        if job.end == "raise":
            assert out.invoked[end_task] == list(range(end_offset + 1))
        else:
            assert out.invoked[end_task] == list(
                range(min(job.sizes[end_task], batch_end(job, end_offset) + 1))
            )


def comparable(job: Job, out: Outcome) -> Any:
    """The parts of an outcome that must be identical across engines."""
    if job.end in ("fail", "raise"):
        # Other tasks stop at timing-dependent points, and the failing task's
        # watermark depends on when the failure was seen.
        return (out.error, out.invoked[job.end_at[0]])
    return (out.reason, out.invoked, out.history, out.committed, out.outputs)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs())
def test_engines_agree_on_random_jobs(job: Job) -> None:
    # rules 1, 2, 11, 12, 13, 14, 15, 16, 18, 19 on random jobs, every engine
    runs = [*ENGINE_NAMES, ENGINE_NAMES[0]]
    outcomes = []
    for engine in runs:
        out = run_once(job, engine)
        check_model(job, out)
        outcomes.append(comparable(job, out))
    for engine, got in zip(runs[1:], outcomes[1:]):
        assert got == outcomes[0], f"{engine} differs from {runs[0]}"


# -- state stores (rules 25-27): every engine ends with the same state, the fold of the input
@dataclass(frozen=True)
class StateJob:
    kind: str  # "sync" or "async"
    keys: tuple[tuple[int, ...], ...]  # per task, the key of each message
    max_concurrency: int
    pool: int
    cache_size: int
    commits: frozenset[tuple[int, int]]  # (task, offset) requesting commit(CURRENT_TASK)
    stop_at: int | None  # offset of task 0 that requests shutdown ALL (then a rerun)
    seed: int


@st.composite
def state_jobs(draw: Any) -> StateJob:
    kind = draw(st.sampled_from(["async", "sync"]))
    n_tasks = draw(st.integers(1, 3))
    keys = tuple(tuple(draw(st.lists(st.integers(0, 5), max_size=30))) for _ in range(n_tasks))
    stop_at = draw(st.none() | st.integers(0, 29))
    if stop_at is not None and stop_at >= len(keys[0]):
        stop_at = None
    return StateJob(
        kind=kind,
        keys=keys,
        max_concurrency=draw(st.integers(1, 4)) if kind == "async" else 1,
        pool=draw(st.integers(0, 2)) if kind == "sync" else 0,
        cache_size=draw(st.integers(1, 8)),
        commits=draw(st.frozensets(st.tuples(st.integers(0, n_tasks - 1), st.integers(0, 29)), max_size=4)),
        stop_at=stop_at,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def run_stateful(job: StateJob, engine: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Run (and, after a shutdown, rerun) a per-key counting job; the committed state and
    offsets of every task. Checks rule 26 after the first run."""
    store = MemoryCheckpointStore()
    rng = random.Random(job.seed)
    delays = [rng.uniform(0, 0.002) for _ in range(32)]

    def act(counts: Any, lock: threading.Lock, task: int, offset: int, coordinator: Any) -> None:
        with lock:
            k = f"k{job.keys[task][offset]}"
            counts[k] = counts.get(k, 0) + 1
        if (task, offset) in job.commits:
            coordinator.commit(Scope.CURRENT_TASK)
        if task == 0 and offset == job.stop_at and first_run:
            coordinator.shutdown(Scope.ALL_TASKS_IN_CONTAINER)

    class Base:
        def init(self, context: Any) -> None:
            self.index = context.partitions[0].partition
            self.counts = context.store("counts")
            self.lock = threading.Lock()

        def end_of_stream(self, collector: Any, coordinator: Any) -> None:
            self.counts["eos"] = 1  # runs again on a rerun at end of stream: idempotent

    class SyncTask(Base, StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            act(self.counts, self.lock, self.index, envelope.offset, coordinator)

    class AsyncTask(Base, AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            act(self.counts, self.lock, self.index, envelope.offset, coordinator)
            threading.Timer(delays[envelope.offset % 32], callback.complete).start()

    def decoded(task: int) -> dict[str, Any]:
        return {
            k.decode(): int(v)
            for k, v in store.state(f"Partition {task}", "counts", "tailrace-job", raw=True).items()
        }

    first_run = True
    for _ in range(2):
        system = MemorySystem().add_stream("in", [list(k) for k in job.keys])
        Container(
            AsyncTask if job.kind == "async" else SyncTask,
            inputs=["mem.in"],
            systems=[system],
            checkpoints=store,
            engine=engine,
            stores={"counts": {"key.serde": "str", "cache.size": job.cache_size}},
            task_max_concurrency=job.max_concurrency,
            job_container_thread_pool_size=job.pool,
            task_commit_ms=-1,
        ).run()
        committed = store.committed("tailrace-job")
        for t, keys in enumerate(job.keys):
            upto = committed.get(ssp(t), -1)
            fold = Counter(f"k{k}" for k in keys[: upto + 1])
            got = {k: v for k, v in decoded(t).items() if k != "eos"}
            assert got == dict(fold), (engine, t, upto)  # rule 26: state of exactly the committed prefix
        if job.stop_at is None:
            break
        first_run = False
    offsets = {str(s): o for s, o in store.committed("tailrace-job").items()}
    return [decoded(t) for t in range(len(job.keys))], offsets


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=state_jobs())
def test_engines_agree_on_stateful_jobs(job: StateJob) -> None:
    # rules 25, 26, 27 on random jobs: identical final state on every engine, the fold of the input
    results = [run_stateful(job, engine) for engine in ENGINE_NAMES]
    assert all(r == results[0] for r in results[1:])
    states, _ = results[0]
    for t, keys in enumerate(job.keys):
        expected: dict[str, int] = dict(Counter(f"k{k}" for k in keys))
        expected["eos"] = 1
        assert states[t] == expected


# -- task.ordering = key (rules 30, 31): the same per-key outcome on every engine
@dataclass(frozen=True)
class KeyedJob:
    kind: str  # "async", "sync" or "sync_pool"
    keys: tuple[tuple[Any, ...], ...]  # per task (one partition each), the key of each message
    max_concurrency: int
    buffer: int
    commits: frozenset[tuple[int, int]]  # (task, offset) requesting commit(CURRENT_TASK)
    seed: int


@st.composite
def keyed_jobs(draw: Any) -> KeyedJob:
    n_tasks = draw(st.integers(1, 2))
    keys = tuple(
        tuple(draw(st.lists(st.sampled_from([None, "a", "b", "c", 4]), max_size=25))) for _ in range(n_tasks)
    )
    return KeyedJob(
        kind=draw(st.sampled_from(["async", "sync", "sync_pool"])),
        keys=keys,
        max_concurrency=draw(st.integers(1, 5)),
        buffer=draw(st.integers(1, 8)),
        commits=draw(st.frozensets(st.tuples(st.integers(0, n_tasks - 1), st.integers(0, 24)), max_size=4)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def run_keyed(job: KeyedJob, engine: str) -> Any:
    """Completions from timer threads in seeded-random delays (async), or on the pool:
    interleavings differ between runs and engines, the per-key outcome may not."""
    tracker = Tracker(job.max_concurrency)
    rng = random.Random(job.seed)
    lock = threading.Lock()
    system = MemorySystem().add_stream(
        "in", [list(range(len(k))) for k in job.keys], keys=[list(k) for k in job.keys]
    )
    system.set_output_partitions("out", len(job.keys))

    def act(env: Any, collector: Any, coordinator: Any) -> None:
        p, off = env.ssp.partition, env.offset
        tracker.start(p, env.key, off)
        collector.send("mem.out", (env.key, off), partition=p)
        if (p, off) in job.commits:
            coordinator.commit(Scope.CURRENT_TASK)

    class KeyedSync(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            act(envelope, collector, coordinator)
            tracker.finish(envelope.ssp.partition, envelope.key, envelope.offset)

    class KeyedAsync(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            act(envelope, collector, coordinator)
            with lock:
                delay = rng.random() * 0.003

            def done() -> None:
                tracker.finish(envelope.ssp.partition, envelope.key, envelope.offset)
                callback.complete()

            threading.Timer(delay, done).start()

    store = CheckingStore(tracker)
    result = Container(
        KeyedAsync if job.kind == "async" else KeyedSync,
        inputs=["mem.in"],
        systems=[system],
        checkpoints=store,
        engine=engine,
        task_ordering="key",
        task_max_concurrency=job.max_concurrency,
        task_input_buffer_size=job.buffer,
        job_container_thread_pool_size=2 if job.kind == "sync_pool" else 0,
    ).run()
    tracker.check_order()  # rule 30 per key, rule 2, rules 12-13 on every commit
    per_key: dict[tuple[int, Any], list[int]] = {}
    for p in range(len(job.keys)):
        for key, off in system.messages("out", p) if job.keys[p] else []:
            per_key.setdefault((p, repr(key)), []).append(off)
    return (result.reason, result.processed, result.committed, per_key)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=keyed_jobs())
def test_engines_agree_on_keyed_jobs(job: KeyedJob) -> None:
    # rules 30, 31 (+ 2, 12, 13): every engine gives each key its messages in offset order
    outcomes = [run_keyed(job, engine) for engine in ENGINE_NAMES]
    for got in outcomes:
        per_key = got[3]
        for (p, key), offs in per_key.items():
            assert offs == sorted(offs), f"partition {p} key {key}: {offs}"
        for p, k in enumerate(job.keys):
            if k:
                assert got[2][ssp(p)] == len(k) - 1
    for engine, got in zip(ENGINE_NAMES[1:], outcomes[1:]):
        assert got == outcomes[0], f"{engine} differs from {ENGINE_NAMES[0]}"
