"""Throughput of a sync no-op job from and to a local Redis, with 1 and 2 containers.

    python bench/redis_bench.py [--messages 200000] [--partitions 8] [--engine c,python]
    python bench/redis_bench.py --jobs-only --engine c --guarantee at-least-once,exactly-once --rounds 5

Starts its own redis-server (unix socket, no persistence unless --fsync), then:

1. ceilings without tailrace: redis-benchmark XADD (pipelined), redis-py XADD
   pipelines, redis-py XREAD batches, and a raw redis-py copy loop (XREAD a batch,
   XADD it to the output in one pipeline): the same Redis work as the job;
2. the job: every message of stream ``in`` copied to ``out`` by a sync task, as one
   member (container) and as two member processes sharing the partitions.

For each run it reports messages/s, the CPU used by redis-server and by the client
processes (seconds and microseconds per message), and from the per-message figures
the number of containers, each on its own core, at which Redis (one core) would be
saturated: ``redis capacity / one container's rate``. A job's seconds and client CPU
are measured inside the member processes from the start of ``run_member`` to its
end (interpreter start-up and imports excluded; membership, leases, rebalancing and
the final commit included). ``--guarantee`` runs the job with each
``task.output.guarantee`` asked for (exactly-once: the outputs appended by each commit's
fenced script, docs/outputs.md); ``--rounds N`` runs every job N times, the jobs of a round
one after the other (A B A B ...), and reports each job's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its waited-for children), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK


class Server:
    def __init__(self, dir: Path, fsync: bool) -> None:
        self.sock = str(dir / "redis.sock")
        args = ["redis-server", "--port", "0", "--unixsocket", self.sock, "--save", "", "--dir", str(dir)]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if fsync else ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"unix://{self.sock}?db=0"
        import redis

        for _ in range(200):
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def fill(url: str, partitions: int, per_partition: int) -> None:
    from tailrace.redis.system import RedisSystem

    system = RedisSystem("redis", url, codec="str")
    system.client.flushdb()
    system.create_stream("in", partitions)
    system.create_stream("out", partitions)
    payload = "x" * 100
    for p in range(partitions):
        key = system.keys.stream("in", p)
        for start in range(0, per_partition, 1000):
            pipe = system.client.pipeline(transaction=False)
            for _ in range(min(1000, per_partition - start)):
                pipe.xadd(key, {"m": payload})
            pipe.execute()
    system.end_stream("in")
    system.close()


def measure(server: Server, fn: Any) -> tuple[float, float, float]:
    """(seconds, redis-server CPU s, this process's CPU s) of fn()."""
    s0, c0, t0 = server.cpu(), time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, server.cpu() - s0, time.process_time() - c0


def raw_baselines(server: Server, partitions: int, per_partition: int, batch: int) -> list[dict[str, Any]]:
    import redis

    client: Any = redis.Redis.from_url(server.url)  # replies typed loosely: raw RESP2 (bytes, lists)
    n = partitions * per_partition
    rows = []

    def xadd() -> None:
        for p in range(partitions):
            key = f"raw:{{in:{p}}}:s"
            for start in range(0, per_partition, batch):
                pipe = client.pipeline(transaction=False)
                for _ in range(min(batch, per_partition - start)):
                    pipe.xadd(key, {"m": "x" * 100})
                pipe.execute()

    from tailrace.redis._io import XADD_BATCH

    script = client.register_script(XADD_BATCH)

    def xadd_lua() -> None:  # what the tailrace producer sends: one script call per batch
        for p in range(partitions):
            key = f"raw:{{lua:{p}}}:s"
            for start in range(0, per_partition, batch):
                m = min(batch, per_partition - start)
                script(keys=[key], args=[m, *["x" * 100, "-"] * m])

    def xread() -> None:
        for p in range(partitions):
            key, last = f"raw:{{in:{p}}}:s", "0-0"
            while True:
                reply = client.xread({key: last}, count=batch)
                if not reply:
                    break
                last = reply[0][1][-1][0]

    def copy() -> None:  # the job's Redis work without tailrace, in one thread
        for p in range(partitions):
            src, dst, last = f"raw:{{in:{p}}}:s", f"raw:{{out:{p}}}:s", "0-0"
            while True:
                reply = client.xread({src: last}, count=batch)
                if not reply:
                    break
                entries = reply[0][1]
                args: list[Any] = [len(entries)]
                for _, fields in entries:
                    args += [fields[b"m"], "-"]
                script(keys=[dst], args=args)
                last = entries[-1][0]

    runs = (
        ("redis-py XADD pipelines", xadd),
        ("redis-py XADD Lua batches", xadd_lua),
        ("redis-py XREAD batches", xread),
        ("redis-py copy loop (XREAD + Lua XADD)", copy),
    )
    for name, fn in runs:
        secs, server_cpu, client_cpu = measure(server, fn)
        rows.append(row(name, n, secs, server_cpu, client_cpu))
    client.flushdb()
    client.close()
    return rows


def redis_benchmark(server: Server, n: int) -> dict[str, Any] | None:
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    s0, t0 = server.cpu(), time.perf_counter()
    out = subprocess.run(
        [
            exe,
            "-s",
            server.sock,
            "-n",
            str(n),
            "-P",
            "100",
            "-c",
            "4",
            "-q",
            "XADD",
            "rb:s",
            "*",
            "m",
            "x" * 100,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    secs, server_cpu = time.perf_counter() - t0, server.cpu() - s0
    rps = [float(w) for line in out.replace("\r", "\n").splitlines() for w in line.split() if _isfloat(w)]
    r = row("redis-benchmark XADD -P 100 -c 4", n, secs, server_cpu, 0.0)
    if rps:
        r["msg_per_s"] = round(rps[-2] if len(rps) >= 2 else rps[-1])
    return r


def _isfloat(w: str) -> bool:
    try:
        float(w)
    except ValueError:
        return False
    return True


def row(name: str, n: int, secs: float, server_cpu: float, client_cpu: float) -> dict[str, Any]:
    return {
        "run": name,
        "messages": n,
        "seconds": round(secs, 3),
        "msg_per_s": round(n / secs),
        "redis_cpu_s": round(server_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "redis_cpu_share": round(server_cpu / secs, 2),
        "redis_us_per_msg": round(server_cpu / n * 1e6, 2),
        "client_us_per_msg": round(client_cpu / n * 1e6, 2),
    }


def job_run(
    server: Server, containers: int, engine: str, guarantee: str, args: argparse.Namespace
) -> dict[str, Any]:
    n = args.partitions * args.messages_per_partition
    fill(server.url, args.partitions, args.messages_per_partition)
    job = f"bench{containers}{engine}"
    spec = {"url": server.url, "engine": engine, "batch": args.batch, "job": job, "guarantee": guarantee}
    stats = Path(tempfile.mkdtemp(prefix="tailrace-redis-bench-stats-"))
    cmds = [
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "member",
            json.dumps(spec),
            str(stats / f"{i}.json"),
        ]
        for i in range(containers)
    ]
    s0 = server.cpu()
    procs = [subprocess.Popen(cmd) for cmd in cmds]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"member exited {p.returncode}")
    server_cpu = server.cpu() - s0
    members = [json.loads((stats / f"{i}.json").read_text()) for i in range(containers)]
    shutil.rmtree(stats)
    secs = max(m["end"] for m in members) - min(m["start"] for m in members)
    client_cpu = sum(m["cpu"] for m in members)
    import redis

    c = redis.Redis.from_url(server.url)
    got = sum(c.xlen(f"tr:{{out:{p}}}:s") for p in range(args.partitions))
    c.close()
    if got != n:
        raise RuntimeError(f"{containers} containers copied {got} of {n} messages")
    name = f"tailrace job, {containers} container{'s' if containers > 1 else ''}, {engine} engine"
    if len(args.guarantees) > 1:
        name += f", {guarantee}"
    return row(name, n, secs, server_cpu, client_cpu)


def _median(name: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The row of a job's median run (by seconds) over its rounds."""
    ranked = sorted(samples, key=lambda r: r["seconds"])
    r = dict(ranked[(len(ranked) - 1) // 2])
    if len(samples) > 1:
        r["run"] = f"{name} (median of {len(samples)})"
    return r


def member(spec_json: str, stats_path: str | None = None) -> None:
    import logging

    from tailrace import StreamTask
    from tailrace.redis.membership import MemberSpec, run_member
    from tailrace.redis.system import RedisSystem

    logging.basicConfig(level=logging.WARNING)
    spec = json.loads(spec_json)

    class Copy(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            collector.send("redis.out", envelope.message, partition=envelope.partition)

    def systems() -> list[RedisSystem]:
        return [RedisSystem("redis", spec["url"], codec="str", batch=spec["batch"], buffer=4 * spec["batch"])]

    import redis  # noqa: F401 - imported lazily by the system: outside the measured window
    from tailrace.container import load_engine

    load_engine(spec["engine"])
    cpu0, start = time.process_time(), time.time()
    run_member(
        MemberSpec(
            task=Copy,
            inputs=["redis.in"],
            systems=systems,
            url=spec["url"],
            config={
                "job.name": spec["job"],
                "task.commit.ms": 1000,
                "task.input.buffer.size": spec["batch"],
                "task.output.guarantee": spec.get("guarantee", "at-least-once"),
            },
            engine=spec["engine"],
            lease_ms=5000,
        )
    )
    if stats_path is not None:
        stats = {"start": start, "end": time.time(), "cpu": time.process_time() - cpu0}
        Path(stats_path).write_text(json.dumps(stats))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "member":
        member(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000, help="total input messages (default 200000)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1000, help="XREAD count and XADD pipeline length")
    ap.add_argument("--engine", default="c,python", help="engines to run the job with, comma-separated")
    ap.add_argument("--fsync", action="store_true", help="run redis-server with appendfsync always")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--jobs-only", action="store_true", help="skip the ceilings without tailrace")
    ap.add_argument(
        "--guarantee",
        default="at-least-once",
        help="task.output.guarantee of the job, comma-separated: at-least-once, exactly-once",
    )
    ap.add_argument("--rounds", type=int, default=1, help="runs of every job, alternating; medians reported")
    args = ap.parse_args()
    args.guarantees = [g.strip() for g in args.guarantee.split(",") if g.strip()]
    if not args.guarantees or any(g not in ("at-least-once", "exactly-once") for g in args.guarantees):
        ap.error(f"--guarantee: expected at-least-once and/or exactly-once, got {args.guarantee!r}")
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    bad = [e for e in engines if e not in ("c", "python")]
    if bad or not engines:
        ap.error(f"--engine: expected c and/or python, got {args.engine!r}")
    args.messages_per_partition = args.messages // args.partitions
    n = args.partitions * args.messages_per_partition
    with tempfile.TemporaryDirectory(prefix="tailrace-redis-bench-") as tmp:
        server = Server(Path(tmp), args.fsync)
        try:
            rows = []
            if not args.jobs_only:
                rb = redis_benchmark(server, n)
                if rb is not None:
                    rows.append(rb)
                rows += raw_baselines(server, args.partitions, args.messages_per_partition, args.batch)
            runs: dict[str, list[dict[str, Any]]] = {}
            for _ in range(max(1, args.rounds)):
                for engine in engines:
                    for containers in (1, 2):
                        for guarantee in args.guarantees:
                            r = job_run(server, containers, engine, guarantee, args)
                            runs.setdefault(r["run"], []).append(r)
            rows += [_median(name, samples) for name, samples in runs.items()]
        finally:
            server.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{n:,} messages of 100 bytes, {args.partitions} partitions, batch {args.batch}, "
        f"fsync {'always' if args.fsync else 'off'}, {os.cpu_count()} CPUs, load average {load}"
    )
    head = ("run", "msg/s", "seconds", "redis CPU s", "client CPU s", "redis busy", "redis µs/msg")
    print(
        f"{head[0]:<44} {head[1]:>9} {head[2]:>7} {head[3]:>11} {head[4]:>12} {head[5]:>10} {head[6]:>12} "
        "client µs/msg"
    )
    for r in rows:
        client = f"{r['client_us_per_msg']:.2f}" if r["client_cpu_s"] else "-"
        print(
            f"{r['run']:<44} {r['msg_per_s']:>9,} {r['seconds']:>7.2f} {r['redis_cpu_s']:>11.2f} "
            f"{r['client_cpu_s']:>12.2f} {r['redis_cpu_share']:>10.0%} {r['redis_us_per_msg']:>12.2f} "
            f"{client:>13}"
        )
    print()
    print("Where the bottleneck is (one container per core, one redis-server core):")
    for r in rows:
        if not r["run"].startswith("tailrace job, 1 container,"):
            continue
        redis_cap = 1e6 / r["redis_us_per_msg"]
        one = r["msg_per_s"]
        print(
            f"  {r['run'].split(', ')[-1]}: Redis saturates at ~{redis_cap:,.0f} msg/s "
            f"({r['redis_us_per_msg']:.2f} µs/msg); one container moves {one:,} msg/s using "
            f"{r['client_us_per_msg']:.2f} µs/msg of client CPU "
            f"({r['client_us_per_msg'] / r['redis_us_per_msg']:.1f}x Redis's cost): "
            f"Redis becomes the bottleneck at ~{redis_cap / one:.1f} containers"
        )


if __name__ == "__main__":
    main()
