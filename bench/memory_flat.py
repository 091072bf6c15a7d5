"""Issue 3's memory target: RSS flat after warm-up over 10M messages from a live source.

Producer threads ``append`` to a live MemorySystem stream (bounded: ``append``
blocks while ``--capacity`` messages wait in a partition, which is the
backpressure), a Container runs a task over it with a periodic commit
(``task.commit.ms``) into a MemoryCheckpointStore (keeping no commit history
unless ``--history-limit`` says so), and a monitor thread samples
the process RSS (``/proc/self/statm``), Python's allocated blocks
(``sys.getallocatedblocks``) and, about once a second, the gc object count.

Task variants (``--task``): ``sync`` (a StreamTask checking, per partition, that
each offset is the previous plus one and that the message is its offset) and
``async`` (the same check in ``process_async``, callbacks completed by a helper
thread, ``task.max.concurrency`` 64).

Warm-up is the first ``--warmup`` fraction of the messages (default 10%). The
report gives the RSS at the end of warm-up, the highest RSS after it, the growth
(MiB and %), and messages/s. Exit status 1 if a message was lost, duplicated or
out of order, or a final committed offset is not the last offset; a growth above
``--threshold-mib`` prints FAIL in the verdict and sets exit status 2 only with
``--fail-on-growth`` (benchmarks measure; shared machines are noisy).

    python bench/memory_flat.py [--messages 10000000] [--engine c|python] [--task sync,async] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from tailrace import AsyncStreamTask, Container, MemorySystem, StreamTask  # noqa: E402
from tailrace.memory import MemoryCheckpointStore  # noqa: E402
from tailrace.types import SystemStreamPartition  # noqa: E402

SYSTEM = "mem"
STREAM = "live"
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024.0 * 1024.0
TASKS = ("sync", "async")


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE


# -- tasks ----------------------------------------------------------------------
class _Checker:
    """Per-partition order check shared by both task variants (loop thread only)."""

    def __init__(self) -> None:
        self.count = 0
        self.next: dict[int, int] = {}
        self.errors = 0
        self.first_errors: list[str] = []

    def check(self, envelope: Any) -> None:
        p = envelope.partition
        off = envelope.offset
        want = self.next.get(p, 0)
        if off != want or envelope.message != off:
            self.errors += 1
            if len(self.first_errors) < 10:
                self.first_errors.append(
                    f"partition {p}: got offset {off!r} message {envelope.message!r}, expected {want}"
                )
        self.next[p] = off + 1
        self.count += 1


class OrderedSync(StreamTask):
    """Checks offset == previous + 1 (and message == offset) per partition; counts."""

    def __init__(self) -> None:
        self.checker = _Checker()
        self.check = self.checker.check

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.check(envelope)


class OrderedAsync(AsyncStreamTask):
    """The same check on invocation; a helper thread completes every callback."""

    def __init__(self) -> None:
        self.checker = _Checker()
        self.check = self.checker.check
        self.completed = 0
        self._pending: list[Any] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._complete_all, name="memflat-completer", daemon=True)
        self._thread.start()

    def _complete_all(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._pending and not self._closed:
                    cond.wait()
                batch, self._pending = self._pending, []
                if not batch and self._closed:
                    return
            for callback in batch:
                callback.complete()
            self.completed += len(batch)

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        self.check(envelope)
        with self._cond:
            self._pending.append(callback)
            self._cond.notify()

    def stop_completer(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)


# -- monitor --------------------------------------------------------------------
class Sample(NamedTuple):
    messages: int
    rss: int
    blocks: int
    gc_objects: int | None


class Monitor(threading.Thread):
    """Samples RSS, allocated blocks and (every ``gc_every_s``) gc object counts.

    Its own memory is bounded (it must not measure itself growing): it keeps the
    first, last, end-of-warm-up and peak samples, running maxima, and a series
    of at most ``SERIES`` samples whose stride doubles when it fills up.
    """

    SERIES = 256

    def __init__(
        self, processed: Callable[[], int], warm_n: int, every_s: float, gc_every_s: float = 1.0
    ) -> None:
        super().__init__(name="memflat-monitor", daemon=True)
        self._processed = processed
        self._warm_n = warm_n
        self._every = every_s
        self._gc_every = gc_every_s
        self._stop_event = threading.Event()
        self.first: Sample | None = None
        self.last: Sample | None = None
        self.warm: Sample | None = None  # the first sample at or after the end of warm-up
        self.peak: Sample | None = None  # the highest RSS at or after it
        self.blocks_max_after = 0
        self.gc_warm: int | None = None  # the first gc count at or after the end of warm-up
        self.gc_max_after: int | None = None
        self.series: list[Sample] = []
        self._stride = 1
        self._n = 0

    def sample(self, with_gc: bool) -> None:
        objs = len(gc.get_objects()) if with_gc else None
        s = Sample(self._processed(), rss_bytes(), sys.getallocatedblocks(), objs)
        if self.first is None:
            self.first = s
        self.last = s
        if s.messages >= self._warm_n:
            if self.warm is None:
                self.warm = s
            if self.peak is None or s.rss > self.peak.rss:
                self.peak = s
            self.blocks_max_after = max(self.blocks_max_after, s.blocks)
            if objs is not None:
                if self.gc_warm is None:
                    self.gc_warm = objs
                self.gc_max_after = objs if self.gc_max_after is None else max(self.gc_max_after, objs)
        if self._n % self._stride == 0:
            self.series.append(s)
            if len(self.series) >= self.SERIES:
                del self.series[1::2]
                self._stride *= 2
        self._n += 1

    def run(self) -> None:
        next_gc = 0.0
        while not self._stop_event.wait(self._every):
            now = time.perf_counter()
            with_gc = now >= next_gc
            if with_gc:
                next_gc = now + self._gc_every
            self.sample(with_gc)

    def finish(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample(True)
        if self.series[-1] is not self.last:
            self.series.append(self.last)  # type: ignore[arg-type]


# -- one run --------------------------------------------------------------------
@dataclass
class RunReport:
    task: str
    engine: str
    messages: int
    processed: int
    completed: int
    seconds: float
    msgs_per_s: float
    reason: str
    order_errors: int
    first_errors: list[str]
    committed_ok: bool
    commits: int
    checkpoint_history: int
    no_loss: bool
    rss_start_mib: float
    rss_warmup_mib: float
    rss_max_after_mib: float
    rss_end_mib: float
    growth_mib: float
    growth_pct: float
    blocks_warmup: int
    blocks_max_after: int
    gc_objects_warmup: int | None
    gc_objects_max_after: int | None
    memory_flat: bool
    samples: list[list[float]] = field(default_factory=list)  # [messages, rss MiB], at most 257


def split(total: int, partitions: int) -> list[int]:
    base, extra = divmod(total, partitions)
    return [base + (1 if p < extra else 0) for p in range(partitions)]


def _produce(system: MemorySystem, mine: Sequence[int], counts: Sequence[int], errors: list[str]) -> None:
    """Append 0, 1, 2, ... to each owned partition (round robin), then end them."""
    try:
        append = system.append
        left = list(mine)
        seq = 0
        while left:
            for p in left:
                append(STREAM, p, seq)
            seq += 1
            left = [p for p in left if counts[p] > seq]
        for p in mine:
            system.end(STREAM, p)
    except Exception as e:  # noqa: BLE001 - reported by the run
        errors.append(f"producer for partitions {list(mine)}: {e!r}")


def run_one(args: argparse.Namespace, task: str) -> RunReport:
    counts = split(args.messages, args.partitions)
    system = MemorySystem(SYSTEM).add_live_stream(STREAM, args.partitions, capacity=args.capacity)
    store = MemoryCheckpointStore(history_limit=args.history_limit)
    instances: list[Any] = []

    def factory() -> Any:
        inst = OrderedSync() if task == "sync" else OrderedAsync()
        instances.append(inst)
        return inst

    config: dict[str, Any] = {"job.name": "memflat", "task.commit.ms": args.commit_ms}
    if task == "async":
        config["task.max.concurrency"] = args.max_concurrency
    container = Container(
        factory,
        inputs=[f"{SYSTEM}.{STREAM}"],
        systems=[system],
        config=config,
        checkpoints=store,
        engine=args.engine,
    )

    def processed() -> int:
        return sum(i.checker.count for i in list(instances))

    producer_errors: list[str] = []
    nprod = max(1, min(args.producers, args.partitions))
    producers = [
        threading.Thread(
            target=_produce,
            args=(system, list(range(i, args.partitions, nprod)), counts, producer_errors),
            name=f"memflat-producer-{i}",
            daemon=True,
        )
        for i in range(nprod)
    ]
    gc.collect()
    monitor = Monitor(processed, int(args.messages * args.warmup), args.sample_ms / 1000.0)
    monitor.sample(True)
    monitor.start()
    t0 = time.perf_counter()
    for t in producers:
        t.start()
    try:
        result = container.run()
    finally:
        seconds = time.perf_counter() - t0
        for t in producers:
            t.join(timeout=30)
        monitor.finish()
        for inst in instances:
            if isinstance(inst, OrderedAsync):
                inst.stop_completer()

    # -- correctness
    done = processed()
    completed = sum(t.completed for t in result.tasks.values())
    order_errors = sum(i.checker.errors for i in instances)
    first_errors = [e for i in instances for e in i.checker.first_errors][:10] + producer_errors
    expected = {SystemStreamPartition(SYSTEM, STREAM, p): n - 1 for p, n in enumerate(counts) if n > 0}
    stored = store.committed("memflat")
    committed_ok = all(result.committed.get(s) == o and stored.get(s) == o for s, o in expected.items())
    if not committed_ok:
        first_errors.append(f"committed {result.committed} / stored {stored}, expected {expected}")
    no_loss = (
        done == args.messages
        and result.processed == args.messages
        and completed == args.messages
        and order_errors == 0
        and committed_ok
        and result.reason == "end_of_stream"
        and not producer_errors
    )

    # -- memory
    first, last = monitor.first, monitor.last
    assert first is not None and last is not None
    base = monitor.warm or last
    peak = monitor.peak or last
    growth = (peak.rss - base.rss) / MIB
    return RunReport(
        task=task,
        engine=args.engine,
        messages=args.messages,
        processed=done,
        completed=completed,
        seconds=seconds,
        msgs_per_s=done / seconds if seconds > 0 else 0.0,
        reason=result.reason,
        order_errors=order_errors,
        first_errors=first_errors,
        committed_ok=committed_ok,
        commits=sum(t.commits for t in result.tasks.values()),
        checkpoint_history=len(store.history),
        no_loss=no_loss,
        rss_start_mib=first.rss / MIB,
        rss_warmup_mib=base.rss / MIB,
        rss_max_after_mib=peak.rss / MIB,
        rss_end_mib=last.rss / MIB,
        growth_mib=growth,
        growth_pct=100.0 * (peak.rss - base.rss) / base.rss,
        blocks_warmup=base.blocks,
        blocks_max_after=monitor.blocks_max_after or last.blocks,
        gc_objects_warmup=monitor.gc_warm,
        gc_objects_max_after=monitor.gc_max_after,
        memory_flat=growth <= args.threshold_mib,
        samples=[[float(s.messages), round(s.rss / MIB, 3)] for s in monitor.series],
    )


def verdict(r: RunReport, threshold: float) -> str:
    flat = "PASS" if r.memory_flat else "FAIL"
    loss = "no loss" if r.no_loss else f"LOSS/ORDER FAILURE ({r.processed:,} of {r.messages:,} processed)"
    return (
        f"memory flat ({r.task}, engine {r.engine}): growth {r.growth_mib:+.1f} MiB "
        f"({r.growth_pct:+.1f}%) after warm-up over {r.messages:,} messages "
        f"({flat}, threshold {threshold:g} MiB); {loss}"
    )


def _tasks(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in TASKS]
    if bad or not names:
        what = ", ".join(bad) or repr(value)
        raise argparse.ArgumentTypeError(f"unknown task {what} (known: {', '.join(TASKS)})")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--messages", type=int, default=10_000_000, help="messages in all (default 10M)")
    ap.add_argument("--engine", choices=("c", "python"), default="c")
    ap.add_argument("--task", type=_tasks, default=["sync"], help="sync, async or sync,async (default sync)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producers", type=int, default=2, help="producer threads (partitions split among them)")
    ap.add_argument("--capacity", type=int, default=10_000, help="live partition capacity (backpressure)")
    ap.add_argument("--commit-ms", type=int, default=100, help="task.commit.ms")
    ap.add_argument(
        "--history-limit",
        type=int,
        default=0,
        help="MemoryCheckpointStore history_limit (default 0: no history, the bench measures the engine)",
    )
    ap.add_argument("--max-concurrency", type=int, default=64, help="task.max.concurrency of the async task")
    ap.add_argument("--warmup", type=float, default=0.1, help="warm-up fraction of the messages")
    ap.add_argument("--threshold-mib", type=float, default=5.0, help="allowed growth after warm-up")
    ap.add_argument("--sample-ms", type=float, default=50.0, help="monitor sampling period")
    ap.add_argument("--fail-on-growth", action="store_true", help="exit status 2 when growth > threshold")
    ap.add_argument("--json", type=Path, help="write the report as JSON here")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.partitions < 1 or args.capacity < 1 or not 0.0 <= args.warmup < 1.0:
        ap.error("--messages, --partitions, --capacity must be >= 1 and --warmup in [0, 1)")

    reports: list[RunReport] = []
    for task in args.task:
        r = run_one(args, task)
        reports.append(r)
        print(
            f"{task} on {args.engine}: {r.processed:,} messages in {r.seconds:.2f} s "
            f"({r.msgs_per_s / 1000:.1f}k msgs/s), {r.commits} commits; RSS start {r.rss_start_mib:.1f} MiB, "
            f"after warm-up {r.rss_warmup_mib:.1f} MiB, max after {r.rss_max_after_mib:.1f} MiB, "
            f"end {r.rss_end_mib:.1f} MiB; "
            f"allocated blocks {r.blocks_warmup:,} -> max {r.blocks_max_after:,}; "
            f"gc objects {r.gc_objects_warmup} -> max {r.gc_objects_max_after}"
        )
        for e in r.first_errors:
            print(f"  error: {e}")
        print(verdict(r, args.threshold_mib), flush=True)

    if args.json is not None:
        from run import machine_info

        doc = {
            "machine": machine_info([]),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "runs": [asdict(r) for r in reports],
            "no_loss": all(r.no_loss for r in reports),
            "memory_flat": all(r.memory_flat for r in reports),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if not all(r.no_loss for r in reports):
        return 1
    if args.fail_on_growth and not all(r.memory_flat for r in reports):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
