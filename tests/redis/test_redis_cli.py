"""``tailrace run JOB`` with Redis systems and checkpoints: one member, or --containers N."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from redis_support import RedisServer

from tailrace.redis.system import RedisSystem

TASK = """
from tailrace import StreamTask


class Forward(StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("redis.out", envelope.message, key=envelope.partition)
"""


def write_job(tmp_path: Path, url: str) -> Path:
    (tmp_path / "forward.py").write_text(TASK)
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "cli"
task = "forward.py:Forward"
inputs = ["redis.in"]
engine = "python"

[config]
"task.commit.ms" = 100

[systems.redis]
type = "redis"
url = "{url}"
batch = 100

[checkpoints]
type = "redis"
url = "{url}"
lease_ms = 1500
"""
    )
    return job


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailrace", *args], capture_output=True, text=True, timeout=timeout
    )


def test_tailrace_run_with_two_local_containers(redis_server: RedisServer, tmp_path: Path) -> None:
    system = RedisSystem("redis", redis_server.url)
    system.create_stream("in", 6)
    system.create_stream("out", 1)
    for p in range(6):
        for i in range(100):
            system.append("in", p, {"p": p, "i": i})
    system.end_stream("in")
    job = write_job(tmp_path, redis_server.url)
    done = run_cli("run", str(job), "--containers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("member ") == 2, done.stdout  # one summary line per container
    out = [m for _, _, m in system.read_all("out", 0)]
    assert sorted((m["p"], m["i"]) for m in out) == [(p, i) for p in range(6) for i in range(100)]
    again = run_cli("run", str(job))  # every partition is done: nothing is processed again
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 messages processed" in again.stdout
    assert len(system.read_all("out", 0)) == 600
    system.close()


def test_tailrace_run_names_an_unreachable_redis(tmp_path: Path) -> None:
    url = f"unix://{tmp_path}/absent.sock?db=0"
    job = write_job(tmp_path, url)
    done = run_cli("run", str(job))
    assert done.returncode == 1
    assert "absent.sock" in done.stderr and "unreachable" in done.stderr, done.stderr


def test_several_containers_need_redis_checkpoints_unless_the_inputs_are_files(tmp_path: Path) -> None:
    # file inputs split over containers with SQLite checkpoints (tests/jobs/test_containers.py);
    # inputs that live in the process (memory) need Redis to be shared
    (tmp_path / "forward.py").write_text(TASK)
    job = tmp_path / "job.toml"
    job.write_text(
        json.dumps({}).replace("{}", "")
        + """
[job]
name = "mem"
task = "forward.py:Forward"
inputs = ["mem.in"]

[systems.mem]
type = "memory"
"""
    )
    done = run_cli("run", str(job), "--containers", "2")
    assert done.returncode == 2
    assert "config key '--containers'" in done.stderr and "not a file input" in done.stderr, done.stderr
