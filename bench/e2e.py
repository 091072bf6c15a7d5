"""End to end: a real file job under `tailrace run` against the script a user would write instead.

The job: JSON Lines in 4 input partitions (``{"user": ..., "amount": ..., "seq": ...}``); the
task parses each message, keeps a per-user running sum and emits one JSON record per input
(``{"user", "seq", "total"}``) to an output stream of 4 partitions (placed by user). The
contenders, each in its own process, run ALTERNATELY (A B A B ...) so that a noisy machine
hurts every side alike:

``loop``     the hand-written single-threaded loop: readline, json.loads, dict, json.dumps, write
``floor``    the floor of the task API: a bare loop (readline, decode) that calls the job's own
             ``Sums.process(envelope, collector, None)``, with a plain envelope object and a
             ``collector.send`` that encodes and writes: what any runtime calling ``process``
             per message must spend at least (``--no-floor`` leaves it out)
``c``        ``tailrace run`` with the C engine, files, SQLite checkpoints
``python``   ``tailrace run`` with the reference engine (``--engines c,python``)
``c2``       ``tailrace run --containers 2`` with the C engine: two container processes
             (tasks 0, 2 and 1, 3), one SQLite store, shared output files (``--engines c,c2``);
             ``cN`` likewise with N containers (``--engines c,c4,c16 --partitions 16``)
``bytewax``  bytewax's FileSource/FileSink doing the same work, where bytewax is installed
``c-eo``     ``c`` with ``task.output.guarantee = exactly-once`` (``python-eo``, ``c2-eo`` likewise):
             outputs held per task until the commit that publishes them (docs/outputs.md)

for each JSON library asked for (``--libs std,orjson``): ``std`` blocks the orjson import in
the child (the loop and the floor use the standard library, and so does tailrace's serdes
where its own compiled codec leaves a value or text to others), ``orjson`` makes the loop and
the floor call orjson and leaves tailrace's serdes its orjson fallback. tailrace's compiled
codec writes this job's records and reads its lines itself in both (the standard library's
bytes and values; tailrace.serdes).

Lanes: ``--partitions 4,16,64`` (input partitions; the output keeps 4), ``--state dict,store``
(``store``: the tailrace job's Sums keeps its sums in a state store, ``[stores.sums]`` in its
job file; the loop and the floor keep a dict in every lane) and ``--amounts int,float``
(``float``: amounts with two decimals, so float totals). Each combination of those with a
library is a lane: its own job directories, its own loop and floor runs (lanes over the same
partitions and amounts share one generated input); in each round every lane runs its
contenders alternately, a data set's dict and store lanes back to back. With none of these
options the single lane per library is the job described above.

Each run is checked: its output holds the same records as the loop's (as a multiset over all
partitions, and per user in the same order). Printed per lane and contender: the median wall
time, CPU (user + system, from wait4) and peak RSS, and the ratios to the loop; after a store
lane, each engine's median CPU over the same engine's in the dict lane (``store CPU / dict CPU``).

    python bench/e2e.py --messages 500000 --pairs 5
    python bench/e2e.py --messages 2000000 --pairs 3 --libs orjson --engines c
    python bench/e2e.py --json bench/results/e2e.json --plot bench/results/e2e.png
    python bench/e2e.py --libs orjson --engines c --partitions 4,16,64 --state dict,store --amounts float
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARTITIONS = 4  # input partitions unless --partitions says otherwise
OUT_PARTITIONS = 4  # output partitions, in every lane
STATES = ("dict", "store")
AMOUNTS = ("int", "float")

TASK = """
import tailrace


class Sums(tailrace.StreamTask):
    def init(self, context):
        self.sums = {}

    def process(self, envelope, collector, coordinator):
        m = envelope.message
        user = m["user"]
        total = self.sums.get(user, 0) + m["amount"]
        self.sums[user] = total
        collector.send("out", {"user": user, "seq": m["seq"], "total": total}, key=user)
"""

# --state store: the same task keeping its sums in a state store ([stores.sums], the defaults:
# json keys and values, committed with the offsets) instead of a dict.
TASK_STORE = TASK.replace("self.sums = {}", 'self.sums = context.store("sums")')
assert TASK_STORE != TASK

JOB = """
[job]
name = "e2e"
task = "task.py:Sums"
inputs = ["files.events"]
engine = "{engine}"
default_output = "files"

[config]
"task.commit.ms" = 1000
{guarantee}
[systems.files]
type = "file"
path = "data"
output_path = "output"
output_partitions = {out_partitions}

{stores}[checkpoints]
type = "sqlite"
path = "state/checkpoints.db"
"""
STORES = """[stores.sums]

"""

# The loop's and the floor's first lines: the JSON library (argv[1]), the same on both.
SCRIPT_PRELUDE = """
import os
import sys
import zlib

LIB = sys.argv[1]
if LIB == "orjson":
    import orjson
    loads = orjson.loads
    def dumps(obj):
        return orjson.dumps(obj) + b"\\n"
else:
    import json
    loads = json.loads
    _enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    def dumps(obj):
        return (_enc(obj) + "\\n").encode()
"""

# The loop places a record the way tailrace's collector does (key_partition: the CRC-32 of
# the key's UTF-8 bytes), once per user (a dict), so it pays next to nothing for it; it
# imports nothing of tailrace, as a hand-written script would not; and it runs in a
# function, as a careful script does (at module level every name it touches would be a
# dict lookup: about 20% slower with orjson).
LOOP = (
    SCRIPT_PRELUDE
    + """
def main():
    data, out, n_in, n_out = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    outs = [open(f"{out}/partition-{p}.jsonl", "wb") for p in range(n_out)]
    place = {}
    sums = {}
    for p in range(n_in):
        with open(f"{data}/partition-{p}.jsonl", "rb") as f:
            for line in f:
                m = loads(line)
                user = m["user"]
                total = sums.get(user, 0) + m["amount"]
                sums[user] = total
                q = place.get(user)
                if q is None:
                    q = place[user] = zlib.crc32(user.encode()) % n_out
                outs[q].write(dumps({"user": user, "seq": m["seq"], "total": total}))
    for f in outs:
        f.flush()
        os.fsync(f.fileno())
        f.close()


main()
"""
)

# The floor: the job's own task.py, run by a bare loop instead of tailrace. Its ``import
# tailrace`` gets a stand-in module (StreamTask = object), so the floor pays nothing of
# tailrace but the per-message calls its API implies: an envelope object, process(), send().
FLOOR = (
    SCRIPT_PRELUDE
    + """
import types

sys.modules["tailrace"] = types.SimpleNamespace(StreamTask=object)
task_module = types.ModuleType("task")
with open(sys.argv[6], encoding="utf-8") as f:
    exec(compile(f.read(), sys.argv[6], "exec"), task_module.__dict__)


class Envelope:
    __slots__ = ("system", "stream", "partition", "offset", "key", "message")

    def __init__(self, partition, offset, message):
        self.system = "files"
        self.stream = "events"
        self.partition = partition
        self.offset = offset
        self.key = None
        self.message = message


class Collector:
    def __init__(self, outs):
        self.outs = outs
        self.place = {}

    def send(self, stream, message, key=None, partition=None):
        q = self.place.get(key)
        if q is None:
            q = self.place[key] = zlib.crc32(key.encode()) % len(self.outs)
        self.outs[q].write(dumps(message))


def main():
    data, out, n_in, n_out = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    outs = [open(f"{out}/partition-{p}.jsonl", "wb") for p in range(n_out)]
    collector = Collector(outs)
    task = task_module.Sums()
    task.init(None)
    process = task.process
    for p in range(n_in):
        with open(f"{data}/partition-{p}.jsonl", "rb") as f:
            offset = 0
            for line in f:
                process(Envelope(p, offset, loads(line)), collector, None)
                offset += len(line)
    for f in outs:
        f.flush()
        os.fsync(f.fileno())
        f.close()


main()
"""
)

BYTEWAX = """
import sys, json
from pathlib import Path
import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.connectors.files import FileSource, FileSink
from bytewax.testing import run_main

LIB = sys.argv[1]
if LIB == "orjson":
    import orjson
    loads = orjson.loads
    dumps = lambda o: orjson.dumps(o).decode()
else:
    loads = json.loads
    dumps = lambda o: json.dumps(o, ensure_ascii=False, separators=(",", ":"))
data, out, n_in = sys.argv[2], sys.argv[3], int(sys.argv[4])
flow = Dataflow("e2e")
streams = [op.input(f"in{p}", flow, FileSource(Path(f"{data}/partition-{p}.jsonl"))) for p in range(n_in)]
s = op.merge("merge", *streams) if n_in > 1 else streams[0]
s = op.map("parse", s, loads)
s = op.key_on("key", s, lambda m: m["user"])

def step(total, m):
    total = (total or 0) + m["amount"]
    return total, dumps({"user": m["user"], "seq": m["seq"], "total": total})

s = op.stateful_map("sum", s, step)  # (user, line): FileSink takes (key, value) pairs and writes the value
op.output("out", s, FileSink(Path(f"{out}/partition-0.jsonl")))
run_main(flow)
"""


def generate(
    root: Path, messages: int, users: int, seed: int = 7, partitions: int = PARTITIONS, amounts: str = "int"
) -> None:
    """JSON Lines partitions; a user lives in one partition (so per-task sums are global).

    ``amounts="float"``: amounts with two decimals (``round(uniform(1, 1000), 2)``), so the
    totals are floats; every contender adds a user's amounts in the same order (its partition's
    offset order), so they write the same totals, byte for byte."""
    rng = random.Random(seed)
    data = root / "events"
    data.mkdir(parents=True, exist_ok=True)
    files = [open(data / f"partition-{p}.jsonl", "w", encoding="utf-8") for p in range(partitions)]
    try:
        for i in range(messages):
            u = rng.randrange(users)
            p = u % partitions
            amount: float = round(rng.uniform(1, 1000), 2) if amounts == "float" else rng.randrange(1, 1000)
            rec = {"user": f"user-{u}", "amount": amount, "seq": i, "note": "événement"}
            files[p].write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    finally:
        for f in files:
            f.close()


def _blocker(root: Path) -> Path:
    """A directory whose orjson.py refuses to import: the child then uses the standard library."""
    d = root / "no-orjson"
    d.mkdir(exist_ok=True)
    (d / "orjson.py").write_text("raise ImportError('blocked by bench/e2e.py --libs std')\n")
    return d


# Linux carries a process's peak RSS across fork + exec, so a child forked straight from
# this (large) process would report this process's peak: a small fresh wrapper forks the
# measured child instead and reports its wait4 figures on stdout.
MEASURE = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, ru = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
print(json.dumps([os.waitstatus_to_exitcode(status), wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss]))
"""


def _spawn(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int, str]:
    """Run a child; (wall s, CPU s, peak RSS KiB, stderr tail) from wait4."""
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv], cwd=cwd, env=env, capture_output=True, check=False
    )
    tail = proc.stderr.decode(errors="replace")[-2000:]
    try:
        rc, wall, cpu, rss = json.loads(proc.stdout)
    except ValueError:
        rc, wall, cpu, rss = proc.returncode or 1, 0.0, 0.0, 0
    if rc != 0:
        raise SystemExit(f"{argv[:4]} exited {rc}:\n{tail}")
    return wall, cpu, rss, tail


def _records(out: Path, values: bool = False) -> tuple[str, str, str]:
    """Digests of the output: every line (a multiset: the lines sorted), their values (each line
    decoded and re-encoded with sorted keys, also sorted; "" unless ``values``) and, per user,
    the seq order of its records. Digests, not the records: a run of many lanes keeps one
    reference per lane."""
    lines: list[bytes] = []
    decoded: list[str] = []
    order: dict[str, list[int]] = defaultdict(list)
    for f in sorted(out.glob("partition-*.jsonl")):
        with open(f, "rb") as fh:
            for line in fh:
                lines.append(line)
                m = json.loads(line)
                order[m["user"]].append(m["seq"])
                if values:
                    decoded.append(json.dumps(m, sort_keys=True))
    lines.sort()
    h_lines = hashlib.sha256()
    for line in lines:
        h_lines.update(len(line).to_bytes(8, "little") + line)
    h_values = hashlib.sha256()
    for v in sorted(decoded):
        h_values.update(v.encode() + b"\n")
    h_order = hashlib.sha256()
    for user, seqs in sorted(order.items()):
        h_order.update(f"{user}:{seqs}\n".encode())
    return h_lines.hexdigest(), h_values.hexdigest() if values else "", h_order.hexdigest()


@dataclass(frozen=True)
class Lane:
    """One data set and job setup: input partitions, where Sums keeps its sums (``dict`` or a
    ``store``), int or float amounts, and the JSON library. ``name`` shows the library and each
    dimension asked for with other values than its default (``std`` when none: the old
    output), e.g. ``p16/store/float/orjson``."""

    partitions: int
    state: str
    amounts: str
    lib: str
    name: str
    pair: str  # the name without the state: a dict lane and its store lane share it

    @property
    def slug(self) -> str:
        return self.name.replace("/", "-")

    def record(self) -> dict[str, Any]:
        return {"partitions": self.partitions, "state": self.state, "amounts": self.amounts, "lib": self.lib}


def lanes_for(partitions: list[int], states: list[str], amounts: list[str], libs: list[str]) -> list[Lane]:
    """Every combination, the dict and store lanes of one data set and library side by side
    (they run one after the other in each round, so their CPU ratio compares like with like)."""
    show_p = partitions != [PARTITIONS]
    show_s = states != ["dict"]
    show_a = amounts != ["int"]
    out = []
    for p in partitions:
        for a in amounts:
            for lib in libs:
                pair = [f"p{p}"] * show_p + [a] * show_a + [lib]
                for s in states:
                    name = [f"p{p}"] * show_p + [s] * show_s + [a] * show_a + [lib]
                    out.append(Lane(p, s, a, lib, "/".join(name), "/".join(pair)))
    return out


def data_dir(root: Path, partitions: int, amounts: str) -> Path:
    """The input of every lane over (partitions, amounts): ``data`` for the defaults."""
    return root / (
        "data" if (partitions, amounts) == (PARTITIONS, "int") else f"data-p{partitions}-{amounts}"
    )


class Runner:
    def __init__(self, root: Path, lane: Lane, engines: list[str], base_python: str | None = None) -> None:
        self.root = root
        self.lane = lane
        self.lib = lane.lib
        self.data = data_dir(root, lane.partitions, lane.amounts)
        self.base_python = base_python
        self.env = dict(os.environ)
        if self.lib == "std":
            self.env["PYTHONPATH"] = os.pathsep.join(
                [str(_blocker(root))] + ([self.env["PYTHONPATH"]] if self.env.get("PYTHONPATH") else [])
            )
        store = lane.state == "store"
        self.jobs: dict[str, Path] = {}
        for engine in engines:
            if (
                engine in ("c", "python", "c-base", "python-base")
                or _containers(engine.removesuffix("-eo"))
                or (engine in ("c-eo", "python-eo"))
            ):
                d = root / f"job-{lane.slug}-{engine}"
                d.mkdir()
                (d / "data").symlink_to(self.data)
                (d / "task.py").write_text(TASK_STORE if store else TASK)
                kind = engine.removesuffix("-base").removesuffix("-eo")
                kind = "c" if _containers(kind) else kind
                eo = '"task.output.guarantee" = "exactly-once"\n' if engine.endswith("-eo") else ""
                (d / "job.toml").write_text(
                    JOB.format(
                        engine=kind,
                        out_partitions=OUT_PARTITIONS,
                        stores=STORES if store else "",
                        guarantee=eo,
                    )
                )
                self.jobs[engine] = d
        # the loop's and the floor's: the dict task in every lane (the hand-written baseline)
        (root / "loop.py").write_text(LOOP)
        (root / "floor.py").write_text(FLOOR)
        (root / "task.py").write_text(TASK)
        (root / "bytewax_flow.py").write_text(BYTEWAX)
        self.reference: tuple[str, str, str] | None = None

    def run(self, contender: str) -> tuple[float, float, int]:
        if contender in ("loop", "floor", "bytewax"):
            out = self.root / f"out-{self.lane.slug}-{contender}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            script = {"loop": "loop.py", "floor": "floor.py", "bytewax": "bytewax_flow.py"}[contender]
            argv = [
                sys.executable,
                str(self.root / script),
                self.lib,
                str(self.data / "events"),
                str(out),
            ]
            argv += [str(self.lane.partitions)] + ([str(OUT_PARTITIONS)] if contender != "bytewax" else [])
            if contender == "floor":
                argv.append(str(self.root / "task.py"))
            wall, cpu, rss, _ = _spawn(argv, self.root, self.env)
        else:
            d = self.jobs[contender]
            shutil.rmtree(d / "output", ignore_errors=True)
            shutil.rmtree(d / "state", ignore_errors=True)
            python = self.base_python if contender.endswith("-base") and self.base_python else sys.executable
            argv = [python, "-m", "tailrace", "run", str(d)]
            n = _containers(contender.removesuffix("-eo"))
            if n:  # CPU: wait4 counts the containers (reaped by the parent)
                argv += ["--containers", str(n)]
            wall, cpu, rss, _ = _spawn(argv, d, self.env)
            out = d / "output" / "out"
        self.check(contender, out)
        return wall, cpu, rss

    def check(self, contender: str, out: Path) -> None:
        if self.reference is None:  # the first run of the lane (the loop's)
            self.reference = _records(out, values=True)
            return
        lines, values, order = _records(out, values=contender == "bytewax")
        ref_lines, ref_values, ref_order = self.reference
        if contender == "bytewax":  # one output file; compare values, not bytes
            same = values == ref_values
        else:
            same = lines == ref_lines
        if not same or order != ref_order:
            raise SystemExit(f"{contender} ({self.lane.name}): output differs from the hand-written loop's")


def _containers(engine: str) -> int:
    """N for a ``cN`` contender (``tailrace run --containers N``, N >= 2), else 0."""
    m = re.fullmatch(r"c([2-9]|[1-9][0-9]+)", engine)
    return int(m.group(1)) if m else 0


def _list(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    items = list(dict.fromkeys(x for x in text.split(",") if x))
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit(f"{option}: expected a comma-separated list of {', '.join(allowed)}; got {text!r}")
    return items


def _partitions(text: str) -> list[int]:
    try:
        items = list(dict.fromkeys(int(x) for x in text.split(",") if x))
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise SystemExit(f"--partitions: expected a comma-separated list of positive integers; got {text!r}")
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--pairs", type=int, default=5, help="alternating rounds (>= 5 for quoted figures)")
    ap.add_argument("--libs", default="std,orjson", help="std, orjson or both")
    ap.add_argument(
        "--engines",
        default="c,python",
        help="tailrace contenders: c, python, cN (--containers N: c2, c16), and each with -eo (c-eo, "
        "python-eo, c2-eo): task.output.guarantee = exactly-once",
    )
    ap.add_argument(
        "--partitions",
        default=str(PARTITIONS),
        help=f"input partitions, one lane each, e.g. 4,16,64 (default {PARTITIONS}; "
        f"output partitions: {OUT_PARTITIONS} in every lane)",
    )
    ap.add_argument(
        "--state",
        default="dict",
        help="dict, store or both: where the tailrace job's task keeps its sums (a dict, or a state "
        "store declared in the job file); the loop and the floor keep a dict in every lane",
    )
    ap.add_argument("--amounts", default="int", help="int, float or both: the amounts summed")
    ap.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="add contenders c-base / python-base: each engine asked for, run by another interpreter "
        "(an older build's venv)",
    )
    ap.add_argument("--bytewax", action="store_true", help="add bytewax's file connectors (if installed)")
    ap.add_argument(
        "--no-floor", action="store_true", help="leave out the floor (a bare loop calling the task's process)"
    )
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--json", help="write every sample and the medians here")
    ap.add_argument("--plot", help="bar chart of median throughput (needs matplotlib)")
    args = ap.parse_args()

    engines = [e for e in args.engines.split(",") if e]
    libs = [x for x in args.libs.split(",") if x]
    partitions = _partitions(args.partitions)
    states = _list(args.state, STATES, "--state")
    amounts = _list(args.amounts, AMOUNTS, "--amounts")
    if "orjson" in libs:
        try:
            import orjson  # noqa: F401
        except ImportError:
            raise SystemExit("--libs orjson needs orjson: pip install 'tailrace[fast]'") from None
    if args.baseline:
        engines += [f"{e}-base" for e in engines if e in ("c", "python")]
    contenders = ["loop", *([] if args.no_floor else ["floor"]), *engines]
    if args.bytewax:
        try:
            import bytewax  # noqa: F401
        except ImportError:
            print("bytewax is not installed: skipped", file=sys.stderr)
        else:
            contenders.append("bytewax")
    lanes = lanes_for(partitions, states, amounts, libs)
    width = max(6, *(len(lane.name) for lane in lanes))

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tailrace-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "messages": args.messages,
        "pairs": args.pairs,
        "load_before": os.getloadavg(),
    }
    if [lane.name for lane in lanes] != libs:  # a lane option asked for: say which lanes ran
        results["lanes"] = {lane.name: lane.record() for lane in lanes}
    try:
        for p in partitions:
            for a in amounts:
                t = time.perf_counter()
                data = data_dir(root, p, a)
                generate(data, args.messages, args.users, partitions=p, amounts=a)
                size = sum(f.stat().st_size for f in (data / "events").iterdir())
                kind = f", {a} amounts" if amounts != ["int"] else ""
                print(
                    f"{args.messages} messages, {size / 1e6:.1f} MB in {p} partitions{kind} "
                    f"({time.perf_counter() - t:.1f} s to generate); load {os.getloadavg()[0]:.2f}"
                )
        runners = {lane.name: Runner(root, lane, engines, args.baseline) for lane in lanes}
        samples: dict[str, dict[str, list[tuple[float, float, int]]]] = {
            lane.name: {c: [] for c in contenders} for lane in lanes
        }
        for i in range(args.pairs):
            for lane in lanes:
                for c in contenders:
                    s = runners[lane.name].run(c)
                    samples[lane.name][c].append(s)
                    print(
                        f"  round {i + 1} {lane.name:{width}} {c:8} wall {s[0]:6.2f} s  cpu {s[1]:6.2f} s  "
                        f"rss {s[2] / 1024:6.1f} MiB  load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
        results["load_after"] = os.getloadavg()
        report(args.messages, lanes, samples, results, width)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1))
        if args.plot:
            plot(args.messages, results, args.plot, partitions)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def report(
    messages: int,
    lanes: list[Lane],
    samples: dict[str, dict[str, list[tuple[float, float, int]]]],
    results: dict[str, Any],
    width: int = 6,
) -> None:
    """Per lane: each contender's medians and its ratios to the lane's loop; after a store lane,
    the CPU of each tailrace job over the same job's in the dict lane of its data and library."""
    print(
        f"\nmedians over {len(next(iter(next(iter(samples.values())).values())))} alternating rounds; "
        f"load average {results['load_before'][0]:.2f} before, {results['load_after'][0]:.2f} after"
    )
    head = "lib" if all(lane.name == lane.lib for lane in lanes) else "lane"
    print(
        f"{head:{width}} {'contender':9} {'wall s':>7} {'cpu s':>7} {'MiB':>6} {'msg/s':>9} "
        f"{'cpu us/msg':>10} {'tput x loop':>11} {'cpu / loop':>10} {'pair ratios (loop wall / wall)':>30}"
    )
    out: dict[str, Any] = {}
    vs_dict: list[dict[str, Any]] = []
    by_name = {lane.name: lane for lane in lanes}
    dict_lanes = {lane.pair: lane for lane in lanes if lane.state == "dict"}
    for name, by in samples.items():
        lane = by_name[name]
        loop = by["loop"]
        lw = statistics.median(s[0] for s in loop)
        lc = statistics.median(s[1] for s in loop)
        for c, ss in by.items():
            w = statistics.median(s[0] for s in ss)
            cpu = statistics.median(s[1] for s in ss)
            rss = statistics.median(s[2] for s in ss) / 1024
            pairs = [a[0] / b[0] for a, b in zip(loop, ss)]
            row = {
                "lane": lane.record(),
                "contender": c,
                "wall_s": w,
                "cpu_s": cpu,
                "rss_mib": rss,
                "msg_per_s": messages / w,
                "cpu_us_per_msg": cpu / messages * 1e6,
                "throughput_x_loop": lw / w,
                "cpu_x_loop": cpu / lc,
                "pair_ratios": pairs,
                "samples": ss,
            }
            out[f"{name}/{c}"] = row
            print(
                f"{name:{width}} {c:9} {w:7.2f} {cpu:7.2f} {rss:6.1f} {messages / w:9.0f} "
                f"{cpu / messages * 1e6:10.2f} {lw / w:11.2f} {cpu / lc:10.2f}   "
                + " ".join(f"{r:.2f}" for r in pairs)
            )
        base = dict_lanes.get(lane.pair)
        if lane.state != "store" or base is None:
            continue
        for c, ss in by.items():
            if c in ("loop", "floor", "bytewax") or c not in samples[base.name]:
                continue  # the loop and the floor keep a dict in both lanes
            ds = samples[base.name][c]
            cpu_x = statistics.median(s[1] for s in ss) / statistics.median(s[1] for s in ds)
            wall_x = statistics.median(s[0] for s in ss) / statistics.median(s[0] for s in ds)
            print(f"{lane.pair:{width}} {c:9} store CPU / dict CPU: {cpu_x:.2f}x  (wall {wall_x:.2f}x)")
            rec = {k: v for k, v in lane.record().items() if k != "state"}
            vs_dict.append({"lane": rec, "contender": c, "cpu_x_dict": cpu_x, "wall_x_dict": wall_x})
    results["medians"] = out
    if vs_dict:
        results["store_vs_dict"] = vs_dict


def plot(messages: int, results: dict[str, Any], path: str, partitions: list[int] | None = None) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    rows = results["medians"]
    names = list(rows)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    vals = [rows[n]["msg_per_s"] / 1000 for n in names]
    shade = {"loop": "#888", "floor": "#bbb", "c": "#2a7"}
    colors = [shade.get(n.split("/")[-1], "#37c") for n in names]
    ax.barh(names, vals, color=colors)
    for y, (n, v) in enumerate(zip(names, vals)):
        ax.text(v, y, f" {v:.0f}k ({rows[n]['throughput_x_loop']:.2f}x)", va="center", fontsize=8)
    ax.set_xlabel("thousand messages / s (median)")
    ax.set_title(
        textwrap.shorten(
            f"bench/e2e.py: {messages} JSON Lines messages, parse + per-user sum + emit, "
            f"{','.join(map(str, partitions or [PARTITIONS]))} -> {OUT_PARTITIONS} partitions",
            90,
        ),
        fontsize=9,
    )
    ax.invert_yaxis()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
