"""Seeded kill -9 trials of a file job under ``task.error.policy = dead-letter`` (issue 36,
rules 20, 26, 39, 40): bad lines (not JSON, not UTF-8) and records on which ``process`` raises
(after a store write, which the policy undoes) mixed into the input; SQLite checkpoints and a
store; real ``tailrace run`` processes killed with SIGKILL at seeded moments and restarted
until one finishes.

After every kill the committed state must be the fold of the good messages of the committed
input prefix exactly; after the last run:

- every good message is in the output and every bad one in the dead letters (none missing),
  with the original bytes of its line;
- the state is the fold of every good message exactly (a failed message's write undone);
- a message appears more than once (output or dead letter) only as at-least-once allows: each
  kill adds one more copy of exactly the messages that were written out past the last commit.

Used by test_bad_message_kills.py (a dozen seeded trials; ``TAILRACE_BAD_MESSAGE_TRIALS=N`` for
N per engine: the stress mode).
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailrace.sqlite import SqliteCheckpointStore

from .faults import wait_exit as _wait

TASK = Path(__file__).with_name("bad_checker.py")
JOB = "bad-trials"


@dataclass
class BadJob:
    """The job in ``root``: 'partitions' input files of 'records' lines each, about 'bad_rate'
    of them bad, half of those unreadable and half raising in process."""

    root: Path
    seed: int
    partitions: int = 2
    records: int = 300
    bad_rate: float = 0.06
    commit_ms: int = 15
    lines: list[list[bytes]] = field(default_factory=list)  # per partition, each line's bytes
    kinds: list[list[str]] = field(default_factory=list)  # "good", "unreadable", "raises"
    offsets: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        d = self.root / "data" / "in"
        d.mkdir(parents=True)
        for p in range(self.partitions):
            lines, kinds, offsets, pos = [], [], [], 0
            for i in range(self.records):
                m: dict[str, Any] = {"k": f"k{rng.randrange(12)}", "p": p, "seq": i}
                r = rng.random()
                if r < self.bad_rate / 4:
                    kind, line = "unreadable", b"\xff\xfe not UTF-8 " + str(i).encode()
                elif r < self.bad_rate / 2:
                    kind, line = "unreadable", f'{{"k": "k1", "p": {p}, "seq": {i}, oops'.encode()
                elif r < self.bad_rate:
                    kind, line = "raises", json.dumps({**m, "boom": True}).encode()
                else:
                    kind, line = "good", json.dumps(m).encode()
                lines.append(line)
                kinds.append(kind)
                offsets.append(pos)
                pos += len(line) + 1
            (d / f"partition-{p}.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
            self.lines.append(lines)
            self.kinds.append(kinds)
            self.offsets.append(offsets)
        (self.root / "job.toml").write_text(
            f"""
[job]
name = "{JOB}"
task = "{TASK.as_posix()}:BadChecker"
inputs = ["files.in"]

[config]
"task.commit.ms" = {self.commit_ms}
"task.error.policy" = "dead-letter"
"task.error.stream" = "files.dead"

[systems.files]
type = "file"
path = "data"
output_partitions = {self.partitions}

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"

[stores.counts]
"""
        )

    @property
    def store(self) -> Path:
        return self.root / "state" / "checkpoints.db"

    def start(self, engine: str, delay_ms: float) -> subprocess.Popen[bytes]:
        env = dict(os.environ, CHECKER_DELAY_MS=str(delay_ms))
        return subprocess.Popen(
            [sys.executable, "-m", "tailrace", "run", str(self.root), "--engine", engine, "--no-progress"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def _lines(self, stream: str) -> list[bytes]:
        """The complete lines of an output stream (a partial last one is a killed write)."""
        out: list[bytes] = []
        for p in range(self.partitions):
            try:
                raw = (self.root / "data" / stream / f"partition-{p}.jsonl").read_bytes()
            except FileNotFoundError:
                continue
            out.extend(raw.split(b"\n")[:-1])
        return out

    def written(self) -> Counter[tuple[int, int]]:
        """Copies of each input message (partition, seq) written out so far: its output or
        its dead letter (checked against the input: the right record, its original bytes)."""
        seen: Counter[tuple[int, int]] = Counter()
        for line in self._lines("out"):
            m = json.loads(line)
            p, i = m["p"], m["seq"]
            assert self.kinds[p][i] == "good" and json.dumps(m).encode() == self.lines[p][i], m
            seen[(p, i)] += 1
        for line in self._lines("dead"):
            d = json.loads(line)
            p = d["partition"]
            assert (d["system"], d["stream"]) == ("files", "in"), d
            i = self.offsets[p].index(d["offset"])
            raw = d["bytes"].encode() if "bytes" in d else base64.b64decode(d["bytes_base64"])
            assert raw == self.lines[p][i] and self.kinds[p][i] != "good", d
            want = "tailrace.errors.InputError" if self.kinds[p][i] == "unreadable" else "ValueError"
            assert d["error"]["type"] == want, d
            seen[(p, i)] += 1
        return seen

    def committed(self) -> tuple[dict[int, int], dict[str, int]]:
        """The committed seq per partition (-1: none) and the committed counts (all tasks)."""
        seqs = {p: -1 for p in range(self.partitions)}
        counts: Counter[str] = Counter()
        if not self.store.exists():
            return seqs, dict(counts)
        store = SqliteCheckpointStore(self.store)
        store.open(JOB)
        try:
            for p in range(self.partitions):
                task = f"Partition {p}"
                for ssp, off in store.load(task).items():
                    assert isinstance(off, int)
                    seqs[ssp.partition] = self.offsets[ssp.partition].index(off)
                for k, v in store.state_scan(task, "counts"):
                    counts[json.loads(k)] += json.loads(v)
        finally:
            store.close()
        return seqs, dict(counts)

    def fold(self, upto: dict[int, int]) -> dict[str, int]:
        """Counts of the good messages with seq <= upto[p]."""
        counts: Counter[str] = Counter()
        for p in range(self.partitions):
            for i in range(upto[p] + 1):
                if self.kinds[p][i] == "good":
                    counts[json.loads(self.lines[p][i])["k"]] += 1
        return dict(counts)


@dataclass
class TrialResult:
    kills: int
    mid_run_kills: int  # kills that landed after something was written out, before the end
    duplicates: int  # copies beyond the first, outputs and dead letters
    errors: list[str]


def bad_trial(
    root: Path, engine: str, rng: random.Random, *, max_kills: int = 3, delay_ms: float = 0.3, **job: Any
) -> TrialResult:
    """Kill -9 the job 1..max_kills times at seeded moments, checking the committed state after
    each kill; run it to its end; check outputs, dead letters and state."""
    b = BadJob(root, rng.randrange(1 << 30), **job)
    total = b.partitions * b.records
    errors: list[str] = []
    extra: Counter[tuple[int, int]] = Counter()  # copies each kill makes a restart write again
    kills = mid = 0
    for _ in range(rng.randint(1, max_kills)):
        proc = b.start(engine, delay_ms)
        try:
            if rng.random() < 0.2:
                time.sleep(rng.uniform(0.0, 0.4))  # maybe before anything is read or committed
            else:
                target = min(total - 1, sum(b.written().values()) + rng.randrange(1, total))
                deadline = time.monotonic() + 30
                while (
                    sum(b.written().values()) < target and proc.poll() is None and time.monotonic() < deadline
                ):
                    time.sleep(0.003)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            rc, err = _wait(proc)
        if rc not in (0, -signal.SIGKILL):
            return TrialResult(kills, mid, 0, [f"run {kills + 1} exited with {rc}: {err[-2000:]}"])
        kills += 1
        seqs, state = b.committed()
        written = b.written()
        mid += rc == -signal.SIGKILL and 0 < sum(written.values())
        want = b.fold(seqs)
        if state != want:
            errors.append(f"after kill {kills}: committed at {seqs}, state {_diff(state, want)} (rule 26)")
        for (p, i), n in written.items():
            if n and i > seqs[p]:  # written out past the commit: the restart writes it once more
                extra[(p, i)] += 1
        for p in range(b.partitions):
            missing = [i for i in range(seqs[p] + 1) if written[(p, i)] == 0]
            if missing:
                errors.append(
                    f"after kill {kills}: partition {p} committed seq {seqs[p]}, {missing[:5]} not out"
                )
    rc, err = _wait(b.start(engine, delay_ms))
    if rc != 0:
        return TrialResult(kills, mid, 0, [*errors, f"the last run exited with {rc}: {err[-2000:]}"])
    seqs, state = b.committed()
    if seqs != {p: b.records - 1 for p in range(b.partitions)}:
        errors.append(f"the last run committed {seqs}, not every message")
    want = b.fold(seqs)
    if state != want:
        errors.append(f"final state {_diff(state, want)}")
    written = b.written()
    missing = [(p, i) for p in range(b.partitions) for i in range(b.records) if written[(p, i)] == 0]
    if missing:
        errors.append(f"{len(missing)} messages neither out nor dead-lettered: {missing[:5]}")
    too_many = {m: n for m, n in written.items() if n > 1 + extra[m]}
    if too_many:
        errors.append(f"copies beyond at-least-once (message: copies): {dict(list(too_many.items())[:5])}")
    return TrialResult(kills, mid, sum(written.values()) - len(written), errors)


def _diff(got: dict[str, int], want: dict[str, int]) -> str:
    wrong = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
    return json.dumps(dict(sorted(wrong.items())[:5])) + f" ({len(wrong)} keys differ: got, want)"
