"""A Redis-mode stop is bounded by ``task.shutdown.ms`` while Redis is down (issue 13, defect 13).

Real ``tailrace run`` processes against a real redis-server that the test pauses
(SIGSTOP) or kills while the job runs; the job is then stopped with SIGTERM / SIGINT
and must exit non-zero within the bound, saying what was not committed. One retry
setting (``[checkpoints] retry_s``) bounds every Redis call of the job.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis_support import RedisServer

from tailrace.container import ENGINES
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.redis.system import RedisSystem

TASK = """
from tailrace import StreamTask


class Forward(StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("redis.out", envelope.message, key=envelope.partition)
"""

SHUTDOWN_MS = 1500


def write_job(
    tmp_path: Path, url: str, *, retry_s: float = 60, system_extra: str = "", engine: str = "python"
) -> Path:
    (tmp_path / "forward.py").write_text(TASK)
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "bounded"
task = "forward.py:Forward"
inputs = ["redis.in"]
engine = "{engine}"

[config]
"task.commit.ms" = 600000
"task.shutdown.ms" = {SHUTDOWN_MS}

[systems.redis]
type = "redis"
url = "{url}"
batch = 50
{system_extra}

[checkpoints]
type = "redis"
url = "{url}"
lease_ms = 3000
retry_s = {retry_s}
"""
    )
    return job


def start_job(job: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_output(system: RedisSystem, proc: subprocess.Popen[str], at_least: int) -> None:
    deadline = time.monotonic() + 60
    key = system.keys.stream("out", 0)
    while system.client.xlen(key) < at_least:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job produced no output"
        time.sleep(0.05)


def fill(system: RedisSystem) -> None:
    system.create_stream("in", 2)
    system.create_stream("out", 1)
    for p in range(2):
        pipe = system.client.pipeline(transaction=False)
        for i in range(3000):
            pipe.xadd(system.keys.stream("in", p), {"m": f'{{"p": {p}, "i": {i}}}'})
        pipe.execute()  # no end marker: the job runs until stopped


@pytest.mark.parametrize(
    ("outage", "signum", "engine"),
    [
        ("paused", signal.SIGTERM, "python"),
        ("paused", signal.SIGINT, "c"),
        ("killed", signal.SIGTERM, "python"),
        ("killed", signal.SIGINT, "c"),
    ],
)
def test_a_stop_while_redis_is_down_is_bounded_and_says_what_was_not_committed(
    redis_server: RedisServer, tmp_path: Path, outage: str, signum: int, engine: str
) -> None:
    pytest.importorskip(ENGINES[engine].partition(":")[0])
    system = RedisSystem("redis", redis_server.url)
    fill(system)
    proc = start_job(write_job(tmp_path, redis_server.url, engine=engine))
    assert redis_server.proc is not None
    redis_pid = redis_server.proc.pid
    try:
        wait_output(system, proc, 1000)
        if outage == "paused":
            os.kill(redis_pid, signal.SIGSTOP)
        else:
            redis_server.kill()
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=SHUTDOWN_MS / 1000 + 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"the stop did not end within 20 s of task.shutdown.ms: {err[-3000:]}")
        took = time.monotonic() - t0
    finally:
        if outage == "paused":
            os.kill(redis_pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert took < SHUTDOWN_MS / 1000 + 4.0, (took, err[-3000:])
    assert f"stop gave up after task.shutdown.ms = {SHUTDOWN_MS} ms" in err, err[-3000:]
    assert "not committed, processed again after a restart: redis.in[" in err, err[-3000:]
    assert "processed through" in err and "(nothing committed)" in err, err[-3000:]


def test_a_stop_after_a_long_outage_says_each_failure_once_without_tracebacks(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # issue 38, item 4: Redis killed, the member heartbeats for a few seconds, then Ctrl-C:
    # the stop gave up in time with its report, but printed a traceback of tailrace's own
    # frames ("error while closing _RedisProducer.close"), one heartbeat warning a second,
    # a line per lease it could not release and a "further error while stopping" per task
    system = RedisSystem("redis", redis_server.url)
    fill(system)
    proc = start_job(write_job(tmp_path, redis_server.url, engine="c"))
    try:
        wait_output(system, proc, 1000)
        redis_server.kill()
        time.sleep(3.5)  # 3 heartbeats at least (lease_ms 3000: one a second)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=SHUTDOWN_MS / 1000 + 20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "error while closing" not in err, err[-5000:]
    assert err.count("heartbeat failed") == 1, err[-5000:]
    assert re.search(r"left without telling Redis \(\d+ failed heartbeats\)", err), err[-5000:]
    assert "could not release" not in err, err[-5000:]
    assert "reading redis failed" not in err, err[-5000:]
    # the outage failed every task's final commit with one cause: said once, the rest counted
    assert err.count("stopping on error") == 1 and "further error while stopping" not in err, err[-5000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("tailrace: error: member ") and "stop gave up" in last, err[-3000:]


def test_a_producer_closed_after_the_stop_deadline_raises_nothing(redis_server: RedisServer) -> None:
    # issue 38, item 4: its flush gave up at the deadline and close() raised it again, which
    # the container logged with a traceback; the member's error counts the entries instead
    from tailrace._stopping import StopDeadline

    system = RedisSystem("redis", redis_server.url, retry_s=30)
    system.create_stream("out", 1)
    producer = system.producer()
    producer.send("out", 0, None, {"a": 1})
    redis_server.kill()
    deadline = StopDeadline()
    system.use_stop_deadline(deadline)
    deadline.arm(0.01)
    while not deadline.due():
        time.sleep(0.01)
    producer.close()
    assert system.unacknowledged() == 1


def test_the_summary_after_a_stop_waits_briefly_for_a_redis_that_is_gone(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # issue 38, item 4: everything was committed, then Redis died and Ctrl-C stopped the job
    # at once; the summary's read of the committed offsets then retried for 60 s and ended
    # in a redis-py traceback
    system = RedisSystem("redis", redis_server.url)
    system.create_stream("in", 1)
    system.create_stream("out", 1)
    for i in range(100):
        system.append("in", 0, {"i": i})
    job = write_job(tmp_path, redis_server.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress", "--config", "task.commit.ms=50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_output(system, proc, 100)
        time.sleep(0.5)  # committed
        redis_server.kill()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "cannot read the committed offsets: Redis at" in err, err[-3000:]
    assert took < SHUTDOWN_MS / 1000 + 3 + 4, (took, err[-3000:])


def test_checkpoints_retry_s_bounds_every_redis_call(redis_server: RedisServer, tmp_path: Path) -> None:
    """Redis lost while running, no stop: reads and writes give up after [checkpoints] retry_s."""
    system = RedisSystem("redis", redis_server.url)
    fill(system)
    proc = start_job(write_job(tmp_path, redis_server.url, retry_s=1))
    try:
        wait_output(system, proc, 1000)
        redis_server.kill()
        t0 = time.monotonic()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"retry_s = 1 did not bound the outage: {err[-3000:]}")
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert took < 1 + 6, (took, err[-3000:])


def test_a_retry_setting_on_the_system_is_refused_with_redis_checkpoints(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    job = write_job(tmp_path, redis_server.url, system_extra="retry_s = 5")
    done = subprocess.run(
        [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "systems.redis.retry_s" in done.stderr and "set retry_s in [checkpoints]" in done.stderr


def test_a_second_signal_forces_the_exit_at_once(redis_server: RedisServer, tmp_path: Path) -> None:
    system = RedisSystem("redis", redis_server.url)
    fill(system)
    proc = start_job(write_job(tmp_path, redis_server.url))
    assert redis_server.proc is not None
    redis_pid = redis_server.proc.pid
    try:
        wait_output(system, proc, 1000)
        os.kill(redis_pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        os.kill(redis_pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    assert took < 1.0, took
    assert "SIGINT again: forced stop" in err


STUCK_TASK = """
import threading, time
from tailrace import AsyncStreamTask


class Stuck(AsyncStreamTask):
    def process_async(self, envelope, collector, coordinator, callback):
        collector.send("redis.out", envelope.message, key=envelope.partition)
        if envelope.partition == 0 and envelope.message["i"] == 5:
            # outlives task.shutdown.ms: never done before the stop's drain ends
            threading.Thread(target=lambda: (time.sleep(30), callback.complete()), daemon=True).start()
        else:
            callback.complete()
"""


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_stop_with_a_callback_past_task_shutdown_ms_still_commits_the_low_watermarks(
    redis_server: RedisServer, tmp_path: Path, engine: str
) -> None:
    # rule 19: outstanding callbacks are awaited up to task.shutdown.ms, then a final commit
    # writes each partition's low watermark. A member's stop is bounded by task.shutdown.ms
    # too: its drain used all of it, and the final commit then gave up at the stop's
    # deadline (exit 1, nothing committed). The drain now leaves the commit its share.
    system = RedisSystem("redis", redis_server.url)
    fill(system)
    job = write_job(tmp_path, redis_server.url, engine=engine)
    (tmp_path / "stuck.py").write_text(STUCK_TASK)
    job.write_text(
        job.read_text()
        .replace('task = "forward.py:Forward"', 'task = "stuck.py:Stuck"')
        .replace('"task.commit.ms" = 600000', '"task.commit.ms" = 600000\n"task.max.concurrency" = 8')
    )
    proc = start_job(job)
    try:
        wait_output(system, proc, 1000)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=SHUTDOWN_MS / 1000 + 20)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert took < SHUTDOWN_MS / 1000 + 4.0, (took, err[-3000:])
    assert "callbacks still outstanding after 1125 ms (task.shutdown.ms=1500, less 375 ms" in err, err[-3000:]
    keys = RedisCheckpointStore(redis_server.url).keys
    committed = [system.client.get(keys.checkpoint("in", p, "bounded")) for p in range(2)]
    assert all(committed), committed  # both partitions: the stop's final commit ran
    first = system.client.xrange(system.keys.stream("in", 0), count=6)
    assert committed[0] == first[4][0], (committed, first)  # the low watermark: before the stuck one
