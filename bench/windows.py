"""Event-time windows (issue 35): tailrace's window API against the same job written by hand and
against Bytewax's ``fold_window``.

The job: a 1-minute tumbling count and sum of ``amount`` per user, over JSON Lines events
(``{"user": "u123", "ts": <ms>, "amount": <int>}``, 10,000 users, 4 input partitions, a user in
one partition). Event time advances with the line number (``--rate`` events a second across
the partitions) and each event's timestamp is behind that by a random 0 to ``--disorder`` ms
(default: the lag, 5 s), so timestamps are out of order by up to that much within a partition.
Every contender writes one record per (user, window), ``{"key", "start", "end", "value":
[count, sum], "final": true}``, and each run is checked: the same windows with the same counts
and sums as the first contender's run, each once.

The contenders, each in its own process, run ALTERNATELY (A B A B ...) so that a noisy machine
hurts every side alike:

``floor``    a bare loop (orjson, a dict keyed by (start, user), everything written at the end):
             the speed of light for this job in Python, no watermark, no runtime
``hand``     ``tailrace run``, the C engine, files, SQLite checkpoints: ``process`` adds to a dict
             keyed by (start, user); ``window()`` (every ``task.window.ms``) sends and drops the
             windows that ``context.watermark()`` has passed (``task.timestamp.field = ts``,
             ``task.watermark.lag.ms = 5000``); ``end_of_stream`` sends the rest
``windows``  the same job with tailrace's window API (``tailrace.windows``): a ``Tumbling``
             declaration and no ``process``; skipped while the API is missing
``bytewax``  Bytewax's ``fold_window`` (``TumblingWindower`` of 1 minute, ``EventClock`` on
             ``ts`` waiting 5 s, ``ordered=False``: a count and a sum need no order) over a
             ``FileSource`` per partition, parsed with orjson, written with ``FileSink``;
             skipped where bytewax is not installed

No event may be late (each contender would set it aside its own way): the generator checks
that every event's window ends after the largest timestamp before it in its partition minus the
5 s lag, the watermark of every contender when the event reaches it (tailrace counts a message
of a task with timestamps read when it is handed to the task, docs/event-time.md; bytewax's
watermark is per user, and its clock here never runs on system time: ``now_getter`` is fixed,
since replayed files have no "now", and with the default clock events do turn up late).

Printed per contender: the median wall time and CPU (user + system of the process and the
children it reaped, from wait4), events/s and CPU ns per event; then the ratios the issue sets
targets for (``windows`` CPU / ``hand`` CPU <= 1.2; ``windows`` throughput >= 3x ``bytewax``'s)
and the lines of each contender's job code: its non-blank, non-comment lines (a docstring is a
comment), counting the task module and the job file of a tailrace job, and a bytewax flow from
its imports to its last ``op.output`` (the lines that read ``sys.argv`` and call ``run_main``
are the harness's in both: ``tailrace run`` does that part for a tailrace job).

    python bench/windows.py                                  # 2M events, 3 rounds
    python bench/windows.py --events 200000 --rounds 1 --contenders hand,windows
    python bench/windows.py --json bench/results/windows.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e  # bench/e2e.py: _spawn (wall, CPU and peak RSS of a child, from wait4)

PARTITIONS = 4
MINUTE = 60_000
LAG_MS = 5_000
T0 = 1_714_521_600_000  # 2024-05-01T00:00:00Z, a minute boundary
CONTENDERS = ("floor", "hand", "windows", "bytewax")

HAND_TASK = """
import math

import tailrace

MINUTE = 60_000


class PerMinute(tailrace.StreamTask):
    def init(self, context):
        self.context = context
        self.open = {}  # (window start, user) -> [count, sum]

    def process(self, envelope, collector, coordinator):
        m = envelope.message
        key = (envelope.timestamp - envelope.timestamp % MINUTE, m["user"])
        acc = self.open.get(key)
        if acc is None:
            self.open[key] = [1, m["amount"]]
        else:
            acc[0] += 1
            acc[1] += m["amount"]

    def window(self, collector, coordinator):
        self.flush(collector, self.context.watermark())

    def end_of_stream(self, collector, coordinator):
        self.flush(collector, math.inf)

    def flush(self, collector, watermark):
        for key in [k for k in self.open if k[0] + MINUTE <= watermark]:
            start, user = key
            value = self.open.pop(key)
            record = {"key": user, "start": start, "end": start + MINUTE, "value": value, "final": True}
            collector.send("out", record, key=user)
"""

WINDOWS_TASK = """
import tailrace
from tailrace.windows import Agg, Count, Sum, Tumbling


class PerMinute(tailrace.StreamTask):
    per_minute = Tumbling(
        60_000, key="user", aggregate=Agg(count=Count(), sum=Sum("amount")), output="files.out"
    )
"""

JOB = """
[job]
name = "windows"
task = "task.py:PerMinute"
inputs = ["files.events"]
engine = "{engine}"
default_output = "files"

[config]
"task.commit.ms" = 1000
"task.timestamp.field" = "ts"
"task.watermark.lag.ms" = 5000
{extra}
[systems.files]
type = "file"
path = "data"
output_path = "output"
output_partitions = 4

[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"
"""
HAND_CONFIG = '"task.window.ms" = 1000\n'

# The flow a bytewax user writes; BYTEWAX_HARNESS (not counted) adds the late-event check and runs it.
BYTEWAX_FLOW = """
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import bytewax.operators as op
import orjson
from bytewax.connectors.files import FileSink, FileSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window

data, out = Path(sys.argv[1]), Path(sys.argv[2])
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MINUTE = 60_000


def record(item):
    user, (window_id, value) = item
    start = window_id * MINUTE
    record = {"key": user, "start": start, "end": start + MINUTE, "value": value, "final": True}
    return user, orjson.dumps(record).decode()


flow = Dataflow("windows")
inputs = [op.input(f"in{p}", flow, FileSource(data / f"partition-{p}.jsonl")) for p in range(4)]
events = op.map("parse", op.merge("merge", *inputs), orjson.loads)
by_user = op.key_on("user", events, lambda e: e["user"])
clock = EventClock(
    lambda e: EPOCH + timedelta(milliseconds=e["ts"]),
    wait_for_system_duration=timedelta(seconds=5),
    now_getter=lambda: EPOCH,  # replayed files: system time must not move the watermark
    to_system_utc=lambda t: None,  # close windows on events and at the end only
)
windows = fold_window(
    "per_minute",
    by_user,
    clock,
    TumblingWindower(length=timedelta(minutes=1), align_to=EPOCH),
    lambda: [0, 0],
    lambda acc, e: [acc[0] + 1, acc[1] + e["amount"]],
    lambda a, b: [a[0] + b[0], a[1] + b[1]],
    ordered=False,
)
op.output("out", op.map("record", windows.down, record), FileSink(out / "partition-0.jsonl"))
"""
BYTEWAX_HARNESS = """
from bytewax.testing import run_main

late = op.map("late_line", windows.late, lambda kv: (kv[0], str(kv[1][0])))
op.output("late", late, FileSink(out / "late.txt"))
run_main(flow)
"""

FLOOR = """
import os
import sys

import orjson

MINUTE = 60_000


def main():
    data, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    open_ = {}
    for p in range(n):
        with open(f"{data}/partition-{p}.jsonl", "rb") as f:
            for line in f:
                m = orjson.loads(line)
                ts = m["ts"]
                key = (ts - ts % MINUTE, m["user"])
                acc = open_.get(key)
                if acc is None:
                    open_[key] = [1, m["amount"]]
                else:
                    acc[0] += 1
                    acc[1] += m["amount"]
    with open(f"{out}/partition-0.jsonl", "wb") as f:
        for (start, user), value in open_.items():
            record = {"key": user, "start": start, "end": start + MINUTE, "value": value, "final": True}
            f.write(orjson.dumps(record) + b"\\n")
        f.flush()
        os.fsync(f.fileno())


main()
"""


def generate(data: Path, events: int, users: int, rate: int, disorder: int, seed: int = 35) -> int:
    """Write the partitions; return the number of (user, window) results. Raises SystemExit if
    some event would be late (see the module's docstring)."""
    rng = random.Random(seed)
    data.mkdir(parents=True, exist_ok=True)
    stamps: list[list[int]] = [[] for _ in range(PARTITIONS)]
    windows: set[tuple[int, int]] = set()
    files = [open(data / f"partition-{p}.jsonl", "w", encoding="utf-8") for p in range(PARTITIONS)]
    try:
        for i in range(events):
            u = rng.randrange(users)
            p = u % PARTITIONS
            ts = T0 + i * 1000 // rate - rng.randint(0, disorder)
            stamps[p].append(ts)
            windows.add((u, ts // MINUTE))
            files[p].write(f'{{"user":"u{u}","ts":{ts},"amount":{rng.randrange(1, 1000)}}}\n')
    finally:
        for f in files:
            f.close()
    for p, seen in enumerate(stamps):
        watermark = -1 - LAG_MS
        for k, t in enumerate(seen):
            if t - t % MINUTE + MINUTE <= watermark:
                raise SystemExit(
                    f"partition {p}, line {k + 1}: ts {t} is late (its window ended at or before the "
                    f"watermark {watermark}); lower --disorder ({disorder}) to at most the lag ({LAG_MS})"
                )
            watermark = max(watermark, t - LAG_MS)
    return len(windows)


def results(out: Path) -> tuple[str, int]:
    """(digest, count) of the (user, start, end, count, sum) results under ``out``; SystemExit on a
    window sent twice or not final."""
    seen: dict[tuple[str, int], tuple[int, int, int]] = {}
    for f in sorted(out.glob("*.jsonl")):
        with open(f, "rb") as fh:
            for line in fh:
                r = json.loads(line)
                value = r["value"]  # [count, sum], or Agg's {"count", "sum"}
                count, total = (value["count"], value["sum"]) if isinstance(value, dict) else value
                k = (r["key"], r["start"])
                if k in seen or r["final"] is not True:
                    raise SystemExit(f"{out}: window {k} sent twice or not final: {r}")
                seen[k] = (r["end"], count, total)
    h = hashlib.sha256()
    for k in sorted(seen):
        h.update(f"{k}{seen[k]}\n".encode())
    return h.hexdigest(), len(seen)


def code_lines(text: str) -> int:
    """Non-blank lines that are not comments (``#``) nor part of a docstring."""
    n = 0
    in_doc = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(('"""', "'''")):
            if not (len(line) > 3 and line.endswith(line[:3])):
                in_doc = not in_doc
            continue
        if in_doc or not line or line.startswith("#"):
            continue
        n += 1
    return n


def job_lines() -> dict[str, str]:
    """Each contender's job code, as counted (see the module's docstring)."""
    harness = ("data, out = ", "def main():", "    data, out, n = ", "main()")
    flow = "\n".join(x for x in BYTEWAX_FLOW.splitlines() if not x.startswith(harness[0]))
    floor = "\n".join(x for x in FLOOR.splitlines() if not x.startswith(harness[1:]))
    hand = JOB.format(engine="c", extra=HAND_CONFIG)
    windows = JOB.format(engine="c", extra="")
    return {
        "floor": f"{code_lines(floor)}",
        "hand": _py_toml(HAND_TASK, hand),
        "windows": _py_toml(WINDOWS_TASK, windows),
        "bytewax": f"{code_lines(flow)}",
    }


def _py_toml(task: str, job: str) -> str:
    return f"{code_lines(task) + code_lines(job)} ({code_lines(task)} py + {code_lines(job)} toml)"


class Runner:
    def __init__(self, root: Path, data: Path, engine: str) -> None:
        self.root = root
        self.data = data
        self.jobs: dict[str, Path] = {}
        for name, task, extra in (("hand", HAND_TASK, HAND_CONFIG), ("windows", WINDOWS_TASK, "")):
            d = root / f"job-{name}"
            d.mkdir()
            (d / "data").symlink_to(data.parent)
            (d / "task.py").write_text(task)
            (d / "job.toml").write_text(JOB.format(engine=engine, extra=extra))
            self.jobs[name] = d
        (root / "floor.py").write_text(FLOOR)
        (root / "bytewax_flow.py").write_text(BYTEWAX_FLOW + BYTEWAX_HARNESS)
        self.reference: tuple[str, int] | None = None

    def run(self, contender: str) -> tuple[float, float, int]:
        env = dict(os.environ)
        if contender in self.jobs:
            d = self.jobs[contender]
            shutil.rmtree(d / "output", ignore_errors=True)
            shutil.rmtree(d / "state", ignore_errors=True)
            wall, cpu, rss, _ = e2e._spawn([sys.executable, "-m", "tailrace", "run", str(d)], d, env)
            out = d / "output" / "out"
        else:
            out = self.root / f"out-{contender}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            script = self.root / ("floor.py" if contender == "floor" else "bytewax_flow.py")
            argv = [sys.executable, str(script), str(self.data), str(out)]
            if contender == "floor":
                argv.append(str(PARTITIONS))
            wall, cpu, rss, _ = e2e._spawn(argv, self.root, env)
            late = out / "late.txt"
            if late.exists() and late.stat().st_size:
                n = len(late.read_text().splitlines())
                raise SystemExit(f"bytewax: {n} late events (its clock's system time ran on); rerun")
        self.check(contender, out)
        return wall, cpu, rss

    def check(self, contender: str, out: Path) -> None:
        got = results(out)
        if self.reference is None:
            self.reference = got
        elif got != self.reference:
            raise SystemExit(
                f"{contender}: {got[1]} results, digest {got[0][:12]}; the first run's: "
                f"{self.reference[1]}, {self.reference[0][:12]}"
            )


def available(asked: list[str]) -> list[str]:
    """The contenders asked for that can run here, saying on stderr why any other is skipped."""
    missing = {
        "windows": ("tailrace.windows", "this tailrace has no window API"),
        "bytewax": ("bytewax", "bytewax is not installed"),
    }
    out = []
    for c in asked:
        module, why = missing.get(c, ("", ""))
        if module and importlib.util.find_spec(module) is None:
            print(f"{c}: skipped ({why})", file=sys.stderr)
            continue
        out.append(c)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=5_000, help="events a second of event time, all partitions")
    ap.add_argument("--disorder", type=int, default=LAG_MS, help="the most an event is late, in ms")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--engine", default="c", choices=("c", "python"), help="the tailrace jobs' engine")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--json", help="write every sample and the medians here")
    args = ap.parse_args()
    asked = [c for c in args.contenders.split(",") if c]
    bad = [c for c in asked if c not in CONTENDERS]
    if bad or not asked:
        raise SystemExit(f"--contenders: expected some of {', '.join(CONTENDERS)}; got {args.contenders!r}")
    contenders = available(asked)
    if not contenders:
        raise SystemExit("no contender can run here")

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailrace-windows-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        data = root / "data" / "events"
        n_windows = generate(data, args.events, args.users, args.rate, args.disorder)
        size = sum(f.stat().st_size for f in data.iterdir())
        print(
            f"{args.events} events, {size / 1e6:.1f} MB in {PARTITIONS} partitions, {n_windows} (user, "
            f"minute) windows, {args.events / args.rate:.0f} s of event time, disorder <= {args.disorder} ms "
            f"({time.perf_counter() - t:.1f} s to generate); load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        runner = Runner(root, data, args.engine)
        load_before = os.getloadavg()
        samples: dict[str, list[tuple[float, float, int]]] = {c: [] for c in contenders}
        for i in range(args.rounds):
            for c in contenders:
                s = runner.run(c)
                samples[c].append(s)
                print(
                    f"  round {i + 1} {c:8} wall {s[0]:6.2f} s  cpu {s[1]:6.2f} s  "
                    f"rss {s[2] / 1024:6.1f} MiB  load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        load_after = os.getloadavg()
        assert runner.reference is not None
        doc = report(args.events, samples, load_before, load_after)
        doc.update(events=args.events, windows=n_windows, rounds=args.rounds, engine=args.engine)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(doc, indent=1))
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def report(
    events: int,
    samples: dict[str, list[tuple[float, float, int]]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    rounds = len(next(iter(samples.values())))
    print(
        f"\nmedians over {rounds} alternating rounds; results equal across contenders; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    lines = job_lines()
    print(
        f"{'contender':9} {'wall s':>7} {'cpu s':>7} {'MiB':>6} {'events/s':>9} {'cpu ns/ev':>9}  "
        "job code lines"
    )
    med: dict[str, dict[str, Any]] = {}
    for c, ss in samples.items():
        w = statistics.median(s[0] for s in ss)
        cpu = statistics.median(s[1] for s in ss)
        rss = statistics.median(s[2] for s in ss) / 1024
        med[c] = {"wall_s": w, "cpu_s": cpu, "rss_mib": rss, "events_per_s": events / w, "samples": ss}
        print(f"{c:9} {w:7.2f} {cpu:7.2f} {rss:6.1f} {events / w:9.0f} {cpu / events * 1e9:9.0f}  {lines[c]}")
    ratios: dict[str, float] = {}

    def ratio(name: str, value: float, target: str) -> None:
        ratios[name] = value
        print(f"{name:34} {value:6.2f}  (target {target})" if target else f"{name:34} {value:6.2f}")

    print()
    if "windows" in med and "hand" in med:
        ratio("windows CPU / hand CPU", med["windows"]["cpu_s"] / med["hand"]["cpu_s"], "<= 1.2")
    if "windows" in med and "bytewax" in med:
        ratio("windows throughput / bytewax", med["bytewax"]["wall_s"] / med["windows"]["wall_s"], ">= 3")
    if "hand" in med and "bytewax" in med:
        ratio("hand throughput / bytewax", med["bytewax"]["wall_s"] / med["hand"]["wall_s"], "")
    for c in ("hand", "windows"):
        if c in med and "floor" in med:
            ratio(f"{c} CPU / floor CPU", med[c]["cpu_s"] / med["floor"]["cpu_s"], "")
    return {
        "load_before": load_before,
        "load_after": load_after,
        "medians": med,
        "ratios": ratios,
        "job_code_lines": lines,
    }


if __name__ == "__main__":
    main()
