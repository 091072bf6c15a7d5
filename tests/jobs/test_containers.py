"""``tailrace run --containers N`` / ``job.container.count`` of a file job with SQLite
checkpoints: N real container processes, task N in container N mod count, sharing one store
and one set of output files; the job's lock still refuses any other run (rules 13, 19, 20, 26)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from .conftest import run_cli, tailrace_cmd

PARTITIONS = 4
TASK = """
import os, time
import tailrace

SLOW = float(os.environ.get("SLOW", "0"))


class Sums(tailrace.StreamTask):
    def init(self, context):
        self.sums = context.store("sums")

    def process(self, envelope, collector, coordinator):
        m = envelope.message
        user = m["user"]
        total = self.sums.get(user, 0) + m["amount"]
        self.sums[user] = total
        collector.send("out", {"user": user, "seq": m["seq"], "total": total}, key=user)
        if SLOW:
            time.sleep(SLOW)
"""

JOB = """
[job]
name = "sums"
task = "task.py:Sums"
inputs = ["files.events"]
default_output = "files"

[config]
"task.commit.ms" = 100
{config}

[systems.files]
type = "file"
path = "data"
output_path = "output"
output_partitions = 4

[stores.sums]
"key.serde" = "str"
"value.serde" = "int"

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"
"""


def make_job(root: Path, messages: int = 4000, users: int = 50, config: str = "") -> Path:
    """4 input partitions; a user's messages all live in partition user % 4."""
    rng = random.Random(11)
    events = root / "data" / "events"
    events.mkdir(parents=True)
    files = [open(events / f"partition-{p}.jsonl", "w") for p in range(PARTITIONS)]
    for i in range(messages):
        u = rng.randrange(users)
        record = {"user": f"u{u}", "amount": rng.randrange(1, 100), "seq": i}
        files[u % PARTITIONS].write(json.dumps(record) + "\n")
    for f in files:
        f.close()
    (root / "task.py").write_text(TASK)
    (root / "job.toml").write_text(JOB.format(config=config))
    return root


def expected(root: Path) -> dict[tuple[str, int], int]:
    """(user, seq) -> the user's running total after that message."""
    out: dict[tuple[str, int], int] = {}
    sums: dict[str, int] = defaultdict(int)
    for p in range(PARTITIONS):
        for line in (root / "data" / "events" / f"partition-{p}.jsonl").read_text().splitlines():
            m = json.loads(line)
            sums[m["user"]] += m["amount"]
            out[m["user"], m["seq"]] = sums[m["user"]]
    return out


def outputs(root: Path) -> tuple[Counter[str], dict[str, list[int]]]:
    """Every output line (a multiset) and each user's seq order."""
    lines: Counter[str] = Counter()
    order: dict[str, list[int]] = defaultdict(list)
    for f in sorted((root / "output" / "out").glob("partition-*.jsonl")):
        for line in f.read_text().splitlines():
            lines[line] += 1
            m = json.loads(line)  # a line cut into by another process would not parse
            order[m["user"]].append(m["seq"])
    return lines, dict(order)


def run(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(["run", str(root), "--no-progress", *args], env=env, timeout=120)


def test_two_containers_write_exactly_what_one_does_and_a_rerun_adds_nothing(
    engine: str, tmp_path: Path
) -> None:
    one = make_job(tmp_path / "one")
    two = make_job(tmp_path / "two")
    r1 = run(one, "--engine", engine, "--containers", "1")
    assert r1.returncode == 0, r1.stderr
    r2 = run(two, "--engine", engine, "--containers", "2")
    assert r2.returncode == 0, r2.stderr
    assert "container 0: tasks Partition 0, Partition 2" in r2.stderr
    assert "container 1: tasks Partition 1, Partition 3" in r2.stderr
    assert "4,000 messages processed" in r2.stdout and "by 2 containers" in r2.stdout
    assert r2.stdout.count("committed offsets:") == 1  # the summary once, by the parent
    for p in range(PARTITIONS):
        assert f"files.events[{p}]" in r2.stdout
    assert outputs(two) == outputs(one)
    want = expected(two)
    for line in outputs(two)[0]:
        m = json.loads(line)
        assert m["total"] == want[m["user"], m["seq"]]
    # rule 13: a rerun resumes every task after its committed offset: nothing new
    again = run(two, "--engine", engine, "--containers", "2")
    assert again.returncode == 0, again.stderr
    assert " 0 messages processed" in again.stdout
    assert outputs(two) == outputs(one)


def test_job_container_count_key_and_three_containers_over_four_tasks(tmp_path: Path) -> None:
    ref = make_job(tmp_path / "ref")
    assert run(ref).returncode == 0
    job = make_job(tmp_path / "job", config='"job.container.count" = 3')
    r = run(job)
    assert r.returncode == 0, r.stderr
    assert "container 0: tasks Partition 0, Partition 3" in r.stderr
    assert "container 1: tasks Partition 1" in r.stderr
    assert "container 2: tasks Partition 2" in r.stderr
    assert "by 3 containers" in r.stdout
    assert outputs(job) == outputs(ref)
    # the flag wins over the key: one container
    more = make_job(tmp_path / "flag", config='"job.container.count" = 3')
    r = run(more, "--containers", "1")
    assert r.returncode == 0, r.stderr
    assert "containers" not in r.stdout and outputs(more) == outputs(ref)


def test_containers_beyond_the_task_count_are_not_started(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    r = run(job, "--containers", "6")
    assert r.returncode == 0, r.stderr
    assert "the job has 4 tasks: containers 4, 5 would have none and are not started" in r.stderr
    assert "by 4 containers" in r.stdout
    assert "[container 4]" not in r.stderr + r.stdout


@pytest.mark.parametrize(
    ("args", "config", "needle"),
    [
        (["--containers", "0"], "", "config key '--containers': 0 is not a container count"),
        (["--containers", "-1"], "", "config key '--containers': -1 is not a container count"),
        ([], '"job.container.count" = 0', "config key 'job.container.count': 0 is out of range"),
        ([], '"job.container.count" = -1', "config key 'job.container.count': -1 is out of range"),
    ],
)
def test_bad_container_counts_name_the_flag_or_key(
    tmp_path: Path, args: list[str], config: str, needle: str
) -> None:
    job = make_job(tmp_path, messages=10, config=config)
    r = run(job, *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert not (tmp_path / "output").exists()


def test_a_job_with_memory_inputs_cannot_be_split(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "job.toml").write_text(
        '[job]\nname = "m"\ntask = "task.py:Sums"\ninputs = ["mem.events"]\n'
        '[config]\n"job.container.count" = 2\n'
        '[systems.mem]\ntype = "memory"\n[stores.sums]\n'
        '[checkpoints]\ntype = "sqlite"\npath = "state/cp.db"\n'
    )
    r = run(tmp_path)
    assert r.returncode == 2, r.stderr
    assert "config key 'job.container.count'" in r.stderr and "'mem.events' is not a file input" in r.stderr
    r = run(tmp_path, "--containers", "3")
    assert r.returncode == 2 and "config key '--containers'" in r.stderr


IMPORT_ONCE = """
import os
with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as f:
    f.write(f"{os.getpid()}\\n")
"""


def test_the_containers_are_forks_of_the_parent_which_imports_the_task_once(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    (job / "task.py").write_text(IMPORT_ONCE + TASK)
    parent = subprocess.Popen(
        tailrace_cmd("run", str(job), "--no-progress", "--containers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = parent.communicate(timeout=120)
    assert parent.returncode == 0, err
    # the module ran once, in the parent, before it forked the containers
    assert (job / "imports.log").read_text().split() == [str(parent.pid)], err
    pids = {int(p) for p in re.findall(r"container \d: tasks .* \(pid (\d+)\)", err)}
    assert len(pids) == 2 and parent.pid not in pids, err
    assert "by 2 containers" in out


def test_a_task_that_cannot_load_is_reported_once_by_the_parent(tmp_path: Path) -> None:
    job = make_job(tmp_path)
    (job / "task.py").write_text(TASK.replace("class Sums", "class Other"))
    r = run(job, "--containers", "2")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("defines no 'Sums'") == 1, r.stderr
    assert "[container" not in r.stderr
    assert not (job / "output").exists()


def _children(pid: int, job: Path) -> dict[int, int]:
    """container index -> pid of the container processes of parent ``pid``: the pid each
    container's lock file records, when it is a child of ``pid`` (from /proc)."""
    found: dict[int, int] = {}
    for lock in (job / "state").glob("*.container-*.lock"):
        index = int(lock.name.rsplit("-", 1)[1].removesuffix(".lock"))
        text = lock.read_text().strip()
        if not text.isdigit():
            continue
        try:
            stat = Path(f"/proc/{text}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found[index] = int(text)
    return found


def _start_slow(job: Path, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        tailrace_cmd("run", str(job), "--no-progress", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLOW": "0.002"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # running: both containers started and committed output
        kids = _children(proc.pid, job)
        out = job / "output" / "out"
        written = sum(f.stat().st_size for f in out.glob("*.jsonl")) if out.is_dir() else 0
        if len(kids) == 2 and written > 2000 and (job / "state").is_dir():
            return proc
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the job did not start")


def test_kill_9_of_one_container_stops_the_others_and_a_rerun_loses_nothing(tmp_path: Path) -> None:
    job = make_job(tmp_path, messages=6000)
    proc = _start_slow(job, "--containers", "2")
    time.sleep(0.5)
    os.kill(_children(proc.pid, job)[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    failed = "container 1 of job 'sums' (tasks Partition 1, Partition 3) failed (killed by SIGKILL)"
    assert f"tailrace: error: {failed}" in err
    assert "container 0: exit status 0" in err  # stopped gracefully
    assert "finished" not in out
    # rule 20: the rerun processes what came after the last commits; state is exactly once (rule 26)
    r = run(job, "--containers", "2")
    assert r.returncode == 0, r.stderr
    want = expected(job)
    lines, order = outputs(job)
    seen = set()
    for line in lines:
        m = json.loads(line)
        assert m["total"] == want[m["user"], m["seq"]], line  # duplicates carry the same total
        seen.add((m["user"], m["seq"]))
    assert seen == set(want)  # nothing lost
    for user, seqs in order.items():  # per key: in order, a replay restarts an earlier suffix
        firsts = list(dict.fromkeys(seqs))
        assert firsts == sorted(firsts), user


def test_a_second_run_is_refused_while_containers_run_and_sigterm_stops_all_gracefully(
    tmp_path: Path,
) -> None:
    job = make_job(tmp_path, messages=6000)
    ref = make_job(tmp_path / "ref", messages=6000)
    assert run(ref).returncode == 0
    proc = _start_slow(job, "--containers", "2")
    try:
        for args in (["--containers", "1"], ["--containers", "2"], ["--containers", "3"]):
            r = run(job, *args)
            assert r.returncode == 1, r.stderr
            assert "is in use by another container for job 'sums'" in r.stderr
            assert f"pid {proc.pid}" in r.stderr
            # its containers, forked before it found the job's lock taken, ended without a word
            assert "[container" not in r.stderr and "[container" not in r.stdout
        reset = run_cli(["checkpoints", "reset", str(job), "--yes"])
        assert reset.returncode == 1 and "in use" in reset.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopping gracefully" in err and "by 2 containers" in out
    # graceful: every task committed what it processed, so the rerun repeats nothing
    r = run(job, "--containers", "2")
    assert r.returncode == 0, r.stderr
    assert outputs(job) == outputs(ref)


def test_an_error_in_one_container_stops_the_others_gracefully_and_names_it(tmp_path: Path) -> None:
    job = make_job(tmp_path, messages=6000)
    task = job / "task.py"
    task.write_text(
        task.read_text().replace(
            '        user = m["user"]\n',
            '        user = m["user"]\n'
            '        if envelope.partition == 3 and m["seq"] > 3000:\n'
            "            raise ValueError(f\"bad seq {m['seq']}\")\n",
        )
    )
    r = run(job, "--containers", "2", env={"SLOW": "0.0005"})
    assert r.returncode == 1, r.stderr
    assert "[container 1] tailrace: error: task 'Partition 3'" in r.stderr  # the container's own report
    assert "ValueError: bad seq" in r.stderr
    failed = "container 1 of job 'sums' (tasks Partition 1, Partition 3) failed (exit status 1)"
    assert f"tailrace: error: {failed}" in r.stderr
    assert "container 0: exit status 0" in r.stderr
    # container 0 committed what it did: its tasks resume after their checkpoints
    show = run_cli(["checkpoints", "show", str(job)])
    assert "Partition 0" in show.stdout and "Partition 2" in show.stdout


def test_kill_9_of_the_parent_stops_its_containers_gracefully(tmp_path: Path) -> None:
    job = make_job(tmp_path, messages=6000)
    ref = make_job(tmp_path / "ref", messages=6000)
    assert run(ref).returncode == 0
    proc = _start_slow(job, "--containers", "2")
    kids = _children(proc.pid, job)
    # the kernel sends each container a SIGHUP (PR_SET_PDEATHSIG) each time a thread of the parent
    # ends (the parent has 5): the first stops it gracefully, the others change nothing
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in kids.values()):
        assert time.monotonic() < deadline, "the containers did not stop"
        time.sleep(0.05)
    r = run(job, "--containers", "2")
    assert r.returncode == 0, r.stderr
    assert " 0 messages processed" not in r.stdout  # they stopped early, not at the end of input
    assert outputs(job) == outputs(ref)  # they committed what they wrote: nothing repeated


PARENT_DEATH = """
import os, signal, sys
from tailrace import cli

stops = []
cli._SIGNALS.install()
cli._SIGNALS.attach(lambda: stops.append(1))
cli._die_with_parent(os.getppid())
for _ in range(5):  # a killed parent's threads end one by one: one death, several signals
    os.kill(os.getpid(), signal.SIGHUP)
print(len(stops), cli._SIGNALS.received, flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # a real second stop request still forces
print("not reached", flush=True)
"""


def test_the_parent_death_signal_stops_gracefully_however_often_it_comes() -> None:
    r = subprocess.run([sys.executable, "-c", PARENT_DEATH], capture_output=True, text=True, timeout=60)
    assert r.stdout == "1 1\n", r.stderr  # one graceful stop, not a forced one
    assert r.stderr.count("the parent process died: stopping gracefully") == 1, r.stderr
    assert "SIGTERM again: forced stop" in r.stderr
    assert r.returncode == 128 + signal.SIGTERM


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_progress_lines_come_per_container_and_whole(tmp_path: Path) -> None:
    job = make_job(tmp_path, messages=2000)
    r = run_cli(
        ["run", str(job), "--containers", "2", "--progress-interval", "0.1"],
        env={"SLOW": "0.001"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    for i in (0, 1):
        assert f"[container {i}] " in r.stderr and "progress: " in r.stderr
    for line in r.stderr.splitlines():  # each line is one container's, or the parent's
        assert line.count("progress: ") <= 1 and line.count("tailrace.cli") <= 1, line
    quiet = make_job(tmp_path / "quiet", messages=2000)
    r = run(quiet, "--containers", "2", "--progress-interval", "0.1", env={"SLOW": "0.001"})
    assert r.returncode == 0 and "progress: " not in r.stderr


def test_a_container_refuses_an_unknown_default_output_system() -> None:
    # a mistake is refused before anything runs, naming the keyword and what is allowed
    import tailrace
    from tailrace.errors import ConfigError

    class Copy(tailrace.StreamTask):
        def process(self, envelope: object, collector: object, coordinator: object) -> None:
            pass

    mem = tailrace.MemorySystem("mem")
    with pytest.raises(ConfigError, match=r"default_output_system.*'nosuch'.*allowed: mem"):
        tailrace.Container(Copy, inputs=["mem.in"], systems=[mem], default_output_system="nosuch")
