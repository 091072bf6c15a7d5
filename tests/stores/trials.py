"""Seeded kill -9 trials of a stateful job (rules 20, 26, 27): per-key counts over
sequence-numbered input, state and checkpoints in SQLite.

Each trial runs the job in a forked child process (no interpreter start-up: a trial
costs tens of milliseconds), kills it with SIGKILL at a seeded random point (after a
random number of processed messages, or before anything ran), checks that the
committed state equals the fold of exactly the committed input prefix (rule 26: no
message above the committed offsets counted, none at or below them missed), then
repeats with a random number of further kills and finally runs the job to its end:
the final state must equal the fold of the whole input.

Task kinds: ``sync`` (process on the loop thread), ``pool`` (sync process on
``job.container.thread.pool.size`` threads), ``async`` (callbacks completed from a
worker thread, max concurrency 4) and ``asyncio`` (``async def process``).

Used by test_kill_trials.py (a few dozen fast trials) and state_stress.py (hundreds).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailrace import AsyncStreamTask, Container, MemorySystem, StreamTask
from tailrace.sqlite import SqliteCheckpointStore

JOB = "state-trials"
KINDS = ("sync", "pool", "async", "asyncio")


def make_input(partitions: int, records: int, keys: int, seed: int) -> list[list[dict[str, Any]]]:
    """Sequence-numbered records with seeded keys (so each key is hit from every partition)."""
    rng = random.Random(seed)
    return [
        [{"k": f"k{rng.randrange(keys)}", "p": p, "seq": i} for i in range(records)]
        for p in range(partitions)
    ]


def fold(data: list[list[dict[str, Any]]], upto: dict[int, int]) -> dict[int, dict[str, int]]:
    """Per partition (= task), the counts of the records with seq <= upto[p]."""
    return {p: dict(Counter(r["k"] for r in recs[: upto.get(p, -1) + 1])) for p, recs in enumerate(data)}


# -- the job (runs in the child) -------------------------------------------------------------
class _Progress:
    """Messages processed so far, shared with the parent through a pipe-free counter."""

    value: Any = None


def _count(store: Any, key: str) -> None:
    store[key] = store.get(key, 0) + 1


class SyncCounter(StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        _count(self.counts, envelope.message["k"])
        _Progress.value.value += 1


class AsyncCounter(AsyncStreamTask):
    """Completes from worker threads (two, so completions arrive out of order);
    concurrent messages of one task guard the read-modify-write themselves (rule 21)."""

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")
        self.lock = threading.Lock()
        self.work: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        for _ in range(2):
            threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self) -> None:
        while True:
            envelope, callback = self.work.get()
            with self.lock:
                _count(self.counts, envelope.message["k"])
            _Progress.value.value += 1
            callback.complete()

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        self.work.put((envelope, callback))


class AsyncioCounter:
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        _count(self.counts, envelope.message["k"])
        _Progress.value.value += 1


def _container(
    kind: str, engine: str, data: list[list[dict[str, Any]]], db: Path, commit_ms: int
) -> Container:
    system = MemorySystem("mem").add_stream("in", data)
    task: Any = {"sync": SyncCounter, "pool": SyncCounter, "async": AsyncCounter, "asyncio": AsyncioCounter}[
        kind
    ]
    config: dict[str, Any] = {"job.name": JOB, "task.commit.ms": commit_ms, "task.input.buffer.size": 64}
    if kind == "pool":
        config["job.container.thread.pool.size"] = 2
    if kind == "async":
        config["task.max.concurrency"] = 4
    return Container(
        task,
        inputs=["mem.in"],
        systems=[system],
        config=config,
        checkpoints=SqliteCheckpointStore(db),
        engine=engine,
        stores={"counts": {"key.serde": "str", "value.serde": "int", "cache.size": 8}},
    )


def _child(
    kind: str, engine: str, data: list[list[dict[str, Any]]], db: str, commit_ms: int, progress: Any
) -> None:
    _Progress.value = progress
    try:
        _container(kind, engine, data, Path(db), commit_ms).run()
    except BaseException as e:  # noqa: BLE001 - reported through the exit code
        print(f"trial child failed: {e!r}", flush=True)
        os._exit(3)
    os._exit(0)


# -- the parent -------------------------------------------------------------------------------
def committed(db: Path, partitions: int) -> tuple[dict[int, int], dict[int, dict[str, int]]]:
    """Committed offsets per partition (-1: none) and committed counts per task."""
    store = SqliteCheckpointStore(db)
    offsets = {p: -1 for p in range(partitions)}
    state: dict[int, dict[str, int]] = {p: {} for p in range(partitions)}
    if not db.exists():
        return offsets, state
    store.open(JOB)
    try:
        for p in range(partitions):
            task = f"Partition {p}"
            for ssp, off in store.load(task).items():
                assert isinstance(off, int)
                offsets[ssp.partition] = off
            state[p] = {
                k.decode(): int.from_bytes(v, "big") - (1 << 63) for k, v in store.state_scan(task, "counts")
            }
    finally:
        store.close()
    return offsets, state


@dataclass
class TrialResult:
    kills: int
    mid_run_kills: int  # kills that landed after some progress and before the end
    errors: list[str]


def run_trial(
    root: Path,
    kind: str,
    engine: str,
    rng: random.Random,
    *,
    partitions: int = 2,
    records: int = 1000,
    keys: int = 40,
    commit_ms: int = 3,
    max_kills: int = 3,
) -> TrialResult:
    """Kill -9 the job 1..max_kills times at seeded points, check every committed state
    against the fold of its committed prefix, run to the end, check the final state."""
    ctx = multiprocessing.get_context("fork")
    root.mkdir(parents=True, exist_ok=True)
    db = root / "checkpoints.db"
    data = make_input(partitions, records, keys, rng.randrange(1 << 30))
    total = partitions * records
    errors: list[str] = []
    kills = mid = 0
    for _ in range(rng.randint(1, max_kills)):
        progress = ctx.Value("l", 0, lock=False)
        proc = ctx.Process(target=_child, args=(kind, engine, data, str(db), commit_ms, progress))
        proc.start()
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.05))  # maybe before anything committed
        else:
            target = rng.randrange(1, max(2, total // 3))
            deadline = time.monotonic() + 20
            while progress.value < target and proc.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0005)
        done = progress.value
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        if proc.exitcode not in (0, -signal.SIGKILL):
            errors.append(f"run {kills} exited with {proc.exitcode}")
            return TrialResult(kills, mid, errors)
        kills += 1
        mid += 0 < done and proc.exitcode == -signal.SIGKILL
        offsets, state = committed(db, partitions)
        expected = fold(data, offsets)
        for p in range(partitions):
            if state[p] != expected[p]:
                errors.append(
                    f"after kill {kills}: task {p} committed at seq {offsets[p]} holds state "
                    f"{_diff(state[p], expected[p])} (rule 26)"
                )
    proc = ctx.Process(
        target=_child, args=(kind, engine, data, str(db), commit_ms, ctx.Value("l", 0, lock=False))
    )
    proc.start()
    proc.join(60)
    if proc.exitcode != 0:
        errors.append(f"the final run exited with {proc.exitcode}")
        return TrialResult(kills, mid, errors)
    offsets, state = committed(db, partitions)
    if offsets != {p: records - 1 for p in range(partitions)}:
        errors.append(f"the final run committed {offsets}, not every record")
    expected = fold(data, {p: records - 1 for p in range(partitions)})
    for p in range(partitions):
        if state[p] != expected[p]:
            errors.append(f"final state of task {p}: {_diff(state[p], expected[p])}")
    return TrialResult(kills, mid, errors)


def _diff(got: dict[str, int], want: dict[str, int]) -> str:
    wrong = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    return json.dumps(dict(sorted(wrong.items())[:5])) + f" ({len(wrong)} keys differ: got, want)"
