"""Seeded end-to-end trials of a stateful job over Redis (rules 20, 26, 28): per-key counts
over sequence-numbered input, kept with ``context.store("counts")``, run by member
processes that share the partitions; one member is killed with SIGKILL (its partitions
are taken over after the lease) or paused with SIGSTOP past its lease (a zombie whose
late commit, offsets and state, is refused) at a seeded point.

While the job runs, a checker reads each task's committed offset and state in one
atomic step, over and over: the state must always be the fold of exactly the committed
prefix (no message above the committed offset counted, none at or below it missed).
At the end every partition is committed to its end and every task's state is the fold
of its whole input.

Needs the store API (``tailrace.stores``); ``TAILRACE_REDIS_STATE_TRIALS=N`` runs N
trials (stress) instead of the default 4.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from redis_support import HERE, RedisServer, finish_members, spawn_member

pytest.importorskip("tailrace.stores", reason="needs the store API (tailrace.stores, context.store)")

from tailrace.redis.system import RedisSystem
from tailrace.serdes import serde

P = 4
RECORDS = 400
KEYS = 30
LEASE_MS = 800
KINDS = ("sync", "pool", "async", "asyncio")
TRIALS = int(os.environ.get("TAILRACE_REDIS_STATE_TRIALS", "4"))
INT = serde("int")

# KEYS: ckpt, values hash.  -> {committed id or false, HGETALL}: one atomic snapshot of a task.
SNAPSHOT = """
return {redis.call('GET', KEYS[1]), redis.call('HGETALL', KEYS[2])}
"""


STATE_MAIN = HERE / "state_member_main.py"


class Job:
    """The input, and atomic snapshots of what each task committed."""

    def __init__(self, url: str, job: str, seed: int) -> None:
        self.system = RedisSystem("redis", url)
        self.system.create_stream("in", P)
        self.job = job
        rng = random.Random(seed)
        self.data = [[f"k{rng.randrange(KEYS)}" for _ in range(RECORDS)] for _ in range(P)]
        pipe = self.system.client.pipeline(transaction=False)
        for p in range(P):
            for i, k in enumerate(self.data[p]):
                pipe.xadd(self.system.keys.stream("in", p), {"m": json.dumps({"k": k, "p": p, "seq": i})})
        pipe.execute()
        self.system.end_stream("in")
        self.seq = [{entry: m["seq"] for entry, _, m in self.system.read_all("in", p)} for p in range(P)]
        self.snapshot_script = self.system.client.register_script(SNAPSHOT)

    def snapshot(self, p: int) -> tuple[int, dict[str, int]]:
        """(committed seq or -1, committed counts) of task p, read atomically."""
        keys = self.system.keys
        hkey = keys.state("in", p, self.job, f"Partition {p}", "counts")[1]
        raw_id, flat = self.snapshot_script(keys=[keys.checkpoint("in", p, self.job), hkey])
        seq = -1 if raw_id is None else self.seq[p][raw_id.decode()]
        counts = {flat[i].decode(): INT.decode(flat[i + 1]) for i in range(0, len(flat), 2)}
        return seq, counts

    def fold(self, p: int, upto: int) -> dict[str, int]:
        return dict(Counter(self.data[p][: upto + 1]))

    def check(self, errors: list[str], when: str) -> list[int]:
        seqs = []
        for p in range(P):
            seq, counts = self.snapshot(p)
            want = self.fold(p, seq)
            if counts != want:
                wrong = {
                    k: (counts.get(k), want.get(k))
                    for k in set(counts) | set(want)
                    if counts.get(k) != want.get(k)
                }
                errors.append(
                    f"{when}: task {p} committed at seq {seq} holds "
                    f"{dict(list(wrong.items())[:4])} (got, want)"
                )
            seqs.append(seq)
        return seqs


@pytest.mark.parametrize("seed", range(TRIALS))
def test_stateful_job_is_exact_across_kill_9_takeovers_and_zombies(
    redis_server: RedisServer, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    engine = ("c", "python")[(seed + seed // len(KINDS)) % 2]  # every kind on both engines in 8 trials
    fault = ("kill", "stop")[rng.randrange(2)]
    job = Job(redis_server.url, f"trial{seed}", seed)
    spec = {
        "url": redis_server.url,
        "job": job.job,
        "partitions": P,
        "kind": kind,
        "engine": engine,
        "lease_ms": LEASE_MS,
        "commit_ms": rng.choice([5, 20, 50]),
        "delay_s": 0.002,
    }
    errors: list[str] = []
    stop = threading.Event()

    def checker() -> None:
        while not stop.is_set():
            job.check(errors, "while running")
            time.sleep(0.01)

    logs = [tmp_path / f"m{i}.log" for i in range(3)]
    procs = [spawn_member(spec, logs[0], STATE_MAIN), spawn_member(spec, logs[1], STATE_MAIN)]
    watch = threading.Thread(target=checker)
    watch.start()
    victim = -1
    try:
        target = rng.randrange(10, RECORDS // 3)
        deadline = time.monotonic() + 60
        while max(job.check(errors, "waiting")) < target:
            assert time.monotonic() < deadline, f"no progress:\n{logs[0].read_text()[-2000:]}"
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.3))
        victim = rng.randrange(2)
        if fault == "kill":
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            job.check(errors, "right after the kill")
            procs.append(
                spawn_member(spec, logs[2], STATE_MAIN)
            )  # a replacement joins; the survivor takes over first
        else:
            procs[victim].send_signal(signal.SIGSTOP)
            time.sleep(2.5 * LEASE_MS / 1000)  # the other member takes its partitions over
            job.check(errors, "while the zombie is stopped")
            procs[victim].send_signal(signal.SIGCONT)  # its late commit must be refused
        alive = [i for i in range(len(procs)) if not (fault == "kill" and i == victim)]
        results = finish_members([procs[i] for i in alive], [logs[i] for i in alive])
    finally:
        stop.set()
        watch.join()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    seqs = job.check(errors, "at the end")
    assert not errors, f"{kind}/{engine}/{fault}: " + "; ".join(errors[:5])
    assert seqs == [RECORDS - 1] * P, seqs
    for p in range(P):
        assert job.snapshot(p)[1] == job.fold(p, RECORDS - 1)
    assert all(r["reason"] == "done" for r in results), results
    if fault == "stop":
        zombie = results[alive.index(victim)]
        print(f"zombie {zombie['member']}: fenced {zombie['fenced']} times")
    job.system.close()
