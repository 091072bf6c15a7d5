"""One member of a stateful distributed job, in its own process: ``state_member_main.py SPEC_JSON``.

SPEC: url, job, partitions (of stream "in"), kind ("sync", "pool", "async", "asyncio"),
engine, lease_ms, commit_ms, delay_s (per message). The task counts, per task, the
messages of each key (``message["k"]``) in the store ``counts`` (str keys, int values,
a tiny cache so that reads go through to Redis). Prints the MemberResult as JSON.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from tailrace import AsyncStreamTask, StreamTask
from tailrace.redis.membership import MemberSpec, run_member
from tailrace.redis.system import RedisSystem

MEMBER = f"m{os.getpid()}"
DELAY_S = 0.0


def count(store: Any, key: str) -> None:
    store[key] = store.get(key, 0) + 1


class SyncCounter(StreamTask):
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if DELAY_S:
            time.sleep(DELAY_S)
        count(self.counts, envelope.message["k"])


class AsyncCounter(AsyncStreamTask):
    """Completes from two worker threads (out of order); guards its read-modify-write (rule 21)."""

    def init(self, context: Any) -> None:
        self.counts = context.store("counts")
        self.lock = threading.Lock()
        self.work: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        for _ in range(2):
            threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self) -> None:
        while True:
            envelope, callback = self.work.get()
            if DELAY_S:
                time.sleep(DELAY_S)
            with self.lock:
                count(self.counts, envelope.message["k"])
            callback.complete()

    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        self.work.put((envelope, callback))


class AsyncioCounter:
    def init(self, context: Any) -> None:
        self.counts = context.store("counts")

    async def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        if DELAY_S:
            time.sleep(DELAY_S)
        count(self.counts, envelope.message["k"])


def main() -> None:
    global DELAY_S
    spec = json.loads(sys.argv[1])
    DELAY_S = spec.get("delay_s", 0.0)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {MEMBER} %(name)s %(levelname)s %(message)s")
    url, kind = spec["url"], spec["kind"]
    config: dict[str, Any] = {
        "job.name": spec["job"],
        "task.commit.ms": spec.get("commit_ms", 20),
        "stores.counts.key.serde": "str",
        "stores.counts.value.serde": "int",
        "stores.counts.cache.size": 8,
    }
    if kind == "pool":
        config["job.container.thread.pool.size"] = 2
    if kind == "async":
        config["task.max.concurrency"] = 4
    task = {"sync": SyncCounter, "pool": SyncCounter, "async": AsyncCounter, "asyncio": AsyncioCounter}[kind]

    def systems() -> list[RedisSystem]:
        return [RedisSystem("redis", url, streams={"in": spec["partitions"]}, batch=50)]

    result = run_member(
        MemberSpec(
            task=task,
            inputs=["redis.in"],
            systems=systems,
            url=url,
            config=config,
            engine=spec.get("engine", "python"),
            lease_ms=spec.get("lease_ms", 1000),
            member_id=MEMBER,
        )
    )
    print("RESULT " + json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
