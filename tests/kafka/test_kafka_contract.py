"""The Kafka contract suite: against Mokapi in CI, against a real broker when
KAFKA_BOOTSTRAP_SERVERS is set (tests/kafka/conftest.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

import tailrace
from tailrace.interfaces import CheckpointStore, StateChanges
from tailrace.kafka import KafkaMember, KafkaMemberSpec, KafkaRecord, KafkaSystem
from tailrace.types import Offset, SystemStreamPartition

from .conftest import Cluster

ENGINES = ["c", "python"]
STRATEGY = {"partition.assignment.strategy": os.environ.get("TAILRACE_KAFKA_STRATEGY", "cooperative-sticky")}


class Record(tailrace.StreamTask):
    """Sends every message on to kafka.out (same partition) and records it."""

    seen: list[tuple[int, int, Any, Any]] = []
    lock = threading.Lock()

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        with self.lock:
            self.seen.append((envelope.partition, envelope.offset, envelope.key, envelope.message))
        msg = envelope.message.value if isinstance(envelope.message, KafkaRecord) else envelope.message
        collector.send("kafka.out", msg, key=envelope.key, partition=envelope.partition % 2)


def _items(n: int, partitions: int, start: int = 0) -> list[tuple[int, Any, bytes | None]]:
    return [
        (i % partitions, f"k{i}".encode(), json.dumps({"i": i}).encode()) for i in range(start, start + n)
    ]


def _system(cluster: Cluster, producer: Mapping[str, Any] | None = None, **kw: Any) -> KafkaSystem:
    return KafkaSystem(
        "kafka", cluster.bootstrap, producer={**cluster.producer_settings, **(producer or {})}, **kw
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_produce_consume_in_partition_order_with_headers(kafka_cluster: Any, engine: str) -> None:
    # rule 1: each partition in offset order; every message once; outputs delivered
    cluster = kafka_cluster({"in": 4, "out": 2})
    cluster.produce("in", _items(200, 4), headers=[("trace", b"t1"), ("trace", b"t2")])
    Record.seen = []
    system = _system(cluster, bounded=True, headers=True)
    result = tailrace.Container(
        Record, inputs=[f"kafka.{cluster.topics['in']}"], systems=[system], engine=engine
    ).run()
    assert result.reason == "end_of_stream"
    assert result.processed == 200
    by_part: dict[int, list[int]] = {}
    for part, off, key, msg in Record.seen:
        by_part.setdefault(part, []).append(off)
        assert isinstance(msg, KafkaRecord)
        assert msg.headers == [("trace", b"t1"), ("trace", b"t2")]
        assert key == f"k{msg.value['i']}"
        assert msg.value["i"] % 4 == part
    assert {p: offs for p, offs in by_part.items()} == {p: list(range(50)) for p in range(4)}
    out = cluster.read_all("out", 2)
    got = sorted(json.loads(m.value())["i"] for ms in out.values() for m in ms)
    assert got == list(range(200))


def test_commit_and_resume(kafka_cluster: Any, tmp_path: Any) -> None:
    # rule 13: a restart resumes after the committed offset; the watermark + 1 is in the Kafka group
    cluster = kafka_cluster({"in": 4, "out": 2})
    topic = cluster.topics["in"]
    cluster.produce("in", _items(40, 4))
    store_path = tmp_path / "ckpt.db"
    Record.seen = []

    def run() -> tailrace.RunResult:
        system = _system(cluster, bounded=True, group_id="resume-job")
        store = tailrace.kafka.KafkaCheckpointStore(
            tailrace.SqliteCheckpointStore(store_path), {"kafka": system}
        )
        return tailrace.Container(
            Record, inputs=[f"kafka.{topic}"], systems=[system], checkpoints=store, job_name="resume-job"
        ).run()

    first = run()
    assert first.processed == 40
    assert first.committed[SystemStreamPartition("kafka", topic, 0)] == 9
    if cluster.real:  # Mokapi refuses commits of consumers that did not join the group
        assert cluster.committed("resume-job", "in", 4) == {p: 10 for p in range(4)}
    cluster.produce("in", _items(8, 4, start=40))
    Record.seen = []
    second = run()
    assert second.processed == 8
    assert sorted(m["i"] for _, _, _, m in Record.seen) == list(range(40, 48))
    if cluster.real:
        assert cluster.committed("resume-job", "in", 4) == {p: 12 for p in range(4)}


def test_full_producer_queue_is_backpressure(kafka_cluster: Any) -> None:
    # rule 24: a full local producer queue waits; nothing is dropped or raised
    cluster = kafka_cluster({"in": 1, "out": 2})
    cluster.produce("in", _items(300, 1))
    Record.seen = []
    system = _system(cluster, bounded=True, producer={"queue.buffering.max.messages": 5, "linger.ms": 0})
    result = tailrace.Container(Record, inputs=[f"kafka.{cluster.topics['in']}"], systems=[system]).run()
    assert result.processed == 300
    out = cluster.read_all("out", 2)
    assert sorted(json.loads(m.value())["i"] for ms in out.values() for m in ms) == list(range(300))


class SharedStore(CheckpointStore):
    """One store seen by several in-process members (each opens and closes its view)."""

    def __init__(self, inner: tailrace.MemoryCheckpointStore) -> None:
        self.inner = inner

    def open(self, job_name: str) -> None:
        pass

    def load(self, task_name: str) -> dict[SystemStreamPartition, Offset]:
        return self.inner.load(task_name)

    def write(
        self,
        task_name: str,
        offsets: Mapping[SystemStreamPartition, Offset],
        state: StateChanges | None = None,
    ) -> None:
        self.inner.write(task_name, offsets)


class Slow(Record):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        time.sleep(0.002)
        super().process(envelope, collector, coordinator)


def _member(cluster: Cluster, store: CheckpointStore, name: str) -> KafkaMember:
    system = _system(
        cluster,
        consumer={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1500, "client.id": name, **STRATEGY},
    )
    spec = KafkaMemberSpec(
        Slow,
        inputs=[f"kafka.{cluster.topics['in']}"],
        systems=[system],
        checkpoints=store,
        config={"job.name": "shared-job", "task.commit.ms": 200},
    )
    return KafkaMember(spec)


def _wait(pred: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_two_members_share_partitions_across_a_rebalance(kafka_cluster: Any) -> None:
    # rules 13, 19: a second member joins mid-stream; the graceful hand-over loses
    # nothing and replays nothing; the group holds watermark + 1
    cluster = kafka_cluster({"in": 4, "out": 2})
    n = 800
    cluster.produce("in", _items(n // 2, 4))
    inner = tailrace.MemoryCheckpointStore()
    inner.open("shared-job")
    Record.seen = []
    a = _member(cluster, SharedStore(inner), "a")
    b = _member(cluster, SharedStore(inner), "b")
    errors: list[BaseException] = []

    def run(m: KafkaMember) -> None:
        try:
            m.run()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    ta = threading.Thread(target=run, args=(a,), daemon=True)
    ta.start()
    assert _wait(lambda: len(Record.seen) >= 50, 30), "member a processed nothing"
    tb = threading.Thread(target=run, args=(b,), daemon=True)
    tb.start()
    assert _wait(lambda: b.result.runs >= 1, 60), "member b was never assigned a partition"
    cluster.produce("in", _items(n // 2, 4, start=n // 2))
    assert _wait(lambda: len({m["i"] for _, _, _, m in Record.seen}) >= n, 60), len(Record.seen)
    # the low watermark + 1 reaches the Kafka group (periodic commits, task.commit.ms = 200)
    expected = {p: n // 4 for p in range(4)}
    # (Mokapi answers OffsetFetch of a consumer outside the group with no offsets: real broker only)
    committed_ok = not cluster.real or _wait(lambda: cluster.committed("shared-job", "in", 4) == expected, 20)
    committed = cluster.committed("shared-job", "in", 4) if cluster.real else expected
    a.stop()
    b.stop()
    ta.join(30)
    tb.join(30)
    assert not errors, errors
    assert a.result.revoked >= 1 and b.result.assigned >= 1, (a.result, b.result)
    got = sorted(m["i"] for _, _, _, m in Record.seen)
    assert got == list(range(n)), (
        f"duplicates: {len(got) - len(set(got))}, missing: {set(range(n)) - set(got)}"
    )
    assert committed_ok, committed


def test_kill_9_member_then_resume_loses_nothing(kafka_cluster: Any, tmp_path: Any) -> None:
    # rule 20: after a hard kill the next member resumes after the last commit; nothing is lost
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cluster = kafka_cluster({"in": 2, "out": 1})
    n = 3000
    cluster.produce("in", _items(n, 2))
    main = Path(__file__).with_name("member_main.py")
    db = tmp_path / "ckpt.db"
    args = [
        sys.executable,
        str(main),
        cluster.bootstrap,
        cluster.topics["in"],
        cluster.topics["out"],
        str(db),
    ]

    def outputs() -> list[int]:
        return [v["i"] for v in cluster.json_values("out")]

    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: len(outputs()) >= 100, 60), "the first member produced nothing"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    before = len(outputs())
    assert before < n, "the first member finished before it was killed"
    second = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: set(outputs()) >= set(range(n)), 90), sorted(set(range(n)) - set(outputs()))[:20]
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
    got = outputs()
    assert set(got) == set(range(n))
    # duplicates are bounded by what the first member processed after its last commit
    assert len(got) - n <= before, (len(got), before)


class Sampling(tailrace.StreamTask):
    """Takes its time, and samples how much its system's fetch thread has buffered."""

    system: KafkaSystem
    seen: list[tuple[int, int]] = []
    most = 0
    paused_seen = False

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        fetcher = self.system._fetcher
        with fetcher.cond:
            buffered = max((r._count for r in fetcher.readers.values()), default=0)
            Sampling.paused_seen = Sampling.paused_seen or bool(fetcher._paused)
        Sampling.most = max(Sampling.most, buffered)
        Sampling.seen.append((envelope.partition, envelope.offset))
        time.sleep(0.0003)


def test_a_slow_task_bounds_what_is_read_ahead(kafka_cluster: Any) -> None:
    # rule 6: input is bounded. A partition reads past its buffer only up to four times it
    # (plus the batch in flight), then it is paused at the broker; nothing lost, in order.
    cluster = kafka_cluster({"in": 2})
    cluster.produce("in", _items(4000, 2))
    system = _system(cluster, bounded=True, batch=50, buffer=100)
    Sampling.system, Sampling.seen, Sampling.most, Sampling.paused_seen = system, [], 0, False
    result = tailrace.Container(Sampling, inputs=[f"kafka.{cluster.topics['in']}"], systems=[system]).run()
    assert result.processed == 4000
    assert Sampling.most <= 4 * 100 + 50, Sampling.most
    assert Sampling.paused_seen  # the fetch thread had to pause a partition
    for p in range(2):
        assert [off for part, off in Sampling.seen if part == p] == list(range(2000))
