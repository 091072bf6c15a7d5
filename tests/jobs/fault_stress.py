"""Stress mode of the fault tests (not run by CI): hundreds of seeded kill -9 trials.

    python -m tests.jobs.fault_stress --trials 300 --engine python
    python tests/jobs/fault_stress.py --trials 300          # same, from the repository root

Prints loss, duplicate and order figures; exits 1 if any trial lost a message,
broke per-partition order or replayed anything but the uncommitted tail.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `tests.jobs` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.jobs.faults import CheckerJob, kill_trial
else:
    from .faults import CheckerJob, kill_trial


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--engine", default="python", help="c or python (default python)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--records", type=int, default=1000, help="records per partition")
    ap.add_argument("--commit-ms", type=int, default=20)
    ap.add_argument("--delay-ms", type=float, default=0.2, help="per-message work of the checker task")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    dups: list[int] = []
    lost = 0
    failures: list[str] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tailrace-fault-stress-") as tmp:
        for trial in range(args.trials):
            job = CheckerJob(Path(tmp) / f"t{trial}", args.partitions, args.records, args.commit_ms)
            r = kill_trial(job, args.engine, rng, delay_ms=args.delay_ms)
            v = r.verdict
            dups.append(v.duplicates)
            lost += v.lost
            bad = []
            if v.lost:
                bad.append(f"lost {v.lost}")
            if v.order_errors:
                bad.append("; ".join(v.order_errors))
            if r.replay_errors:
                bad.append("; ".join(r.replay_errors))
            if v.duplicates != r.beyond_commit:
                bad.append(f"{v.duplicates} duplicates, but {r.beyond_commit} outputs were past the commit")
            if bad:
                failures.append(f"trial {trial}: " + ", ".join(bad))
            if (trial + 1) % 25 == 0:
                print(
                    f"  {trial + 1} trials, {len(failures)} failed, {time.monotonic() - t0:.0f} s", flush=True
                )
    total = args.partitions * args.records
    print(
        f"engine {args.engine}: {args.trials} kill -9 trials of {total} records, "
        f"commit every {args.commit_ms} ms"
    )
    print(f"  lost messages: {lost} in all trials")
    print(
        f"  duplicates per trial: mean {statistics.mean(dups):.1f}, median {statistics.median(dups):.0f}, "
        f"max {max(dups)} ({max(dups) / total:.1%} of the input), zero in {dups.count(0)} trials"
    )
    print(f"  failures: {len(failures)}; {time.monotonic() - t0:.0f} s")
    for f in failures[:20]:
        print("   ", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
