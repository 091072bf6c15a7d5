"""Seeded kill -9 trials of a windowed job (issue 35; SEMANTICS rules 20, 25-27, 32-38, mainly
36), both engines, checkpoints in SQLite and in a real redis-server: after kills and restarts
each window's final result is the fold of exactly its messages that are not late, every
message is in exactly one window per kind or on the late stream, copies of a result are
identical, and the late streams hold exactly the messages the rules make late (see
window_trials.py). Stress mode (trials per engine and store):
``TAILRACE_WINDOW_TRIALS=200 python -m pytest tests/jobs/test_window_kills.py``."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from .window_trials import REDIS_SERVER, Redis, window_trial

TRIALS = os.environ.get("TAILRACE_WINDOW_TRIALS")
# CI: 6 per engine on SQLite and 4 on Redis (a restart waits out the dead run's lease): 20 in all
SQLITE_TRIALS = int(TRIALS or 6)
REDIS_TRIALS = int(TRIALS or 4)


def _run(engine: str, root: Path, store: str, trials: int, redis_url: str | None = None) -> None:
    rng = random.Random(f"{engine}-{store}-windows-36")
    kills = mid = late = duplicates = 0
    failures = []
    for trial in range(trials):
        seed = rng.randrange(1 << 30)
        r = window_trial(root / f"t{trial}", engine, random.Random(seed), store=redis_url or "sqlite")
        if r.errors:
            failures.append((f"trial {trial} seed {seed} engine {engine} store {store}", r.errors[:6]))
        kills += r.kills
        mid += r.mid_run_kills
        late += r.late
        duplicates += r.duplicates
    print(
        f"{engine}/{store}: {trials} trials, {kills} kills, {mid} mid-run, {late} late, {duplicates} copies"
    )
    assert not failures, failures[:3]
    assert mid >= min(trials, 3), f"only {mid} of {kills} kills landed mid-run: the trials prove little"
    assert late >= trials, f"only {late} late messages in {trials} trials: the late path is barely run"


@pytest.mark.timeout(max(120, 20 * SQLITE_TRIALS))
def test_windows_are_exact_after_kill_9_sqlite(engine: str, tmp_path: Path) -> None:
    _run(engine, tmp_path, "sqlite", SQLITE_TRIALS)


@pytest.mark.redis
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
@pytest.mark.timeout(max(120, 20 * REDIS_TRIALS))
def test_windows_are_exact_after_kill_9_redis(engine: str, tmp_path: Path) -> None:
    # redis-py's own module: where it is not installed (the other Pythons' lanes), "redis"
    # alone imports tests/redis as a namespace package
    pytest.importorskip("redis.client")
    server = Redis(tmp_path / "redis")
    try:
        _run(engine, tmp_path, "redis", REDIS_TRIALS, server.url)
    finally:
        server.kill()
