"""Regenerates the bundled clicks (seeded, so the same bytes every time):

    python examples/sessions/make_data.py

Three partitions of JSON Lines clicks ``{"ts", "user", "page"}`` in time order, each user
in one partition (placed by key, as a producer would place them).

A larger input, for a run long enough to stop (Ctrl-C) or kill (kill -9) halfway, into a
copy of the example (the bundled data is what the tests check)::

    cp -r examples/sessions ~/tailrace-sessions
    python examples/sessions/make_data.py --users 100000 --out ~/tailrace-sessions/data

(``--users 100000``: about 1.6M clicks, 110 MB.)
"""

from __future__ import annotations

import argparse
import json
import random
import zlib
from pathlib import Path

PARTITIONS = 3
USERS = 300
START = 1_700_000_000  # 2023-11-14, seconds since the epoch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--users", type=int, default=USERS, help=f"users to make clicks for (default {USERS})"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).with_name("data"),
        help="the data directory (default: the bundled one)",
    )
    args = parser.parse_args(argv)
    rng = random.Random(12)
    parts: list[list[dict[str, object]]] = [[] for _ in range(PARTITIONS)]
    for u in range(args.users):
        user = f"u{u:03d}"
        ts = START + rng.randrange(3600)
        for _ in range(rng.randint(1, 6)):  # visits, separated by long gaps
            for _ in range(rng.randint(1, 12)):  # clicks of one visit, seconds to minutes apart
                page = f"/{rng.choice(['home', 'search', 'item', 'cart', 'help'])}/{rng.randrange(20)}"
                parts[zlib.crc32(user.encode()) % PARTITIONS].append({"ts": ts, "user": user, "page": page})
                ts += rng.randint(5, 600)
            ts += rng.randint(1900, 20000)  # more than the 30-minute session gap
    out = args.out.expanduser() / "clicks"
    out.mkdir(parents=True, exist_ok=True)
    for p, clicks in enumerate(parts):
        clicks.sort(key=lambda c: (c["ts"], c["user"]))
        with open(out / f"partition-{p}.jsonl", "w") as f:
            for c in clicks:
                f.write(json.dumps(c, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
