"""Seeded kill -9 trials of a file job with exactly-once outputs (rule 41), through
``tailrace run`` (one container, or ``--containers 2`` sharing the output files and the
SQLite store), and of a chained pair of jobs (the second reads the first's output).

A trial starts the job, kills it with SIGKILL at a seeded moment (the whole process group,
one container, or the parent of two), checks what a reader sees of the outputs (each
record at most once, each key's records a prefix of its records in order), repeats, and
finally runs the job to its end: the output files must then hold exactly the records of a
run without a crash, as a multiset and in per-key order, with no duplicate.

Used by test_file_kill_trials.py; ``TAILRACE_STRESS_TRIALS=N`` runs N trials per case.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tailrace.files.streams import committed_length

PARTITIONS = 4
STALL_AFTER = "TAILRACE_TEST_SQLITE_STALL_AFTER"  # tailrace.sqlite's fault-test hook
STALL_MARKER = "TAILRACE_TEST_SQLITE_STALL_MARKER"
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


class Doubles(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        m = envelope.message
        doubled = {"user": m["user"], "seq": m["seq"], "twice": 2 * m["total"]}
        collector.send("doubled", doubled, key=m["user"])
        if SLOW:
            time.sleep(SLOW)
"""

JOB = """
[job]
name = "{name}"
task = "task.py:{task}"
inputs = ["{inputs}"]
default_output = "files"

[config]
"task.commit.ms" = 100
"task.output.guarantee" = "exactly-once"

[systems.files]
type = "file"
path = "{path}"
output_path = "{output}"
output_partitions = 4

{stores}
[checkpoints]
type = "sqlite"
path = "state/{name}.db"
"""

STORES = """[stores.sums]
"key.serde" = "str"
"value.serde" = "int"
"""


def stress_trials(default: int) -> int:
    """Trials per case: ``TAILRACE_STRESS_TRIALS`` when set (stress mode), else ``default``."""
    return int(os.environ.get("TAILRACE_STRESS_TRIALS", default))


def make_job(root: Path, rng: random.Random, messages: int = 2000, users: int = 40) -> Path:
    """The summing job (4 input partitions; a user's messages all in partition user % 4)
    and the doubling job that reads its output (``chained.toml``)."""
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
    (root / "job.toml").write_text(
        JOB.format(
            name="sums", task="Sums", inputs="files.events", path="data", output="output", stores=STORES
        )
    )
    (root / "chained.toml").write_text(
        JOB.format(
            name="doubles", task="Doubles", inputs="files.out", path="output", output="chained", stores=""
        )
    )
    return root


def expected(root: Path) -> dict[str, list[tuple[int, int]]]:
    """A run without a crash: per user, its (seq, total) records in order."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    sums: Counter[str] = Counter()
    rows = []
    for p in range(PARTITIONS):
        for line in (root / "data" / "events" / f"partition-{p}.jsonl").read_text().splitlines():
            rows.append(json.loads(line))
    for m in sorted(rows, key=lambda m: m["seq"]):
        sums[m["user"]] += m["amount"]
        out[m["user"]].append((m["seq"], sums[m["user"]]))
    return dict(out)


def raw_records(directory: Path) -> list[dict[str, Any]]:
    """Every line of every output file, committed or not (what `cat` shows)."""
    found: list[dict[str, Any]] = []
    for f in sorted(directory.glob("partition-*.jsonl")):
        found += [json.loads(line) for line in f.read_text().splitlines()]
    return found


def committed_records(directory: Path) -> list[dict[str, Any]]:
    """What a reader honouring the published committed lengths sees (as read_stream reads a
    partition; a killed run may have opened only some of the partition files)."""
    found: list[dict[str, Any]] = []
    for f in sorted(directory.glob("partition-*.jsonl")):
        limit = committed_length(f)
        data = f.read_bytes() if limit is None else f.read_bytes()[:limit]
        found += [json.loads(line) for line in data.splitlines()]
    return found


def check(
    records: list[dict[str, Any]], want: dict[str, list[tuple[int, int]]], value: str, complete: bool
) -> list[str]:
    """Each record at most once (exactly once when ``complete``); per user, the records in
    input order and a prefix of the user's records (nothing skipped)."""
    errors: list[str] = []
    lines = Counter(json.dumps(r, sort_keys=True) for r in records)
    dups = [line for line, n in lines.items() if n > 1]
    if dups:
        errors.append(f"{len(dups)} duplicated records, e.g. {dups[0]}")
    got: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        got[r["user"]].append((r["seq"], r[value] // (2 if value == "twice" else 1)))
    for user, rows in got.items():
        if rows != want.get(user, [])[: len(rows)]:
            errors.append(f"user {user}: {rows[:4]}... is not a prefix of {want.get(user, [])[:4]}...")
    if complete and dict(got) != want:
        missing = sum(len(v) for v in want.values()) - len(records)
        errors.append(f"not every record: {missing} missing")
    return errors


def _children(pid: int) -> list[int]:
    """The container processes of the run ``pid`` (its children, from /proc)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(
    root: Path, job: str, engine: str, containers: int, slow: float, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tailrace", "run", str(root / job), "--no-progress", "--engine", engine]
        + (["--containers", str(containers)] if containers > 1 else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLOW": str(slow), **(env or {})},
    )


def kill(proc: subprocess.Popen[str], rng: random.Random, kids: list[int]) -> str:
    """SIGKILL the run and its containers, one container, or (of two) the parent; returns which."""
    mode = rng.choice(["all", "container", "parent"] if len(kids) > 1 else ["all"])
    if mode == "container":
        _kill([rng.choice(kids)])
    elif mode == "parent":
        _kill([proc.pid])  # its containers see it die and stop gracefully
    else:
        _kill([proc.pid, *kids])
    return mode


def wait_gone(proc: subprocess.Popen[str], kids: list[int], timeout: float = 30) -> str:
    """Wait for the run and its containers (each in a process group of its own); its stderr.
    A container still in the store's stall (the other of two stopped gracefully into it)
    is killed too."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill([proc.pid, *kids])
        _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + timeout
    while any(map(_alive, kids)):
        if time.monotonic() > deadline:
            _kill(kids)
        time.sleep(0.01)
    return err


def run_trial(
    root: Path, engine: str, containers: int, rng: random.Random, *, chained: bool = False, max_kills: int = 2
) -> tuple[int, list[str]]:
    """Kills then a run to the end, of the summing job (and with ``chained``, of the doubling
    job after each, killed too); returns (kills that landed mid-run, errors)."""
    make_job(root, rng)
    want = expected(root)
    errors: list[str] = []
    mid = 0
    jobs = ["job.toml", "chained.toml"] if chained else ["job.toml"]
    for _ in range(rng.randint(1, max_kills)):
        for job in jobs:
            if job == "chained.toml" and not (root / "output" / "out").is_dir():
                continue
            n = containers if job == "job.toml" else 1
            stalled = None if rng.random() < 0.5 else rng.randrange(1, 12)
            if stalled is not None:
                # the kill lands inside a commit: its outputs appended and fsynced, its SQLite
                # transaction open (the store's test hook stalls there)
                marker = root / f"stalled-{time.monotonic_ns()}"
                stall = {STALL_AFTER: str(stalled), STALL_MARKER: str(marker)}
                proc = start(root, job, engine, n, 0.001, stall)
                deadline = time.monotonic() + 10
                while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.005)
                time.sleep(0.01)  # (the marker is written just before the stall's sleep)
                kids = _children(proc.pid) if n > 1 else []
                ended = proc.poll() is not None
                if ended:
                    mode = "none"
                elif marker.exists() and rng.random() < 0.5:
                    mode = "the container in a commit"
                    _kill([int(marker.read_text())])
                else:
                    mode = "all, one in a commit"
                    _kill([proc.pid, *kids])
            else:
                proc = start(root, job, engine, n, 0.001)
                time.sleep(rng.uniform(0.25, 1.0))
                kids = _children(proc.pid) if n > 1 else []
                ended = proc.poll() is not None
                mode = "none" if ended else kill(proc, rng, kids)
            err = wait_gone(proc, kids, 30 if stalled is None else 3)
            mid += not ended
            if ended and proc.returncode != 0:
                errors.append(f"{job} failed: {err[-2000:]}")
                return mid, errors
            for what, directory, value in (
                ("out", root / "output" / "out", "total"),
                ("doubled", root / "chained" / "doubled", "twice"),
            ):
                errors += [
                    f"after a kill ({mode}) of {job}, {what} as a reader sees it: {e}"
                    for e in check(committed_records(directory), want, value, complete=False)
                ]
    for job in jobs:
        proc = start(root, job, engine, containers if job == "job.toml" else 1, 0)
        err = wait_gone(proc, [])
        if proc.returncode != 0:
            errors.append(f"the last run of {job} failed: {err[-2000:]}")
            return mid, errors
    errors += [f"final out: {e}" for e in check(raw_records(root / "output" / "out"), want, "total", True)]
    if chained:
        doubled = raw_records(root / "chained" / "doubled")
        errors += [f"final doubled: {e}" for e in check(doubled, want, "twice", True)]
    return mid, errors
