"""Stress mode of the stateful kill -9 trials (not run by CI): hundreds of seeded trials.

    python -m tests.stores.state_stress --trials 300            # every engine and task kind
    python -m tests.stores.state_stress --trials 100 --engine c --kind pool

Exits 1 if any committed state differed from the fold of its committed input, or the
final state from the fold of the whole input.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `tests.stores` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.stores.trials import KINDS, run_trial
else:
    from .trials import KINDS, run_trial


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--engine", choices=["c", "python", "both"], default="both")
    ap.add_argument("--kind", choices=[*KINDS, "all"], default="all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--records", type=int, default=3000, help="records per partition")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    engines = ["c", "python"] if args.engine == "both" else [args.engine]
    kinds = list(KINDS) if args.kind == "all" else [args.kind]
    failures: list[str] = []
    kills = mid = 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tailrace-state-stress-") as tmp:
        for trial in range(args.trials):
            engine, kind = engines[trial % len(engines)], kinds[(trial // len(engines)) % len(kinds)]
            r = run_trial(Path(tmp) / f"t{trial}", kind, engine, rng, records=args.records, max_kills=5)
            kills += r.kills
            mid += r.mid_run_kills
            if r.errors:
                failures.append(f"trial {trial} ({engine}, {kind}): " + "; ".join(r.errors))
            if (trial + 1) % 25 == 0:
                print(
                    f"{trial + 1} trials, {kills} kills ({mid} mid-run), {len(failures)} failed", flush=True
                )
    print(f"{args.trials} trials, {kills} kills ({mid} mid-run) in {time.monotonic() - t0:.1f}s")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
