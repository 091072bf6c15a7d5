"""Regenerates the bundled views (seeded, so the same bytes every time):

    python examples/tumbling/make_data.py

Two partitions of JSON Lines page views ``{"ts", "user", "page"}`` over ten minutes, each
user in one partition. Most views are in time order; one in twenty arrives up to 4 s late
(within the job's 5 s watermark lag: still counted) and one in a hundred 90 s late (after
its minute closed: a late message).
"""

from __future__ import annotations

import argparse
import json
import random
import zlib
from pathlib import Path

PARTITIONS = 2
USERS = 40
VIEWS = 3000
START = 1_700_000_000_000  # ms since the epoch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).with_name("data"), help="the data directory"
    )
    args = parser.parse_args(argv)
    rng = random.Random(35)
    parts: list[list[tuple[int, dict[str, object]]]] = [[] for _ in range(PARTITIONS)]
    for i in range(VIEWS):
        ts = START + i * 200 + rng.randrange(200)  # 10 minutes of views
        user = f"u{rng.randrange(USERS):02d}"
        arrives = ts + (4000 if rng.random() < 0.05 else 90_000 if rng.random() < 0.01 else 0)
        view = {"ts": ts, "user": user, "page": f"/item/{rng.randrange(50)}"}
        parts[zlib.crc32(user.encode()) % PARTITIONS].append((arrives, view))
    out = args.out.expanduser() / "views"
    out.mkdir(parents=True, exist_ok=True)
    for p, views in enumerate(parts):
        views.sort(key=lambda v: v[0])  # in the order they arrive
        with open(out / f"partition-{p}.jsonl", "w") as f:
            for _, view in views:
                f.write(json.dumps(view, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
