"""How long a commit holds the loop (issue 34): a job whose every commit writes many dirty
keys, with commits written by the commit writer's thread (``off``) against the same job
with its commits written on the loop thread (``on``), alternating (A B A B ...).

The task writes one key per message (``k<n % keys>``, a float), so each commit carries up
to ``--keys`` dirty keys; SQLite checkpoints, a commit every ``--commit-ms``. Measured in
the job itself: the longest gap between two consecutive ``process`` calls (the loop's
longest pause: a commit, a window, a read; the median gap is the per-message cost), and
on the writer, the longest time ``JobPlan.commit`` held the loop thread. Printed per
variant: medians over the rounds, and the dirty keys per commit seen.

    python bench/commit_pause.py                       # 160,000 keys, ~1 min
    python bench/commit_pause.py --keys 20000 --messages 200000 --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import tailrace
from tailrace.sqlite import SqliteCheckpointStore


class _OnLoop(SqliteCheckpointStore):
    """SQLite checkpoints written on the loop thread (the commit path without a writer)."""

    background_writes = False


class Writer(tailrace.StreamTask):
    keys = 160_000

    def init(self, context: Any) -> None:
        self.store = context.store("s")
        self.last = 0.0
        self.longest = 0.0
        self.gaps: list[float] = []
        Writer.instances.append(self)

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        n = envelope.message
        self.store[f"k{n % self.keys}"] = n * 0.5
        now = time.perf_counter()
        if self.last:
            gap = now - self.last
            if gap > self.longest:
                self.longest = gap
            if n % 97 == 0:
                self.gaps.append(gap)
        self.last = now

    instances: list[Any] = []


def run(variant: str, messages: int, keys: int, commit_ms: int, tmp: Path) -> dict[str, float]:
    Writer.keys = keys
    Writer.instances = []
    path = tmp / f"{variant}-{time.monotonic_ns()}.db"
    store = _OnLoop(path) if variant == "on" else SqliteCheckpointStore(path)
    mem = tailrace.MemorySystem("mem").add_stream("in", [list(range(messages))])
    container = tailrace.Container(
        Writer,
        inputs=["mem.in"],
        systems=[mem],
        checkpoints=store,
        stores={"s": {}},
        config={"task.commit.ms": commit_ms},
    )
    t0 = time.perf_counter()
    plan = container.plan
    held: list[Any] = []

    def keep_plan() -> Any:  # the JobPlan, for its commit writer's figures
        held.append(plan())
        return held[-1]

    container.plan = keep_plan  # type: ignore[method-assign]
    result = container.run()
    wall = time.perf_counter() - t0
    writer = held[0].writer
    task = Writer.instances[0]
    commits = result.tasks["Partition 0"].commits
    return {
        "wall_s": wall,
        "longest_gap_ms": task.longest * 1e3,
        "median_gap_us": statistics.median(task.gaps) * 1e6,
        "commits": commits,
        "keys_per_commit": min(keys, messages / max(1, commits)),
        "writer_keys_per_s": writer.keys / writer.busy if writer is not None and writer.busy else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=160_000, help="distinct keys written (dirty keys per commit)")
    ap.add_argument("--messages", type=int, default=2_400_000)
    ap.add_argument("--commit-ms", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per variant")
    args = ap.parse_args()
    samples: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="tailrace-commit-pause-") as d:
        for _ in range(args.rounds):
            for variant in ("off", "on"):
                samples[variant].append(run(variant, args.messages, args.keys, args.commit_ms, Path(d)))
    names = {"off": "commit writer thread", "on": "commit on the loop thread"}
    print(f"{args.messages:,} messages, {args.keys:,} keys, a commit every {args.commit_ms} ms")
    print(
        f"{'variant':28} {'wall s':>8} {'longest gap ms':>15} {'median gap us':>14} {'commits':>8} "
        f"{'writer keys/s':>14}"
    )
    for variant, rows in samples.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        rate = f"{med['writer_keys_per_s']:14,.0f}" if variant == "off" else f"{'':14}"
        print(
            f"{names[variant]:28} {med['wall_s']:8.2f} {med['longest_gap_ms']:15.2f} "
            f"{med['median_gap_us']:14.2f} {med['commits']:8.0f} {rate}"
        )


if __name__ == "__main__":
    main()
