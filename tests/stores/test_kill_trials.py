"""Seeded kill -9 trials of a stateful job, both engines, every task kind, SQLite
(rules 20, 26, 27): after each kill the committed state is the fold of exactly the
committed input, and after the last restart the state is the fold of the whole input.
Stress mode: ``python -m tests.stores.state_stress --trials 300``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .trials import KINDS, run_trial

TRIALS_PER_CASE = 3  # 4 kinds x 2 engines x 3 = 24 trials


@pytest.mark.parametrize("kind", KINDS)
def test_state_is_exact_after_kill_9_and_restart(engine: str, kind: str, tmp_path: Path) -> None:
    rng = random.Random(f"{engine}-{kind}-2611")
    kills = mid = 0
    for trial in range(TRIALS_PER_CASE):
        r = run_trial(tmp_path / f"t{trial}", kind, engine, rng)
        assert not r.errors, (trial, r.errors)
        kills += r.kills
        mid += r.mid_run_kills
    assert mid >= 2, f"only {mid} of {kills} kills landed mid-run: the trials prove little"
