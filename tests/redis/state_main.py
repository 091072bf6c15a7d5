"""A process that commits state through a RedisCheckpointStore: ``state_main.py SPEC_JSON``.

SPEC: url, job, lease_ms, mode.

- ``"committer"``: commits the fold of messages 1, 2, 3, ... (see :func:`fold_step`)
  in commits of ``seed``-random sizes, one commit per step, printing ``C n`` after the
  commit that covers messages 1..n; runs until killed.
- ``"zombie"``: commits messages 1..3, prints ``ready``, waits for a line on stdin,
  then tries to commit messages 4..6 and prints ``OK`` or ``FENCED <error>``.

The input partition is ``redis.in`` partition 0; offsets are ``n-0``.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from tailrace.errors import FencedError
from tailrace.redis.checkpoint import RedisCheckpointStore
from tailrace.types import SystemStreamPartition

SSP = SystemStreamPartition("redis", "in", 0)
TASK = "Partition 0"
KEYS = 53


def key_of(n: int) -> bytes:
    """The key message ``n`` counts (binary, so scans are checked in byte order)."""
    return bytes([n * 7 % KEYS]) + b"\xffk"


def fold_step(counts: dict[bytes, int], n: int) -> dict[bytes, bytes | None]:
    """Apply message ``n`` to ``counts``; returns the changed keys, encoded (None: deleted).
    Every 11th message deletes the key it names instead of counting it."""
    k = key_of(n)
    if n % 11 == 0:
        counts.pop(k, None)
        return {k: None}
    counts[k] = counts.get(k, 0) + 1
    return {k: str(counts[k]).encode()}


def fold(upto: int) -> dict[bytes, bytes]:
    counts: dict[bytes, int] = {}
    for n in range(1, upto + 1):
        fold_step(counts, n)
    return {k: str(v).encode() for k, v in counts.items()}


def commit(store: RedisCheckpointStore, counts: dict[bytes, int], first: int, last: int) -> None:
    changes: dict[bytes, bytes | None] = {}
    for n in range(first, last + 1):
        changes.update(fold_step(counts, n))
    store.write(TASK, {SSP: f"{last}-0"}, {"counts": changes})


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    store = RedisCheckpointStore(spec["url"], inputs=[SSP], lease_ms=spec["lease_ms"], retry_s=2)
    store.open(spec["job"])
    counts: dict[bytes, int] = {}
    if spec["mode"] == "committer":
        rng = random.Random(spec["seed"])
        n = 0
        while True:
            step = rng.randint(1, 40)
            commit(store, counts, n + 1, n + step)
            n += step
            print(f"C {n}", flush=True)
    commit(store, counts, 1, 3)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        commit(store, counts, 4, 6)
        print("OK", flush=True)
    except FencedError as e:
        print(f"FENCED {e}", flush=True)


if __name__ == "__main__":
    main()
