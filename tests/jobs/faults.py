"""Fault-test harness: a checker job run by real ``tailrace run`` processes, killed and
restarted, and a verifier counting loss, duplicates and per-partition order.

Used by test_faults.py (a few fast seeded trials) and fault_stress.py (hundreds).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tailrace.files import write_stream
from tailrace.sqlite import SqliteCheckpointStore

CHECKER = Path(__file__).with_name("checker.py")
JOB = "checker"


@dataclass
class CheckerJob:
    """A checker job in ``root``: input files, job.toml, output and store paths."""

    root: Path
    partitions: int = 2
    records: int = 600
    commit_ms: int = 20
    offsets: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        data = [
            [{"k": f"k{p}-{i}", "p": p, "seq": i} for i in range(self.records)]
            for p in range(self.partitions)
        ]
        self.offsets = write_stream(self.root / "data" / "in", data)
        (self.root / "job.toml").write_text(
            f"""
[job]
name = "{JOB}"
task = "{CHECKER.as_posix()}:Checker"
inputs = ["files.in"]

[config]
"task.commit.ms" = {self.commit_ms}

[systems.files]
type = "file"
path = "data"
output_partitions = {self.partitions}

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"
"""
        )

    @property
    def store(self) -> Path:
        return self.root / "state" / "checkpoints.db"

    def out_file(self, p: int) -> Path:
        return self.root / "data" / "out" / f"partition-{p}.jsonl"

    def start(self, engine: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.Popen(
            [sys.executable, "-m", "tailrace", "run", str(self.root), "--engine", engine, "--no-progress"],
            env=e,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def output_lines(self) -> int:
        """Complete output lines written so far (all partitions)."""
        n = 0
        for p in range(self.partitions):
            try:
                n += self.out_file(p).read_bytes().count(b"\n")
            except FileNotFoundError:
                pass
        return n

    def committed_seqs(self) -> dict[int, int]:
        """Per partition, the seq of the committed record (-1: nothing committed)."""
        per_task = SqliteCheckpointStore(self.store).committed(JOB)
        out = {p: -1 for p in range(self.partitions)}
        for offsets in per_task.values():
            for ssp, off in offsets.items():
                assert isinstance(off, int)
                out[ssp.partition] = self.offsets[ssp.partition].index(off)
        return out

    def outputs(self) -> dict[int, list[int]]:
        """Per partition, the seqs in the output file (complete lines only), checking keys and partition."""
        out: dict[int, list[int]] = {}
        for p in range(self.partitions):
            seqs: list[int] = []
            try:
                raw = self.out_file(p).read_bytes()
            except FileNotFoundError:
                raw = b""
            for line in raw.split(b"\n")[:-1]:
                rec = json.loads(line)
                assert rec["p"] == p and rec["k"] == f"k{p}-{rec['seq']}", f"misplaced record {rec}"
                seqs.append(rec["seq"])
            out[p] = seqs
        return out


@dataclass
class Verdict:
    lost: int
    duplicates: int
    order_errors: list[str]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and not self.order_errors


def verify(job: CheckerJob) -> Verdict:
    """Loss, duplicates, and order: each partition's output must be runs of consecutive seqs,
    each run starting at or before the previous run's end + 1 (a replay after a restart)."""
    lost = dups = 0
    errors: list[str] = []
    for p, seqs in job.outputs().items():
        lost += len(set(range(job.records)) - set(seqs))
        dups += len(seqs) - len(set(seqs))
        prev = -1
        for i, s in enumerate(seqs):
            if s == prev + 1:
                prev = s
            elif s <= prev:  # a replay restarts at or before where the last run got to
                prev = s
            else:
                errors.append(
                    f"partition {p}: seq {s} at output line {i + 1} follows {prev} (gap or reorder)"
                )
                break
    return Verdict(lost, dups, errors)


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"tailrace run did not finish in {timeout}s: {err.decode()[-2000:]}") from None
    return proc.returncode, err.decode()


@dataclass
class TrialResult:
    killed_after_lines: int
    beyond_commit: int  # outputs of the killed run past its last checkpoint
    verdict: Verdict
    replay_errors: list[str]  # partitions whose output is not (killed run) + (committed+1 .. end)


def kill_trial(job: CheckerJob, engine: str, rng: random.Random, delay_ms: float = 0.3) -> TrialResult:
    """Start the job, kill -9 it at a random point, restart it to the end, verify."""
    env = {"CHECKER_DELAY_MS": str(delay_ms)}
    total = job.partitions * job.records
    proc = job.start(engine, env)
    try:
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0.0, 0.4))  # maybe before anything is read or committed
        else:
            target = rng.randrange(1, total)
            deadline = time.monotonic() + 30
            while job.output_lines() < target and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        wait_exit(proc)
    killed_after = job.output_lines()
    committed = job.committed_seqs() if job.store.exists() else {p: -1 for p in range(job.partitions)}
    before = job.outputs()
    for p, seqs in before.items():
        assert all(s in seqs for s in range(committed[p] + 1)), f"partition {p}: committed output missing"
    beyond = sum(sum(1 for s in seqs if s > committed[p]) for p, seqs in before.items())
    rc, err = wait_exit(job.start(engine, env))
    assert rc == 0, f"restart failed ({rc}): {err[-3000:]}"
    after = job.outputs()
    replay_errors = [
        f"partition {p}: restart did not resume right after committed seq {committed[p]}"
        for p in after
        if after[p] != before[p] + list(range(committed[p] + 1, job.records))
    ]
    return TrialResult(killed_after, beyond, verify(job), replay_errors)
