"""Seeded trials of a stateful job with exactly-once Redis outputs (rule 41), run by three
member processes sharing the partitions: one is paused with SIGSTOP past its lease (a
zombie whose late commit, outputs included, is refused: rule 28) and another killed with
SIGKILL (its partitions taken over), at seeded points; a replacement joins.

While the job runs, a checker reads the output streams over and over: each record at most
once, and per input partition and key, the records in input order with the key's running
count. At the end the outputs hold exactly the records of a run without a crash: every
(partition, seq) once, per (partition, key) in input order, no duplicate.

``TAILRACE_STRESS_TRIALS=N`` runs N trials (stress) instead of the default 8.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from redis_support import HERE, REDIS_CLI, RedisClusterNodes, RedisServer, finish_members, spawn_member

from tailrace.redis.system import RedisSystem

P = 4
OUT = 4
RECORDS = 300
KEYS = 20
LEASE_MS = 800
TRIALS = int(os.environ.get("TAILRACE_STRESS_TRIALS", "8"))


EO_MAIN = HERE / "eo_member_main.py"


class Job:
    """The input, and a run without a crash: per (partition, key), its (seq, running count)."""

    def __init__(self, url: str, seed: int) -> None:
        self.system = RedisSystem("redis", url)
        self.system.create_stream("in", P)
        self.system.create_stream("out", OUT)
        rng = random.Random(seed)
        self.want: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
        pipe = self.system.client.pipeline(transaction=False)
        for p in range(P):
            counts: Counter[str] = Counter()
            for i in range(RECORDS):
                k = f"k{rng.randrange(KEYS)}"
                counts[k] += 1
                self.want[p, k].append((i, counts[k]))
                pipe.xadd(self.system.keys.stream("in", p), {"m": json.dumps({"k": k, "p": p, "seq": i})})
        pipe.execute()
        self.system.end_stream("in")

    def check(self, errors: list[str], when: str, complete: bool = False) -> int:
        """Check the outputs as a reader sees them now; the number of records."""
        got: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
        seen: Counter[tuple[int, int]] = Counter()
        for q in range(OUT):
            for _, key, m in self.system.read_all("out", q):
                if key != m["k"]:
                    errors.append(f"{when}: an entry of key {m['k']!r} carries key {key!r}")
                got[m["p"], m["k"]].append((m["seq"], m["n"]))
                seen[m["p"], m["seq"]] += 1
        dups = [r for r, n in seen.items() if n > 1]
        if dups:
            errors.append(f"{when}: {len(dups)} records more than once, e.g. (partition, seq) {dups[0]}")
        for pk, rows in got.items():
            if rows != self.want[pk][: len(rows)]:
                want = self.want[pk][:5]
                errors.append(f"{when}: partition, key {pk}: {rows[:5]} is not a prefix of {want}")
        if complete and dict(got) != dict(self.want):
            errors.append(f"{when}: {P * RECORDS - sum(seen.values())} records missing")
        return sum(seen.values())


@pytest.mark.parametrize("seed", range(TRIALS))
def test_redis_outputs_are_exact_across_kill_9_takeovers_and_a_zombie(
    redis_server: RedisServer, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(f"eo-redis-{seed}")
    engine = ("c", "python")[seed % 2]
    job = Job(redis_server.url, seed)
    spec = {
        "url": redis_server.url,
        "job": f"eo{seed}",
        "partitions": P,
        "engine": engine,
        "lease_ms": LEASE_MS,
        "commit_ms": rng.choice([10, 50, 200]),
        "delay_s": 0.003,
        "guarantee": os.environ.get("TAILRACE_TEST_GUARANTEE", "exactly-once"),  # (a negative control)
    }
    errors: list[str] = []
    stop = threading.Event()

    def checker() -> None:
        while not stop.is_set():
            job.check(errors, "while running")
            time.sleep(0.02)

    logs = [tmp_path / f"m{i}.log" for i in range(4)]
    procs = [spawn_member(spec, logs[i], EO_MAIN) for i in range(3)]
    watch = threading.Thread(target=checker)
    watch.start()
    zombie, victim = rng.sample(range(3), 2)
    try:
        target = rng.randrange(20, P * RECORDS // 3)
        deadline = time.monotonic() + 60
        while job.check(errors, "waiting") < target:
            assert time.monotonic() < deadline, f"no progress:\n{logs[0].read_text()[-2000:]}"
            time.sleep(0.01)
        procs[zombie].send_signal(signal.SIGSTOP)
        time.sleep(rng.uniform(0, 0.3))
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        time.sleep(2.5 * LEASE_MS / 1000)  # the others take the zombie's partitions over
        job.check(errors, "while the zombie is stopped")
        procs[zombie].send_signal(signal.SIGCONT)  # its late commit must be refused, outputs and all
        procs.append(spawn_member(spec, logs[3], EO_MAIN))
        alive = [i for i in range(len(procs)) if i != victim]
        results = finish_members([procs[i] for i in alive], [logs[i] for i in alive])
    finally:
        stop.set()
        watch.join()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    job.check(errors, "at the end", complete=True)
    assert not errors, f"{engine}: " + "; ".join(errors[:5])
    assert all(r["reason"] == "done" for r in results), results
    zombie_result = results[alive.index(zombie)]
    print(f"zombie {zombie_result['member']}: fenced {zombie_result['fenced']} times")
    job.system.close()


class _Copy:
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("redis.out", envelope.message)


def _stream(url: str, cluster: bool = False) -> RedisSystem:
    system = RedisSystem("redis", url, cluster=cluster)
    system.create_stream("in", 1)
    system.create_stream("out", 1)
    system.client.xadd(system.keys.stream("in", 0), {"m": "1"})
    system.end_stream("in")
    return system


def test_redis_outputs_with_checkpoints_elsewhere_are_refused(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from tailrace import Container
    from tailrace.errors import ConfigError
    from tailrace.sqlite import SqliteCheckpointStore

    system = _stream(redis_server.url)
    with pytest.raises(ConfigError) as e:
        Container(
            _Copy,
            inputs=["redis.in"],
            systems=[system],
            checkpoints=SqliteCheckpointStore(tmp_path / "ck.db"),
            task_output_guarantee="exactly-once",
        ).run()
    assert e.value.key == "task.output.guarantee"
    assert "Redis system 'redis'" in str(e.value) and "SqliteCheckpointStore" in str(e.value)
    assert system.read_all("out", 0) == []
    system.close()


@pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli is not installed")
def test_redis_cluster_refuses_exactly_once_outputs_naming_the_keys(tmp_path: Path) -> None:
    from tailrace import Container
    from tailrace.errors import ConfigError
    from tailrace.redis.checkpoint import RedisCheckpointStore
    from tailrace.types import SystemStreamPartition

    nodes = RedisClusterNodes(tmp_path / "cluster").start()
    try:
        system = _stream(nodes.url, cluster=True)
        store = RedisCheckpointStore(
            nodes.url, cluster=True, client=system.client, inputs=[SystemStreamPartition("redis", "in", 0)]
        )
        with pytest.raises(ConfigError) as e:
            Container(
                _Copy,
                inputs=["redis.in"],
                systems=[system],
                checkpoints=store,
                task_output_guarantee="exactly-once",
            ).run()
        text = str(e.value)
        assert e.value.key == "task.output.guarantee" and "Redis Cluster" in text and "one hash slot" in text
        assert system.keys.stream("OUTPUT", 0) in text and system.keys.checkpoint("STREAM", 0, "JOB") in text
        system.close()
    finally:
        nodes.kill()
