"""A live job run as a separate process by test_shutdown.py (rules 19, 20).

    python live_job.py ENGINE signal OUT.json
        Feeds a live stream from a thread, processes it with an async task,
        stops gracefully on SIGINT/SIGTERM (container.stop() in the handler) and
        writes what was processed and committed to OUT.json. Prints "ready" once
        messages are flowing.

    python live_job.py ENGINE crash STORE.json LOG.txt
        Processes a bounded stream slowly, committing every 20 ms into a JSON
        file store, logging each processed offset to LOG.txt; the test kills it
        with SIGKILL and runs it again to the end (same arguments).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from tailrace import (
    AsyncStreamTask,
    CheckpointStore,
    Container,
    MemoryCheckpointStore,
    MemorySystem,
    StreamTask,
    SystemStreamPartition,
)
from tailrace.types import Offset

PARTITIONS = 2
CRASH_MESSAGES = 1500


class JsonFileStore(CheckpointStore):
    """A durable checkpoint store: one JSON file, replaced atomically on each write."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: dict[str, dict[str, Offset]] = {}

    def open(self, job_name: str) -> None:
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.data = json.load(f)

    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        out = {}
        for key, off in self.data.get(task_name, {}).items():
            system, stream, part = key.split("|")
            out[SystemStreamPartition(system, stream, int(part))] = off
        return out

    def write(self, task_name: str, offsets: Mapping[SystemStreamPartition, Offset]) -> None:
        entry = self.data.setdefault(task_name, {})
        for ssp, off in offsets.items():
            entry[f"{ssp.system}|{ssp.stream}|{ssp.partition}"] = off
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


def run_signal(engine: str, out_path: str) -> None:
    system = MemorySystem().add_live_stream("in", PARTITIONS, capacity=64)
    processed: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    lock = threading.Lock()
    ready = threading.Event()

    class Task(AsyncStreamTask):
        def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
            def done() -> None:
                with lock:
                    processed[envelope.partition].append(envelope.offset)
                    if sum(map(len, processed.values())) >= 200:
                        ready.set()
                callback.complete()

            threading.Timer(0.001, done).start()

    def feed() -> None:
        i = 0
        while True:
            for p in range(PARTITIONS):
                try:
                    system.append("in", p, i, timeout=0.5)
                except (TimeoutError, ValueError):
                    return
            i += 1

    store = MemoryCheckpointStore()
    container = Container(
        Task, inputs=["mem.in"], systems=[system], checkpoints=store, engine=engine, task_max_concurrency=4
    )
    signal.signal(signal.SIGTERM, lambda *_: container.stop())
    signal.signal(signal.SIGINT, lambda *_: container.stop())
    threading.Thread(target=feed, daemon=True).start()
    threading.Thread(target=lambda: (ready.wait(), print("ready", flush=True)), daemon=True).start()
    result = container.run()
    with lock:
        report = {
            "reason": result.reason,
            "processed": {str(p): offs for p, offs in processed.items()},
            "committed": {str(s.partition): off for s, off in result.committed.items()},
            "history": [[t, {str(s.partition): o for s, o in offs.items()}] for t, offs in store.history],
        }
    with open(out_path, "w") as f:
        json.dump(report, f)


def run_crash(engine: str, store_path: str, log_path: str) -> None:
    system = MemorySystem().add_stream("in", [list(range(CRASH_MESSAGES)) for _ in range(PARTITIONS)])
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the whole run

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            log.write(f"{envelope.partition} {envelope.offset}\n")
            time.sleep(0.0005)

    container = Container(
        Task, inputs=["mem.in"], systems=[system], checkpoints=JsonFileStore(store_path), engine=engine,
        task_commit_ms=20,
    )
    result = container.run()
    log.close()
    print(result.reason, flush=True)


if __name__ == "__main__":
    if sys.argv[2] == "signal":
        run_signal(sys.argv[1], sys.argv[3])
    else:
        run_crash(sys.argv[1], sys.argv[3], sys.argv[4])
