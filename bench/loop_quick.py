"""Quick run-loop figures (not a test): per-message cost of the C engine vs a bare loop.

python bench/loop_quick.py [N]
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Any

from tailrace import AsyncStreamTask, Container, MemorySystem, StreamTask
from tailrace._core import Coordinator, make_envelopes
from tailrace.collector import Collector

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000


class Noop(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        pass


class AsyncInline(AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        callback.complete()


def floor() -> float:
    envs = make_envelopes("mem", "in", 0, 0, list(range(N)))
    task, coll, coord = Noop(), Collector({}), Coordinator()
    process = task.process
    t0 = time.perf_counter()
    for e in envs:
        process(e, coll, coord)
    return (time.perf_counter() - t0) / N


def run(task: Any, partitions: int, n: int, **cfg: Any) -> float:
    per = n // partitions
    system = MemorySystem().add_stream("in", [list(range(per)) for _ in range(partitions)])
    c = Container(task, inputs=["mem.in"], systems=[system], engine="c", **cfg)
    t0 = time.perf_counter()
    r = c.run()
    dt = time.perf_counter() - t0
    assert r.processed == per * partitions, r.processed
    return dt / (per * partitions)


class Helper:
    """Completes callbacks from one helper thread."""

    def __init__(self) -> None:
        self.q: deque[Any] = deque()
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self.main, daemon=True)
        self.t.start()

    def main(self) -> None:
        while True:
            with self.cv:
                while not self.q:
                    self.cv.wait()
                items = list(self.q)
                self.q.clear()
            for cb in items:
                cb.complete()


helper = Helper()


class AsyncHelper(AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        with helper.cv:
            helper.q.append(callback)
            helper.cv.notify()


def main() -> None:
    f = floor()
    print(f"floor (bare python loop)            {f * 1e9:8.0f} ns/msg")
    s1 = run(Noop, 1, N)
    print(f"sync no-op, 1 task, loop thread      {s1 * 1e9:8.0f} ns/msg  ({s1 / f:.1f}x floor)")
    s1024 = run(Noop, 1024, N)
    print(f"sync no-op, 1024 tasks               {s1024 * 1e9:8.0f} ns/msg  ({s1024 / s1:.2f}x 1 task)")
    a = run(AsyncInline, 1, N)
    print(f"async, completed inline              {a * 1e9:8.0f} ns/msg  ({a / s1:.2f}x sync)")
    h = run(AsyncHelper, 1, N // 2, task_max_concurrency=64)
    print(f"async, helper thread, concurrency 64 {h * 1e9:8.0f} ns/msg")
    p = run(Noop, 4, N // 2, job_container_thread_pool_size=4)
    print(f"sync no-op on a pool of 4            {p * 1e9:8.0f} ns/msg")


if __name__ == "__main__":
    main()
