"""Task state in Redis: commit rate of dirty keys, and restore after a takeover.

    python bench/redis_state_bench.py [--keys 1000000] [--commit 100000] [--fsync]

Starts its own redis-server (unix socket; AOF with ``appendfsync always`` when
``--fsync``, else no persistence), then, through ``RedisCheckpointStore``:

1. **commit**: a task commits ``--keys`` dirty keys of one store in commits of
   ``--commit`` keys each (offsets and state in one fenced write; a commit above
   ``STATE_BATCH`` keys is several scripts in one MULTI/EXEC). Reports dirty keys/s.
2. **overwrite**: the same keys committed again (updates, not inserts).
3. **takeover / restore**: the first store is closed without releasing its lease
   (as a crashed container), the lease is expired, and a new store (a new owner)
   opens: restore is the time from ``open`` until it has read every key (a full
   ``state_scan``); the scan alone is reported too.
4. **state_get**: latency of a cache-miss read (one ``HGET``) from one thread and
   from 4 threads at once (p50 / p99, microseconds).

Keys are JSON strings (``"user-0000001"``, 15 bytes), values JSON integers, as a
per-user count kept with the default json serde.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tailrace.redis import checkpoint as redis_checkpoint
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.types import SystemStreamPartition

SSP = SystemStreamPartition("redis", "in", 0)
TASK = "Partition 0"


def start_server(dir: Path, fsync: bool) -> tuple[subprocess.Popen[bytes], str]:
    import redis

    sock = str(dir / "redis.sock")
    args = ["redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--dir", str(dir)]
    args += ["--appendonly", "yes", "--appendfsync", "always"] if fsync else ["--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"unix://{sock}?db=0"
    for _ in range(500):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.exceptions.ConnectionError:
            time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12)) / CLK


class Clock:
    """Wall seconds, and the CPU seconds of redis-server and of this process, of one phase."""

    def __init__(self, server: subprocess.Popen[bytes]) -> None:
        self.server = server
        self.wall = time.perf_counter()
        self.redis = cpu_seconds(server.pid)
        self.client = time.process_time()

    def done(self) -> tuple[float, str]:
        wall = time.perf_counter() - self.wall
        redis = cpu_seconds(self.server.pid) - self.redis
        client = time.process_time() - self.client
        return wall, f"[CPU: redis-server {redis:.2f} s, client {client:.2f} s]"


def key(i: int) -> bytes:
    return b'"user-%07d"' % i


def commit_all(store: RedisCheckpointStore, n: int, per_commit: int, offset0: int, value: int) -> None:
    for c, start in enumerate(range(0, n, per_commit)):
        changes: dict[bytes, bytes | None] = {
            key(i): b"%d" % (i + value) for i in range(start, min(n, start + per_commit))
        }
        store.write(TASK, {SSP: f"{offset0 + c + 1}-0"}, {"counts": changes})


def percentiles(samples: list[float]) -> str:
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[int(len(samples) * 0.99)]
    return f"p50 {p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--commit", type=int, default=100_000, help="dirty keys per commit")
    ap.add_argument("--fsync", action="store_true", help="AOF with appendfsync always")
    ap.add_argument("--gets", type=int, default=20_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        proc, url = start_server(Path(d), a.fsync)
        try:
            store = RedisCheckpointStore(url, inputs=[SSP], lease_ms=60_000)
            store.open("bench")
            commits = -(-a.keys // a.commit)
            clock = Clock(proc)
            commit_all(store, a.keys, a.commit, 0, 0)
            s, cpu = clock.done()
            print(
                f"commit:    {a.keys:,} new keys in {commits} commits of {a.commit:,}: "
                f"{s:.2f} s, {a.keys / s:,.0f} keys/s {cpu}"
            )
            clock = Clock(proc)
            commit_all(store, a.keys, a.commit, commits, 1)
            s, cpu = clock.done()
            print(f"overwrite: {a.keys:,} keys again: {s:.2f} s, {a.keys / s:,.0f} keys/s {cpu}")
            small, rounds = min(1000, a.keys), 200
            clock = Clock(proc)
            for r in range(rounds):
                changes: dict[bytes, bytes | None] = {key(i): b"%d" % r for i in range(small)}
                store.write(TASK, {SSP: f"{2 * commits + r + 1}-0"}, {"counts": changes})
            s, cpu = clock.done()
            print(
                f"small:     {rounds} commits of {small} keys: {s / rounds * 1e3:.2f} ms each, "
                f"{rounds * small / s:,.0f} keys/s {cpu}"
            )
            # a crash: the owner goes away holding its lease; the lease is expired (as after lease_ms)
            store._stop.set()  # stop renewing, as a dead process would
            store.client.delete(store.keys.lease("in", 0, "bench"))
            store.client.close()

            clock = Clock(proc)
            owner = RedisCheckpointStore(url, inputs=[SSP], lease_ms=60_000)
            owner.open("bench")
            committed = owner.load(TASK)
            first = owner.state_get(TASK, "counts", key(a.keys - 1))
            s, cpu = clock.done()
            assert first is not None
            print(f"takeover:  new owner at {committed[SSP]} reads a key after {s * 1e3:.1f} ms {cpu}")
            clock = Clock(proc)
            n = sum(1 for _ in owner.state_scan(TASK, "counts"))
            s, cpu = clock.done()
            assert n == a.keys, (n, a.keys)
            print(
                f"restore:   full state_scan of {n:,} keys: {s:.2f} s, {n / s:,.0f} keys/s "
                f"({redis_checkpoint.SCAN_BATCH} per round trip) {cpu}"
            )
            rng = random.Random(1)
            samples: list[float] = []
            for _ in range(a.gets):
                k = key(rng.randrange(a.keys))
                t = time.perf_counter()
                v = owner.state_get(TASK, "counts", k)
                samples.append(time.perf_counter() - t)
                assert v is not None
            print(f"state_get, 1 thread:  {percentiles(samples)}")
            samples = []
            lock = threading.Lock()

            def reader(seed: int) -> None:
                r = random.Random(seed)
                mine = []
                for _ in range(a.gets // 4):
                    k = key(r.randrange(a.keys))
                    t = time.perf_counter()
                    owner.state_get(TASK, "counts", k)
                    mine.append(time.perf_counter() - t)
                with lock:
                    samples.extend(mine)

            threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            s = time.perf_counter() - t
            print(f"state_get, 4 threads: {percentiles(samples)}, {len(samples) / s:,.0f} gets/s in all")
            owner.close()
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
