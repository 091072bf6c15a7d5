"""State stores over a Kafka input (rules 26-28): a `tailrace run` member killed with
kill -9 leaves state exactly at its committed offsets, and the restart resumes both."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import tailrace
from tailrace.types import SystemStreamPartition

from .test_kafka_cli import _start, write_job
from .test_kafka_contract import _items, _wait

TASK = """
import time

from tailrace import StreamTask


class Count(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        time.sleep(0.002)  # slow enough to be killed mid-stream
        self.counts["n"] = self.counts.get("n", 0) + 1
        self.counts["sum"] = self.counts.get("sum", 0) + envelope.message["i"]
"""

N = 4000  # message i is at offset i // 2 of partition i % 2 (_items over 2 partitions)
FIRST = 40  # produced before the member starts; the rest once it runs both partitions


def _committed(db: Path, topic: str) -> dict[int, tuple[int | None, int | None, int | None]]:
    """partition -> (committed offset, state n, state sum) of its task."""
    store = tailrace.SqliteCheckpointStore(db)
    store.open("kafka-cli")
    try:
        out = {}
        for p in range(2):
            task = f"Partition {p}"
            off = store.load(task).get(SystemStreamPartition("kafka", topic, p))
            n, total = (store.state_get(task, "counts", json.dumps(k).encode()) for k in ("n", "sum"))
            out[p] = (
                None if off is None else int(off),
                None if n is None else json.loads(n),
                None if total is None else json.loads(total),
            )
        return out
    finally:
        store.close()


def _expected(p: int, offset: int) -> tuple[int, int, int]:
    """What the task's state must hold with ``offset`` committed: every message up to it once."""
    return offset, offset + 1, sum(2 * o + p for o in range(offset + 1))


def test_state_resumes_with_offsets_after_kill_9(kafka_cluster: Any, tmp_path: Path) -> None:
    cluster = kafka_cluster({"in": 2, "out": 1})
    topic = cluster.topics["in"]
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    (tmp_path / "forward.py").write_text(TASK)
    text = job.read_text().replace("forward.py:Forward", "forward.py:Count") + "\n[stores.counts]\n"
    job.write_text(text)  # the first member reads on until it is killed
    bounded = tmp_path / "bounded.toml"  # the restart ends where the topic ends (rule 11)
    bounded.write_text(text.replace('type = "kafka"', 'type = "kafka"\nbounded = true'))
    db = tmp_path / "state" / "ckpt.db"
    log = tmp_path / "first.log"
    seen: list[tuple[float, dict[int, int]]] = []  # (seconds, committed offsets): for a failure

    def committed_past(offset: int) -> bool:
        v = _progress(db, topic)
        if not seen or seen[-1][1] != v:
            seen.append((round(time.monotonic() - t0, 2), v))
        return len(v) == 2 and min(v.values()) > offset

    def story() -> str:
        return f"committed over time {seen}\n{log.read_text()[-3000:]}"

    # a few messages first: the group may hand the member its partitions one at a time (a
    # rebalance can take seconds), and the kill must find both partitions mid-stream, so the
    # bulk is produced once the member runs both
    cluster.produce("in", _items(FIRST, 2))
    t0 = time.monotonic()
    first = _start(job, log)
    try:
        assert _wait(lambda: committed_past(FIRST // 2 - 2), 60), story()
        cluster.produce("in", _items(N - FIRST, 2, start=FIRST))
        # two commits' worth of progress on both partitions, then a hard kill mid-stream
        assert _wait(lambda: committed_past(FIRST // 2 + 50), 60), story()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    after_kill = _committed(db, topic)
    for p, (off, n, total) in after_kill.items():
        assert off is not None and off < N // 2 - 1, (
            f"partition {p} finished before the kill: {off}; {story()}"
        )
        assert (off, n, total) == _expected(p, off), (p, after_kill)  # rule 26: atomic with the offsets
    second = subprocess.run(
        [sys.executable, "-m", "tailrace", "run", str(bounded), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    final = _committed(db, topic)
    for p in range(2):  # every message applied exactly once, the replayed ones included
        assert final[p] == _expected(p, N // 2 - 1), (p, final)


def _progress(db: Path, topic: str) -> dict[int, int]:
    """Committed offsets while the member runs (read without the job's lock)."""
    if not db.exists():
        return {}
    per_task = tailrace.SqliteCheckpointStore(db).committed("kafka-cli")
    return {s.partition: int(o) for offs in per_task.values() for s, o in offs.items() if s.stream == topic}
