"""What task.error.policy costs a good message (issue 36: within 2%), in instructions.

Instructions, not seconds: valgrind's callgrind counts the instructions a run executes, the
same on a quiet and on a busy machine, so one run of each variant is a figure. A message's cost
is the slope between two runs of one job at two input sizes (``--small`` and ``--large``
messages), so the start-up and the final commit cancel out. Jobs:

``noop``   a 1-task memory job whose ``process`` does nothing (sync_noop_1task's task)
``e2e``    bench/e2e.py's file job (JSON Lines in 4 partitions, a per-user sum, one JSON record
           out per message), sums in a dict; ``e2e-store``: in a ``[stores.sums]`` state store

each as configured by default (``fail``) and with ``task.error.policy = dead-letter``; with
``--baseline PYTHON``, also on that interpreter's tailrace (a build of the commit to compare
with: ``pip install`` it into a venv of its own), by default only. Commits: one, at the end.

    python bench/policy_cost.py --baseline /path/to/base/venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e  # bench/e2e.py: the job, its data and its task

NOOP = """
import sys
from tailrace import Container, MemoryCheckpointStore, MemorySystem, StreamTask

class Noop(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass

config = {{}}
if sys.argv[2] == "dead-letter":
    config = {{"task.error.policy": "dead-letter", "task.error.stream": "mem.dead"}}
n = int(sys.argv[1])
system = MemorySystem().add_stream("in", [list(range(n))])
Container(Noop, inputs=["mem.in"], systems=[system], checkpoints=MemoryCheckpointStore(), engine="c",
          **config).run()
"""
POLICY = '"task.error.policy" = "dead-letter"\n"task.error.stream" = "files.dead"\n'


def instructions(argv: list[str], cwd: Path) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if not found:
        raise SystemExit(f"callgrind printed no count for {argv}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def e2e_job(root: Path, data: Path, store: bool, policy: str) -> Path:
    d = root / f"job-{'store' if store else 'dict'}-{policy}-{data.name}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    (d / "data").symlink_to(data)
    (d / "task.py").write_text(e2e.TASK_STORE if store else e2e.TASK)
    job = e2e.JOB.format(
        engine="c", out_partitions=e2e.OUT_PARTITIONS, stores=e2e.STORES if store else "", guarantee=""
    )
    job = job.replace('"task.commit.ms" = 1000\n', '"task.commit.ms" = 600000\n')
    if policy == "dead-letter":
        job = job.replace('"task.commit.ms" = 600000\n', '"task.commit.ms" = 600000\n' + POLICY)
    (d / "job.toml").write_text(job)
    return d


def per_message(python: str, job: str, policy: str, root: Path, sizes: tuple[int, int]) -> float:
    counts = []
    for n in sizes:
        if job == "noop":
            script = root / "noop.py"
            script.write_text(NOOP.format())
            counts.append(instructions([python, str(script), str(n), policy], root))
        else:
            d = e2e_job(root, root / f"data-{n}", job == "e2e-store", policy)
            counts.append(instructions([python, "-m", "tailrace", "run", str(d), "--no-progress"], d))
    return (counts[1] - counts[0]) / (sizes[1] - sizes[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="a Python whose tailrace is the build to compare with")
    ap.add_argument("--small", type=int, default=20_000)
    ap.add_argument("--large", type=int, default=60_000)
    ap.add_argument("--jobs", default="noop,e2e,e2e-store")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    sizes = (args.small, args.large)
    root = Path(tempfile.mkdtemp(prefix="tailrace-policy-"))
    try:
        for n in sizes:
            e2e.generate(root / f"gen-{n}", n, 10_000)
            (root / f"gen-{n}" / "events").rename(root / f"data-{n}")
            (root / f"data-{n}").rename(root / f"data-{n}-events")
            (root / f"data-{n}").mkdir()
            (root / f"data-{n}-events").rename(root / f"data-{n}" / "events")
        print(f"instructions per message (callgrind, slope {sizes[0]:,} -> {sizes[1]:,} messages)")
        print(
            f"{'job':<10} {'baseline':>10} {'fail':>10} {'dead-letter':>12} {'fail/base':>10} {'dl/base':>8}"
        )
        for job in args.jobs.split(","):
            base = per_message(args.baseline, job, "fail", root, sizes) if args.baseline else None
            fail = per_message(sys.executable, job, "fail", root, sizes)
            dl = per_message(sys.executable, job, "dead-letter", root, sizes)
            ratios = f"{fail / base:>10.4f} {dl / base:>8.4f}" if base else ""
            print(f"{job:<10} {base or 0:>10,.0f} {fail:>10,.0f} {dl:>12,.0f} {ratios}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
