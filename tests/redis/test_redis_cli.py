"""``tailrace run JOB`` with Redis systems and checkpoints: one member, or --containers N."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
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


def bounded_input(redis_server: RedisServer, partitions: int, per_partition: int) -> RedisSystem:
    """Stream "in" of ``{"p": p, "i": i}`` messages, ended, and an empty one-partition "out"."""
    system = RedisSystem("redis", redis_server.url)
    system.create_stream("in", partitions)
    system.create_stream("out", 1)
    for p in range(partitions):
        for i in range(per_partition):
            system.append("in", p, {"p": p, "i": i})
    system.end_stream("in")
    return system


def test_tailrace_run_with_two_local_containers(redis_server: RedisServer, tmp_path: Path) -> None:
    system = bounded_input(redis_server, 6, 100)
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


def test_members_of_local_containers_log_progress_and_a_killed_one_fails_the_run_with_1(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # running-jobs.md: each container logs a progress line every --progress-interval; the
    # parent's exit status is 1 when a container failed, a kill -9 included (it was 9: the
    # largest |code| of its members)
    system = bounded_input(redis_server, 2, 150)
    job = write_job(tmp_path, redis_server.url)
    (tmp_path / "forward.py").write_text(TASK + SLOW)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailrace",
            "run",
            str(job),
            "--containers",
            "2",
            "--progress-interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        members: list[int] = []
        deadline = time.monotonic() + 30
        while len(members) < 2 and time.monotonic() < deadline:
            members = [
                int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _parent_of(int(pid)) == proc.pid
            ]
            time.sleep(0.05)
        assert len(members) == 2, members
        time.sleep(1.0)  # both run a while: progress lines
        os.kill(members[0], signal.SIGKILL)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert re.search(r"\[container [01]\] .*progress: \d+ processed", err), err[-3000:]
    assert "1 of 2 containers failed" in err, err[-3000:]
    system.close()


SLOW = """

import time as _time

_plain = Forward.process


def _slow(self, envelope, collector, coordinator):
    _time.sleep(0.01)
    _plain(self, envelope, collector, coordinator)


Forward.process = _slow
"""


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _with_streams(job: Path, line: str) -> None:
    job.write_text(job.read_text().replace("batch = 100\n", f"batch = 100\n{line}\n", 1))


def test_a_partition_count_that_differs_from_redis_is_refused_not_half_read(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # docs/redis.md (streams): 4 declared while Redis records 8 read partitions 0-3 only and
    # said "finished"; the run must refuse, naming the key and both counts
    job = write_job(tmp_path, redis_server.url)
    _with_streams(job, "streams = { in = 4 }")
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(80)))
    done = run_cli("load", str(job), str(data), "--stream", "redis.in", "--partitions", "8", "--end")
    assert done.returncode == 2, done.stdout + done.stderr  # the job file says 4
    assert "streams" in done.stderr and "4" in done.stderr, done.stderr
    RedisSystem("redis", redis_server.url).create_stream("in", 8)  # as another job's load would
    done = run_cli("run", str(job), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert "systems.redis.streams.in" in done.stderr and "records 8" in done.stderr, done.stderr


def test_load_records_the_job_file_s_partition_count(redis_server: RedisServer, tmp_path: Path) -> None:
    # a later job that declares another count is then refused instead of missing partitions
    job = write_job(tmp_path, redis_server.url)
    _with_streams(job, "streams = { in = 3 }")
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(30)))
    done = run_cli("load", str(job), str(data), "--stream", "redis.in", "--end")
    assert done.returncode == 0, done.stderr
    assert RedisSystem("redis", redis_server.url).partitions("in") == 3
    _with_streams(job, "streams = { out = 1 }")  # the run now reads the count from Redis
    job.write_text(job.read_text().replace("streams = { in = 3 }\n", ""))
    done = run_cli("run", str(job), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "30 messages processed" in done.stderr + done.stdout


def test_load_to_a_stream_redis_lacks_asks_for_its_partition_count(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # README "Several machines": on a fresh Redis, load without --partitions has nothing to
    # append to; the error names the option that creates the stream, and nothing is written
    job = write_job(tmp_path, redis_server.url)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(10)))
    done = run_cli("load", str(job), str(data))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "config key '--partitions'" in done.stderr and "has no stream 'in'" in done.stderr, done.stderr
    assert "--partitions N" in done.stderr, done.stderr
    assert redis_server.client().dbsize() == 0
    done = run_cli("load", str(job), str(data), "--partitions", "2", "--end")
    assert done.returncode == 0, done.stderr
    assert RedisSystem("redis", redis_server.url).partitions("in") == 2


def test_a_refused_login_is_said_so_at_once_without_the_password(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret-pw").start()
    try:
        for url in (server.url + "&password=wrong-pw", server.url):
            job = write_job(tmp_path, url)
            began = time.monotonic()
            done = run_cli("run", str(job), "--no-progress")
            assert done.returncode == 1, done.stderr
            assert "refused the login" in done.stderr and "unreachable" not in done.stderr, done.stderr
            assert "wrong-pw" not in done.stderr and "s3cret" not in done.stderr, done.stderr
            assert time.monotonic() - began < 20  # not retried as an outage
    finally:
        server.kill()


def test_a_password_a_server_without_one_refuses_is_said_so_at_start(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # a password alone (no user) logged redis-py in (HELLO 3 AUTH default PASSWORD: any
    # password, to a server with none); the member joined and took leases, then its reader
    # (AUTH PASSWORD) failed with "reading from Redis failed: auth:AuthenticationError"
    bounded_input(redis_server, 2, 5).close()
    for url in (f"unix://:s3cret-pw@{redis_server.sock}?db=0", f"{redis_server.url}&password=s3cret-pw"):
        job = write_job(tmp_path, url)
        done = run_cli("run", str(job), "--no-progress")
        assert done.returncode == 1, done.stderr
        assert "refused the login (the user and password in the URL)" in done.stderr, done.stderr
        assert "called without any password configured" in done.stderr, done.stderr
        assert "reading from Redis failed" not in done.stderr and "s3cret" not in done.stderr, done.stderr
        client = redis_server.client()
        assert not client.keys("*lease*") and not client.keys("*members*")  # it never joined


@pytest.mark.parametrize("containers", ["1", "2"])
def test_file_inputs_with_redis_checkpoints_are_refused_before_anything_runs(
    redis_server: RedisServer, tmp_path: Path, containers: str
) -> None:
    # Redis checkpoints keep Redis stream entry ids: a file job ran to its first commit, failed
    # there ("980 is not a Redis stream entry id"), and every rerun output everything again
    (tmp_path / "forward.py").write_text(TASK)
    (tmp_path / "data" / "in").mkdir(parents=True)
    (tmp_path / "data" / "in" / "partition-0.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "fr"
task = "forward.py:Forward"
inputs = ["files.in"]

[systems.files]
type = "file"
path = "data"

[checkpoints]
type = "redis"
url = "{redis_server.url}"
"""
    )
    done = run_cli("run", str(job), "--containers", containers)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{job}: config key 'inputs': input 'files.in' is not on a redis system" in done.stderr, (
        done.stderr
    )
    assert not (tmp_path / "data" / "out").exists()


def test_a_run_prints_no_result_repr_and_show_prints_offsets_as_the_summary_does(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # issue 38, item 6: a MemberResult(...) repr was logged above the summary, and
    # `checkpoints show` quoted the entry ids the summary prints bare
    system = bounded_input(redis_server, 2, 20)
    job = write_job(tmp_path, redis_server.url)
    done = run_cli("run", str(job))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MemberResult(" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert re.search(r"member \S+ left job 'cli' \(done\)", done.stderr), done.stderr[-3000:]
    summary = dict(re.findall(r"^    (redis\.in\[\d\])\s+(\S+)$", done.stdout, re.M))
    assert len(summary) == 2, done.stdout
    show = run_cli("checkpoints", "show", str(job))
    assert show.returncode == 0, show.stderr
    shown = dict(re.findall(r"^  Partition \d\s+(redis\.in\[\d\])\s+(\S+)$", show.stdout, re.M))
    assert shown == summary, show.stdout
    assert "'" not in "".join(shown.values())
    system.close()


def test_sigterm_to_local_containers_says_no_ctrl_c_and_prints_no_empty_container_lines(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # issue 38, item 6: "Ctrl-C again to force" after a SIGTERM (the hint is for Ctrl-C
    # only), and an empty "[container i]" line before each member's notice
    system = bounded_input(redis_server, 2, 2000)
    job = write_job(tmp_path, redis_server.url)
    (tmp_path / "forward.py").write_text(TASK + SLOW)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailrace", "run", str(job), "--containers", "2", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while system.client.xlen(system.keys.stream("out", 0)) < 50:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Ctrl-C" not in err, err[-3000:]
    assert "tailrace: SIGTERM: stopping gracefully" in err and "a second SIGTERM forces" in err, err[-3000:]
    assert re.search(r"\[container [01]\] tailrace: SIGTERM: stopping gracefully", err), err[-3000:]
    empty = [line for line in (out + err).splitlines() if re.fullmatch(r"\[container \d+\]\s*", line)]
    assert not empty, (out + err)[-3000:]
    system.close()
