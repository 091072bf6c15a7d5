"""Redis jobs get the SQLite jobs' tooling: ``tailrace load`` (pipelined), committed
offsets after a run, ``checkpoints show|reset``, ``--metrics-port`` (with a ``job``
label), the live view, and ``--containers`` output prefixed per container."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from redis_support import RedisServer

from tailrace.collector import key_partition
from tailrace.redis.system import RedisSystem

TASK = """
import os
import time

from tailrace import StreamTask


class Forward(StreamTask):
    def process(self, envelope, collector, coordinator):
        time.sleep(float(os.environ.get("SLOW_S", "0")))
        collector.send("redis.out", envelope.message, key=envelope.partition)
"""


RUN = [sys.executable, "-m", "tailrace", "run"]


def write_job(tmp_path: Path, url: str) -> Path:
    (tmp_path / "forward.py").write_text(TASK)
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
[job]
name = "tools"
task = "forward.py:Forward"
inputs = ["redis.in"]

[config]
"task.commit.ms" = 100

[systems.redis]
type = "redis"
url = "{url}"

[checkpoints]
type = "redis"
url = "{url}"
lease_ms = 1500
"""
    )
    return job


def cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "tailrace", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def load(tmp_path: Path, job: Path, n: int, *extra: str) -> subprocess.CompletedProcess[str]:
    data = tmp_path / "clicks.jsonl"
    data.write_text("".join(json.dumps({"user": f"u{i % 97}", "i": i}) + "\n" for i in range(n)))
    return cli("load", str(job), str(data), "--partitions", "4", "--key-field", "user", *extra)


def test_load_run_show_reset(redis_server: RedisServer, tmp_path: Path) -> None:
    job = write_job(tmp_path, redis_server.url)
    loaded = load(tmp_path, job, 8000, "--end")
    assert loaded.returncode == 0, loaded.stderr
    assert "appended 8,000 messages" in loaded.stdout and "to redis.in" in loaded.stdout
    system = RedisSystem("redis", redis_server.url)
    per_partition = [system.read_all("in", p) for p in range(4)]
    assert sum(len(x) for x in per_partition) == 8000
    for p, entries in enumerate(per_partition):  # placed by key, as collector.send(key=...) would
        assert all(key_partition(m["user"], 4) == p and k == m["user"] for _, k, m in entries)
        assert [m["i"] for _, _, m in entries] == sorted(m["i"] for _, _, m in entries)  # file order

    done = cli("run", str(job), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    # the final summary as docs/running-jobs.md lists it: reason, seconds, messages and
    # messages/s, skipped lines, committed offsets
    assert re.search(
        r"left \(done\) after [0-9.]+ s: 8,000 messages processed \([0-9,]+ msg/s\)", done.stdout
    )
    assert "\n  0 bad lines skipped\n" in done.stdout, done.stdout
    assert "  committed offsets:" in done.stdout
    for p, entries in enumerate(per_partition):
        assert f"redis.in[{p}]" in done.stdout and entries[-1][0] in done.stdout, done.stdout

    shown = cli("checkpoints", "show", str(job))
    assert shown.returncode == 0, shown.stderr
    for p, entries in enumerate(per_partition):
        # entry ids bare, as the run's summary prints them (issue 38, item 6: they were quoted)
        assert re.search(rf"^  Partition {p}\s+redis\.in\[{p}\]\s+{entries[-1][0]}$", shown.stdout, re.M), (
            shown.stdout
        )
    reset = cli("checkpoints", "reset", str(job), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "deleted 4 checkpoints of job 'tools'" in reset.stdout
    again = cli("checkpoints", "show", str(job))
    assert again.returncode == 0 and "no checkpoints" in again.stdout
    rerun = cli("run", str(job), "--no-progress")  # from the beginning again
    assert rerun.returncode == 0 and "8,000 messages processed" in rerun.stdout, rerun.stderr[-3000:]
    system.close()


def test_load_refuses_bad_counts_naming_the_option(redis_server: RedisServer, tmp_path: Path) -> None:
    # usage mistakes are one line and exit 2, never a traceback
    job = write_job(tmp_path, redis_server.url)
    assert load(tmp_path, job, 10).returncode == 0  # the stream now has 4 partitions
    data = str(tmp_path / "clicks.jsonl")
    other = cli("load", str(job), data, "--partitions", "2")
    assert other.returncode == 2, other.stderr
    assert "config key '--partitions'" in other.stderr and "4 partitions" in other.stderr, other.stderr
    assert "Traceback" not in other.stderr
    for option, value in (("--partitions", "0"), ("--batch", "0"), ("--batch", "-5")):
        bad = cli("load", str(job), data, option, value)
        assert bad.returncode == 2, bad.stderr
        assert f"argument {option}: expected an integer >= 1" in bad.stderr, bad.stderr


def test_load_says_what_is_wrong_with_a_path_that_is_not_a_file(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # /dev/null and a directory were said to be "no such file", though they exist
    job = write_job(tmp_path, redis_server.url)
    for path, said in (
        (tmp_path, "is a directory"),
        (Path("/dev/null"), "not a regular file"),
        (tmp_path / "absent.jsonl", "no such file"),
    ):
        done = cli("load", str(job), str(path), "--partitions", "1")
        assert done.returncode == 2, done.stderr
        assert f"tailrace: error: {path}: {said}" in done.stderr, done.stderr
    assert redis_server.client().dbsize() == 0  # nothing created


def test_show_and_reset_of_a_job_whose_stream_does_not_exist_yet(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # they failed with "tailrace: error: ... has no stream 'in'" (exit 1): a job that never
    # ran has no checkpoints, as a SQLite job that never ran is told
    job = write_job(tmp_path, redis_server.url)
    absent = (
        f"input redis.in does not exist yet: Redis at {redis_server.url} has no stream 'in'; "
        f"create it with: tailrace load {job} FILE --partitions N"
    )
    shown = cli("checkpoints", "show", str(job))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1:] == [
        f"  {absent}",
        "  no checkpoints: the next run starts every input from the beginning",
    ], shown.stdout
    reset = cli("checkpoints", "reset", str(job), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.splitlines() == [
        absent,
        "nothing to delete: no input stream of job 'tools' exists yet",
    ]
    assert redis_server.client().dbsize() == 0  # nothing written


def test_load_refuses_a_stream_that_has_ended(redis_server: RedisServer, tmp_path: Path) -> None:
    # redis.md: an end marker is final, entries after it are never read; load appended
    # after it without a word
    job = write_job(tmp_path, redis_server.url)
    assert load(tmp_path, job, 10, "--end").returncode == 0
    client = redis_server.client()
    before = {k: client.xlen(k) for k in client.keys("tr:{in:*}:s")}
    assert len(before) == 4
    for extra in ((), ("--end",)):
        again = load(tmp_path, job, 10, *extra)
        assert again.returncode == 2, again.stderr
        assert (
            "tailrace: error: stream redis.in has ended: redis.in[0], redis.in[1], redis.in[2], redis.in[3] "
            "end with an end marker" in again.stderr
        ), again.stderr
        assert "nothing was appended" in again.stderr, again.stderr
    assert {k: client.xlen(k) for k in before} == before


def test_load_refuses_a_message_without_its_key_field(redis_server: RedisServer, tmp_path: Path) -> None:
    # a --key-field missing from every line (a misspelt field) silently loaded round robin
    job = write_job(tmp_path, redis_server.url)
    data = tmp_path / "keyed.jsonl"
    data.write_text('{"user": "a", "i": 1}\n{"user": "b", "i": 2}\n\n[3]\n{"user": "c", "i": 4}\n')
    system = RedisSystem("redis", redis_server.url)
    typo = cli("load", str(job), str(data), "--partitions", "2", "--key-field", "usr")
    assert typo.returncode == 1, typo.stderr
    assert (
        f"tailrace: error: {data}:1: the message has no field 'usr' (--key-field); its fields: 'user', 'i'; "
        "nothing was appended" in typo.stderr
    ), typo.stderr
    assert [system.read_all("in", p) for p in range(2)] == [[], []]
    bad = cli("load", str(job), str(data), "--key-field", "user")
    assert bad.returncode == 1, bad.stderr
    assert (
        f"tailrace: error: {data}:4: the message is an array, not a JSON object with the --key-field 'user'; "
        "the 2 messages before line 4 were appended to stream 'in', none from it on" in bad.stderr
    ), bad.stderr
    loaded = sorted(m["i"] for p in range(2) for _, _, m in system.read_all("in", p))
    assert loaded == [1, 2]
    text = cli("load", str(job), str(data), "--key-field", "user", "--format", "text")
    assert text.returncode == 2, text.stderr
    assert "config key '--key-field': a text file's messages are strings" in text.stderr, text.stderr
    system.close()


def test_load_is_pipelined(redis_server: RedisServer, tmp_path: Path) -> None:
    job = write_job(tmp_path, redis_server.url)
    loaded = load(tmp_path, job, 20000)
    assert loaded.returncode == 0, loaded.stderr
    rate = float(loaded.stdout.split("(")[1].split(" msg/s")[0].replace(",", ""))
    system = RedisSystem("redis", redis_server.url)
    t0 = time.monotonic()
    for i in range(2000):  # one XADD per round trip, the way the issue measured it
        system.append("in", 0, {"i": i})
    one_by_one = 2000 / (time.monotonic() - t0)
    system.close()
    assert rate > 2 * one_by_one, (rate, one_by_one)


def test_reset_is_refused_while_the_job_runs(redis_server: RedisServer, tmp_path: Path) -> None:
    job = write_job(tmp_path, redis_server.url)
    assert load(tmp_path, job, 200).returncode == 0  # no end marker: the job keeps running
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailrace", "run", str(job), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = cli("checkpoints", "show", str(job))
            if "Partition 3" in shown.stdout:
                break
            time.sleep(0.2)
        refused = cli("checkpoints", "reset", str(job), "--yes")
        assert refused.returncode == 1 and "is running" in refused.stderr, refused.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "committed offsets:" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, needle: str, timeout: float = 30) -> str:
    body = ""
    deadline = time.monotonic() + timeout
    while needle not in body and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                body = resp.read().decode()
        except OSError:
            time.sleep(0.1)
    return body


def test_metrics_and_live_view_in_redis_mode(redis_server: RedisServer, tmp_path: Path) -> None:
    job = write_job(tmp_path, redis_server.url)
    assert load(tmp_path, job, 400).returncode == 0
    port = _free_port()
    proc = subprocess.Popen(
        [*RUN, str(job), "--progress", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "SLOW_S": "0.005"},
    )
    try:
        body = _scrape(port, 'tailrace_task_processed_total{job="tools",task="Partition 0"}')
        assert 'tailrace_task_processed_total{job="tools",task="Partition 0"}' in body, body
        assert 'tailrace_partition_lag{job="tools",partition="redis.in[3]",task="Partition 3"}' in body
        # the committed entry id's time (Redis ids are no numbers), once a commit happened
        committed = 'tailrace_partition_committed_entry_ms{job="tools",partition="redis.in[0]"'
        body = _scrape(port, committed)
        assert re.search(re.escape(committed) + r',task="Partition 0"} 1\.[0-9]+e\+12', body), body
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)  # the view, without its terminal codes
    assert "tailrace tools (c engine)" in shown and "committed" in shown, shown[-3000:]
    assert re.search(r"^redis\.in\[0\]\s+\d+-\d+\s+[\d,]+$", shown, re.M), shown[-3000:]
    assert "committed offsets:" in out


def test_local_containers_prefix_their_lines_and_serve_metrics(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    job = write_job(tmp_path, redis_server.url)
    assert load(tmp_path, job, 2000).returncode == 0
    port = _free_port()
    proc = subprocess.Popen(
        [*RUN, str(job), "--containers", "2", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "SLOW_S": "0.002"},
    )
    try:
        for p in (port, port + 1):
            body = _scrape(p, 'tailrace_task_processed_total{job="tools"')
            assert 'tailrace_task_processed_total{job="tools"' in body, (p, body)
    finally:
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    member_lines = [x for x in err.splitlines() if "member " in x and "joined job" in x]
    assert sorted(x[: len("[container 0]")] for x in member_lines) == ["[container 0]", "[container 1]"], err
    for line in err.splitlines():  # every line is whole and names its container, or is the parent's
        parent = not line or line.startswith("tailrace: SIGTERM: stopping") or " tailrace.cli: " in line
        assert parent or line.startswith(("[container 0] ", "[container 1] ")), line
    assert out.count("committed offsets:") == 1, out  # the parent prints them once


COUNT_TASK = """
from tailrace import StreamTask


class Count(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts["n"] = self.counts.get("n", 0) + 1

    def end_of_stream(self, collector, coordinator):
        print(f"count {self.counts.get('n', 0)}", flush=True)
"""


def test_reset_deletes_the_state_with_the_offsets(redis_server: RedisServer, tmp_path: Path) -> None:
    # rule 26 and docs/state.md: a reset job reruns from the beginning with empty stores, so
    # its state holds each message once (it held everything twice when reset kept the state)
    job = write_job(tmp_path, redis_server.url)
    (tmp_path / "count.py").write_text(COUNT_TASK)
    job.write_text(
        job.read_text().replace('task = "forward.py:Forward"', 'task = "count.py:Count"')
        + '\n[stores.counts]\n"key.serde" = "str"\n'
    )
    loaded = load(tmp_path, job, 400, "--end")
    assert loaded.returncode == 0, loaded.stderr
    client = redis_server.client()

    def counts(run: subprocess.CompletedProcess[str]) -> list[int]:
        assert run.returncode == 0, run.stderr[-3000:]
        return sorted(int(n) for n in re.findall(r"^count (\d+)$", run.stdout, re.M))

    first = counts(cli("run", str(job), "--no-progress"))
    assert sum(first) == 400 and len(first) == 4
    assert client.keys("*:state:tools:*")
    reset = cli("checkpoints", "reset", str(job), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert client.keys("*:state:tools:*") == [] and client.keys("*:anchors") == []
    assert counts(cli("run", str(job), "--no-progress")) == first
    client.close()


COUNTING = """
from tailrace import StreamTask


class Count(StreamTask):
    def init(self, context):
        self.seen = context.store("seen")

    def process(self, envelope, collector, coordinator):
        user = envelope.message["user"]
        self.seen[user] = self.seen.get(user, 0) + 1
"""


def test_show_and_reset_speak_of_the_state_of_stores(redis_server: RedisServer, tmp_path: Path) -> None:
    # issue 38, item 7: reset deleted every state entry without a word; show said nothing of stores
    job = write_job(tmp_path, redis_server.url)
    (tmp_path / "count.py").write_text(COUNTING)
    job.write_text(job.read_text().replace("forward.py:Forward", "count.py:Count") + "\n[stores.seen]\n")
    assert load(tmp_path, job, 400, "--end").returncode == 0
    done = cli("run", str(job), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    users = {p: {f"u{i % 97}" for i in range(400) if key_partition(f"u{i % 97}", 4) == p} for p in range(4)}
    shown = cli("checkpoints", "show", str(job))
    assert shown.returncode == 0, shown.stderr
    for p in range(4):
        assert re.search(rf"^  Partition {p}\s+seen\s+{len(users[p])}$", shown.stdout, re.M), shown.stdout
    reset = cli("checkpoints", "reset", str(job), "--yes")
    assert reset.returncode == 0, reset.stderr
    said = "deleted 4 checkpoints of job 'tools' (committed offsets and 97 state entries of store 'seen')"
    assert said in reset.stdout, reset.stdout
