"""What event timestamps and the event-time watermark cost a message (issue 35: at most 20 ns).

Two measures of a 1-task memory job whose ``process`` does nothing (the C engine), each a slope
between two input sizes (``--small`` and ``--large`` messages) so that start-up and the final
commit cancel out:

- instructions per message under valgrind's callgrind (the same on a quiet and a busy machine);
- ns per message of CPU time (``time.process_time``, best of ``--repeat`` runs).

Variants: ``ingest`` (messages are ints: ingestion time, the default, and the watermark),
``field`` (messages are ``{"t": ms}`` objects read with ``task.timestamp.field = t``), each
against ``--baseline PYTHON`` (an interpreter whose tailrace is a build without event time:
``pip install`` the commit to compare with into a venv of its own) running the same messages.

    python bench/event_time_cost.py --baseline /path/to/base/venv/bin/python
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

JOB = """
import sys, time
from tailrace import Container, MemoryCheckpointStore, MemorySystem, StreamTask

class Noop(StreamTask):
    def process(self, envelope, collector, coordinator):
        pass

n, variant, field = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
messages = [{"t": 1_700_000_000_000 + i} for i in range(n)] if variant == "field" else list(range(n))
config = {"task.timestamp.field": "t"} if field else {}
system = MemorySystem().add_stream("in", [messages])
c = Container(Noop, inputs=["mem.in"], systems=[system], checkpoints=MemoryCheckpointStore(), engine="c",
              **config)
t0 = time.process_time()
c.run()
print(time.process_time() - t0)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "0"}


def instructions(argv: list[str]) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if not found:
        raise SystemExit(f"callgrind printed no count for {argv}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def seconds(argv: list[str], repeat: int) -> float:
    runs = [
        float(subprocess.run(argv, capture_output=True, text=True, env=_env(), check=True).stdout)
        for _ in range(repeat)
    ]
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="a Python whose tailrace is the build to compare with")
    ap.add_argument("--small", type=int, default=20_000)
    ap.add_argument("--large", type=int, default=60_000)
    ap.add_argument("--time-small", type=int, default=200_000)
    ap.add_argument("--time-large", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--variants", default="ingest,field")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tailrace-event-time-"))
    try:
        script = root / "job.py"
        script.write_text(JOB)
        pythons = [("baseline", args.baseline)] if args.baseline else []
        pythons.append(("this build", sys.executable))
        print(f"{'variant':<8} {'build':<11} {'instr/msg':>10} {'ns/msg (CPU)':>13}")
        for variant in args.variants.split(","):
            for label, python in pythons:
                field = "1" if variant == "field" and label == "this build" else "0"
                argv = [python, str(script)]
                instr = float("nan")
                if not args.no_callgrind and shutil.which("valgrind"):
                    a = instructions([*argv, str(args.small), variant, field])
                    b = instructions([*argv, str(args.large), variant, field])
                    instr = (b - a) / (args.large - args.small)
                sa = seconds([*argv, str(args.time_small), variant, field], args.repeat)
                sb = seconds([*argv, str(args.time_large), variant, field], args.repeat)
                ns = (sb - sa) / (args.time_large - args.time_small) * 1e9
                print(f"{variant:<8} {label:<11} {instr:>10.1f} {ns:>13.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
