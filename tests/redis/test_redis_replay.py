"""``tailrace replay`` to a Redis input (docs/bad-messages.md): the dead letters of a Redis job
go back to their partitions by XADD, and a run after the fix processes them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from redis_support import RedisServer

from tailrace.files import read_stream
from tailrace.redis.system import RedisSystem

TASK = """
import tailrace

class Sums(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        m = envelope.message
        amount = {AMOUNT}
        collector.send("files.totals", {{"user": m["user"], "amount": amount, "id": m["id"]}})
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailrace", *args], capture_output=True, text=True, timeout=60
    )


def _run_until(job: Path, tmp_path: Path, outputs: int) -> str:
    """Run the (unbounded) job until ``outputs`` lines are out, then stop it gracefully."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            done = sum(
                f.read_bytes().count(b"\n") for f in (tmp_path / "data" / "totals").glob("partition-*.jsonl")
            )
            if done >= outputs or proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # whatever else it would do (nothing: the check below says so)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    return out


def test_replay_xadds_the_dead_letters_to_their_redis_partitions(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    system = RedisSystem("redis", redis_server.url)
    system.create_stream("in", 2)
    inputs = []
    for p in range(2):
        for i in range(40):
            m = {"user": f"u{i % 3}", "id": f"{p}-{i}", ("amont" if i % 13 == 5 else "amount"): i}
            inputs.append(m)
            system.append("in", p, m, key=m["user"])
    bad = [m for m in inputs if "amont" in m]
    (tmp_path / "task.py").write_text(TASK.format(AMOUNT='m["amount"]'))
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "sums"
task = "task.py:Sums"
inputs = ["redis.in"]

[config]
"task.commit.ms" = 50
"task.error.policy" = "dead-letter"
"task.error.stream" = "files.dead-letters"

[systems.redis]
type = "redis"
url = "{redis_server.url}"

[systems.files]
type = "file"
path = "data"

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"
"""
    )
    out = _run_until(job, tmp_path, len(inputs) - len(bad))
    assert f"{len(bad)} bad messages dead-lettered" in out, out
    letters = [x for part in read_stream(tmp_path / "data" / "dead-letters") for x in part]
    # a Redis input reads an entry's bytes back (raw): the letters hold them
    assert all("bytes" in x and "value" not in x for x in letters), letters
    assert sorted(json.loads(x["bytes"])["id"] for x in letters) == sorted(m["id"] for m in bad)

    (tmp_path / "task.py").write_text(TASK.format(AMOUNT='m.get("amount", m.get("amont"))'))
    r = _cli("replay", str(job), str(tmp_path / "data" / "dead-letters"))
    assert r.returncode == 0, r.stderr
    per_partition = Counter(int(m["id"].split("-")[0]) for m in bad)
    for p, n in per_partition.items():
        assert f"redis.in[{p}]: {n}\n" in r.stdout, r.stdout
    for p in range(2):  # appended to their partitions, with their keys
        tail = system.read_all("in", p)[40:]
        assert [(k, m) for _, k, m in tail] == [(m["user"], m) for m in bad if m["id"].startswith(f"{p}-")]
    (tmp_path / "data" / "dead-letters").rename(tmp_path / "replayed")

    out = _run_until(job, tmp_path, len(inputs))
    assert "dead-lettered" not in out, out
    totals = [x for part in read_stream(tmp_path / "data" / "totals") for x in part]
    assert Counter(t["id"] for t in totals) == Counter(m["id"] for m in inputs)

    system.end_stream("in")  # an ended stream is refused: a reader never reads past its end marker
    r = _cli("replay", str(job), str(tmp_path / "replayed"))
    assert r.returncode == 1 and "stream redis.in has ended: redis.in[0], redis.in[1] end" in r.stderr, (
        r.stderr
    )
    assert len(system.read_all("in", 0)) == 40 + per_partition[0]
    system.close()
