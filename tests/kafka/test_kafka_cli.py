"""``tailrace run JOB`` with Kafka inputs: each process is a member of the job's
consumer group (tailrace.kafka.membership), checkpoints shared in Redis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster
from .test_kafka_contract import _items, _wait

TASK = """
import time

from tailrace import StreamTask


class Forward(StreamTask):
    def process(self, envelope, collector, coordinator):
        time.sleep(0.003)  # slow enough to be stopped mid-stream
        collector.send("kafka.out", envelope.message, key=envelope.key, partition=0)
"""


def write_job(tmp_path: Path, cluster: Cluster, checkpoints: str, session_ms: int = 6000) -> Path:
    (tmp_path / "forward.py").write_text(TASK)
    producer = "" if cluster.real else '"enable.idempotence" = false'
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "kafka-cli"
task = "forward.py:Forward"
inputs = ["kafka.{cluster.topics["in"]}"]

[config]
"task.commit.ms" = 200

[systems.kafka]
type = "kafka"
bootstrap_servers = "{cluster.bootstrap}"

[systems.kafka.consumer]
"session.timeout.ms" = {session_ms}
"heartbeat.interval.ms" = {session_ms // 4}

[systems.kafka.producer]
{producer}

[checkpoints]
{checkpoints}
"""
    )
    return job


def _outputs(cluster: Cluster) -> list[int]:
    return [v["i"] for v in cluster.json_values("out")]


_STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    """Whatever a test started and left running (it failed, or a wait timed out) is
    killed with its containers: nothing outlives its test."""
    yield
    while _STARTED:
        p = _STARTED.pop()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _start(job: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # its own group: _no_process_left kills its containers too
        )
    _STARTED.append(proc)
    return proc


class _Feed(threading.Thread):
    """Produces ``{"i": i}`` round robin over 4 partitions of ``in``, about 200 a second,
    until stopped: the stream is still flowing while members join and leave."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.produced = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.cluster.produce("in", _items(20, 4, start=self.produced))
                self.produced += 20
                self.stop.wait(0.1)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def test_two_tailrace_run_processes_hand_over_on_sigterm(
    kafka_cluster: Any, redis_url: str, tmp_path: Path
) -> None:
    # rules 13, 19, 28: two `tailrace run` members of one job share a topic that is being
    # written; the first leaves on SIGTERM mid-stream and the second takes its partitions
    # over: nothing lost, no duplicate (every hand-over here is graceful)
    cluster = kafka_cluster({"in": 4, "out": 1})
    job = write_job(tmp_path, cluster, f'type = "redis"\nurl = "{redis_url}"\nlease_ms = 2000')
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    feed = _Feed(cluster)
    feed.start()
    a = _start(job, log_a)
    b: subprocess.Popen[bytes] | None = None
    try:
        assert _wait(lambda: len(_outputs(cluster)) >= 50, 60), log_a.read_text()[-3000:]
        b = _start(job, log_b)
        # the group gives b some partitions: a hands them over (revoke: drain, commit, release)
        assert _wait(lambda: "running kafka." in log_b.read_text(), 60), log_b.read_text()[-3000:]
        a.send_signal(signal.SIGTERM)
        assert a.wait(60) == 0, log_a.read_text()[-3000:]
        # b takes a's partitions over while the feed goes on
        after = feed.produced
        assert _wait(lambda: feed.produced >= after + 200, 30)
        feed.stop.set()
        feed.join(30)
        assert feed.error is None, feed.error
        n = feed.produced
        assert _wait(lambda: len(_outputs(cluster)) >= n, 60), (
            f"{len(_outputs(cluster))} outputs of {n}; missing "
            f"{sorted(set(range(n)) - set(_outputs(cluster)))[:40]}"
        )
    finally:
        feed.stop.set()
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        assert b is not None and b.wait(60) == 0, log_b.read_text()[-3000:]
        a.wait(60)
    text_a, text_b = log_a.read_text(), log_b.read_text()
    assert "member of job 'kafka-cli' left (stop)" in text_a, text_a[-3000:]
    assert text_b.count("running kafka.") >= 2, text_b[-3000:]  # its own share, then a's too
    got = _outputs(cluster)
    assert sorted(got) == list(range(n)), (
        f"duplicates: {len(got) - len(set(got))}, missing: {sorted(set(range(n)) - set(got))[:20]}"
    )
    # the summary lists the committed offsets: each partition at its last message
    for p in range(4):
        shown = rf"kafka\.{cluster.topics['in']}\[{p}\] +{n // 4 - 1}\n"
        assert re.search(shown, text_b), text_b[-3000:]


def test_tailrace_run_with_two_local_kafka_containers(
    kafka_cluster: Any, redis_url: str, tmp_path: Path
) -> None:
    # --containers 2: two member processes share the group's partitions; SIGTERM to the
    # parent stops both gracefully; the parent prints the committed offsets once
    cluster = kafka_cluster({"in": 4, "out": 1})
    n = 400
    cluster.produce("in", _items(n, 4))
    job = write_job(tmp_path, cluster, f'type = "redis"\nurl = "{redis_url}"\nlease_ms = 2000')
    log = tmp_path / "run.log"
    proc = _start(job, log, "--containers", "2")
    try:
        both = lambda: all(f"[container {i}]" in log.read_text() for i in (0, 1))  # noqa: E731
        assert _wait(lambda: len(_outputs(cluster)) >= n and both(), 90), log.read_text()[-3000:]
        running = [ln for ln in log.read_text().splitlines() if "running kafka." in ln]
        assert any(ln.startswith("[container 0]") for ln in running), log.read_text()[-3000:]
        assert any(ln.startswith("[container 1]") for ln in running), log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert text.count("member of job 'kafka-cli' left (stop)") == 2, text[-3000:]
    assert sorted(_outputs(cluster)) == list(range(n))
    assert text.count("committed offsets:") == 1, text[-3000:]
    for p in range(4):
        assert re.search(rf"\n    kafka\.{cluster.topics['in']}\[{p}\] +{n // 4 - 1}\n", text), text[-3000:]
    shown = subprocess.run(
        [sys.executable, "-m", "tailrace", "checkpoints", "show", str(job)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    for p in range(4):  # the Kafka offset, not the "0-N" id Redis keeps it as
        assert re.search(rf"kafka\.{cluster.topics['in']}\[{p}\] +{n // 4 - 1}\n", shown.stdout), shown.stdout


def test_run_kafka_job_with_several_containers_needs_a_shared_store(
    kafka_cluster: Any, tmp_path: Path
) -> None:
    cluster = kafka_cluster({"in": 1, "out": 1})
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    done = subprocess.run(
        [sys.executable, "-m", "tailrace", "run", str(job), "--containers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "checkpoints.type" in done.stderr and "redis" in done.stderr, done.stderr


def test_a_paused_member_loses_its_partitions_and_cannot_commit_them(
    kafka_cluster: Any, redis_url: str, tmp_path: Path
) -> None:
    # rule 28: member a is paused (SIGSTOP) past its session timeout and its Redis leases;
    # the group hands everything to b. When a resumes it holds stale partitions: every
    # commit it tries for them is refused (by the group and by the Redis lease), so the
    # committed offsets are b's alone; nothing is lost (a's uncommitted work is replayed)
    cluster = kafka_cluster({"in": 4, "out": 1})
    job = write_job(tmp_path, cluster, f'type = "redis"\nurl = "{redis_url}"\nlease_ms = 1000', 2000)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    feed = _Feed(cluster)
    feed.start()
    a = _start(job, log_a)
    b: subprocess.Popen[bytes] | None = None
    try:
        assert _wait(lambda: len(_outputs(cluster)) >= 50, 60), log_a.read_text()[-3000:]
        a.send_signal(signal.SIGSTOP)
        b = _start(job, log_b)
        every = ", ".join(f"kafka.{cluster.topics['in']}[{p}]" for p in range(4))
        assert _wait(lambda: f"running {every}" in log_b.read_text(), 60), log_b.read_text()[-3000:]
        a.send_signal(signal.SIGCONT)
        # librdkafka finds its session expired: the partitions are lost, and the running
        # container's final commit for them is refused
        assert _wait(lambda: "no longer owns" in log_a.read_text(), 30), log_a.read_text()[-3000:]
        assert "lost kafka." in log_a.read_text()
        after = feed.produced
        assert _wait(lambda: feed.produced >= after + 100, 30)
        feed.stop.set()
        feed.join(30)
        n = feed.produced
        assert _wait(lambda: set(_outputs(cluster)) >= set(range(n)), 90), log_b.read_text()[-3000:]
    finally:
        feed.stop.set()
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        assert b is not None and b.wait(60) == 0, log_b.read_text()[-3000:]
        assert a.wait(60) == 0, log_a.read_text()[-3000:]
    text_a, text_b = log_a.read_text(), log_b.read_text()
    assert set(_outputs(cluster)) == set(range(n))
    assert re.search(r"left \(stop\) .* lost [1-9][0-9]*, commits refused [1-9]", text_a), text_a[-3000:]
    for p in range(4):  # the job's offsets: every partition at its last message, by whoever owns it now
        shown = rf"kafka\.{cluster.topics['in']}\[{p}\] +{n // 4 - 1}\n"
        assert re.search(shown, text_b), text_b[-3000:]


def test_tailrace_run_kafka_job_with_sqlite_checkpoints(kafka_cluster: Any, tmp_path: Path) -> None:
    # one member on one machine, SQLite checkpoints, a bounded input: the run ends at the
    # end of the topic, prints the committed offsets, and a second run resumes after them
    cluster = kafka_cluster({"in": 2, "out": 1})
    cluster.produce("in", _items(100, 2))
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    job.write_text(job.read_text().replace('type = "kafka"', 'type = "kafka"\nbounded = true'))

    def run() -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=90)

    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    assert "left (end_of_stream)" in first.stdout and "100 messages processed" in first.stdout, first.stdout
    for p in range(2):
        assert re.search(rf"kafka\.{cluster.topics['in']}\[{p}\] +49\n", first.stdout), first.stdout
    cluster.produce("in", _items(10, 2, start=100))
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    assert "10 messages processed" in second.stdout, second.stdout
    assert sorted(_outputs(cluster)) == list(range(110))


def test_a_member_waits_for_the_leases_a_dead_member_left(
    kafka_cluster: Any, redis_url: str, tmp_path: Path
) -> None:
    # rule 28: the Redis leases of a member that died (no release) still hold when the
    # group assigns its partitions to a new member: the new member runs nothing until they
    # expire, then takes them with a newer token and processes everything
    import redis

    cluster = kafka_cluster({"in": 2, "out": 1})
    cluster.produce("in", _items(100, 2))
    job = write_job(tmp_path, cluster, f'type = "redis"\nurl = "{redis_url}"\nlease_ms = 2000')
    job.write_text(job.read_text().replace('type = "kafka"', 'type = "kafka"\nbounded = true'))
    from tailrace.redis._io import Keys

    keys = Keys("tr")
    with redis.Redis.from_url(redis_url) as r:  # the dead member's leases: 5 s left
        for p in range(2):
            assert r.set(keys.lease(cluster.topics["in"], p, "kafka-cli"), "dead|7", px=5000, nx=True)
    log = tmp_path / "run.log"
    proc = _start(job, log)
    assert proc.wait(90) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "waiting for the Redis lease" in text, text[-3000:]
    # nothing ran before the dead member's leases expired and this member took them
    assert (
        text.index("waiting for the Redis lease")
        < text.index("acquired kafka.")
        < text.index("running kafka.")
    )
    assert "left (end_of_stream)" in text and "100 messages processed" in text, text[-3000:]
    assert sorted(_outputs(cluster)) == list(range(100))


@pytest.mark.parametrize("containers", [1, 2])
def test_a_stop_while_the_broker_is_down_ends_within_task_shutdown_ms(
    kafka_cluster: Any, redis_url: str, tmp_path: Path, containers: int
) -> None:
    # rule 21 and task.shutdown.ms: the broker vanishes mid-run (the members' session has
    # not expired: they still own their partitions), then SIGTERM. The producer's flush
    # and the group commit can never complete; the stop gives up at task.shutdown.ms
    # (plus the backstop's grace at most), commits nothing past unacknowledged output,
    # says what a restart processes again, and exits 1. librdkafka's reconnect reports
    # (several a second per client) are thinned out in the log.
    cluster = kafka_cluster({"in": 4, "out": 1})
    if cluster.real:
        pytest.skip("kills the broker: Mokapi only")
    cluster.produce("in", _items(2000, 4))
    job = write_job(tmp_path, cluster, f'type = "redis"\nurl = "{redis_url}"\nlease_ms = 2000', 30000)
    config = '"task.commit.ms" = 200'
    job.write_text(job.read_text().replace(config, config + '\n"task.shutdown.ms" = 2000'))
    log = tmp_path / "run.log"
    proc = _start(job, log, "--containers", str(containers))
    running = lambda: log.read_text().count("running kafka.") >= containers  # noqa: E731
    assert _wait(lambda: running() and len(_outputs(cluster)) >= 100, 90), log.read_text()[-3000:]
    cluster.kill_broker()
    time.sleep(3)  # the members notice: sends queue up, the next commit cannot complete
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    code = proc.wait(60)
    took = time.monotonic() - t0
    text = log.read_text()
    assert took < 2 + 5 + 3, f"the stop took {took:.1f} s\n{text[-3000:]}"  # shutdown.ms + GRACE_S + slack
    assert code == 1, text[-3000:]
    gave_up = [ln for ln in text.splitlines() if "stop gave up after task.shutdown.ms = 2000 ms" in ln]
    assert len(gave_up) == containers, text[-3000:]
    for ln in gave_up:  # what was processed and not committed, per partition
        assert re.search(rf"kafka\.{cluster.topics['in']}\[\d\] processed through \d+", ln), ln
    # what the members processed before the stop still counts in their summaries
    assert len(re.findall(r"left \(\w+\): [1-9][\d,]* messages processed", text)) == containers, text[-3000:]
    refused = [ln for ln in text.splitlines() if "Connection refused" in ln]
    assert len(refused) < 20 * containers, f"{len(refused)} lines about refused connections"


def _run_job(job: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def test_a_bounded_job_that_starts_at_latest_ends_at_once(kafka_cluster: Any, tmp_path: Path) -> None:
    # start = "latest" with bounded = true: each partition starts at the end it has when
    # read, so the job ends at once (it waited for ever for a message to reach an end it
    # was already at)
    cluster = kafka_cluster({"in": 2, "out": 1})
    cluster.produce("in", _items(10, 2))
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    latest = 'type = "kafka"\nbounded = true\nstart = "latest"'
    job.write_text(job.read_text().replace('type = "kafka"', latest))
    done = _run_job(job)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "left (end_of_stream)" in done.stdout and " 0 messages processed" in done.stdout, done.stdout


def test_a_missing_input_topic_is_an_error_naming_it(kafka_cluster: Any, tmp_path: Path) -> None:
    # a member subscribing to a topic that does not exist waited for it without a word;
    # like a plain container, it now fails at start naming the topic
    cluster = kafka_cluster({"in": 1, "out": 1})
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    job.write_text(job.read_text().replace(f'"kafka.{cluster.topics["in"]}"', '"kafka.tr-nosuch"'))
    done = _run_job(job)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "kafka.tr-nosuch" in done.stderr and "has no topic 'tr-nosuch'" in done.stderr, done.stderr[-3000:]


HUNG_TASK = """
import threading, time

from tailrace import AsyncStreamTask


class Hung(AsyncStreamTask):
    def process_async(self, envelope, collector, coordinator, callback):
        collector.send("kafka.out", envelope.message, key=envelope.key, partition=0)
        if (envelope.partition, envelope.offset) == (0, 5):  # outlives task.shutdown.ms
            threading.Thread(target=lambda: (time.sleep(30), callback.complete()), daemon=True).start()
        else:
            time.sleep(0.003)
            callback.complete()
"""


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_stop_with_a_callback_past_task_shutdown_ms_commits_the_low_watermarks(
    kafka_cluster: Any, tmp_path: Path, engine: str
) -> None:
    # rule 19: outstanding callbacks are awaited up to task.shutdown.ms, then a final commit
    # writes each partition's low watermark. The member's drain used all of task.shutdown.ms,
    # its final commit then gave up at the stop's deadline ("the Kafka group did not answer
    # the commit ... before the stop's deadline"), and the run exited 1
    cluster = kafka_cluster({"in": 2, "out": 1})
    cluster.produce("in", _items(400, 2))
    job = write_job(tmp_path, cluster, 'type = "sqlite"\npath = "state/ckpt.db"')
    (tmp_path / "hung.py").write_text(HUNG_TASK)
    text = job.read_text().replace('task = "forward.py:Forward"', 'task = "hung.py:Hung"')
    text = text.replace("[config]", f'engine = "{engine}"\n\n[config]')
    config = '"task.commit.ms" = 200'
    text = text.replace(config, config + '\n"task.shutdown.ms" = 1500\n"task.max.concurrency" = 8')
    job.write_text(text)
    log = tmp_path / "run.log"
    proc = _start(job, log)
    # partition 0's hung message (i = 10) has run, and partition 1 flows
    started = lambda: 10 in _outputs(cluster) and len(_outputs(cluster)) >= 100  # noqa: E731
    assert _wait(started, 90), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    out = log.read_text()
    assert code == 0, out[-3000:]
    assert "callbacks still outstanding after 1125 ms (task.shutdown.ms=1500, less 375 ms" in out, out[-3000:]
    shown = subprocess.run(
        [sys.executable, "-m", "tailrace", "checkpoints", "show", str(job)], capture_output=True, text=True
    )
    assert re.search(rf"kafka\.{cluster.topics['in']}\[0\] +4\n", shown.stdout), shown.stdout + shown.stderr
    assert re.search(rf"kafka\.{cluster.topics['in']}\[1\] +\d+\n", shown.stdout), shown.stdout
