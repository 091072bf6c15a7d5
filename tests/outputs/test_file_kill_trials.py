"""Seeded kill -9 trials of exactly-once file outputs (rule 41), both engines: one
container, ``--containers 2`` (kill -9 of the group, of one container or of the parent), and
a chained pair of jobs, each killed. After the last run the outputs hold exactly the records
of a run without a crash (multiset and per-key order, no duplicate); after every kill, a
reader of the committed outputs sees each record at most once, each key's a prefix in order.
Stress mode: ``TAILRACE_STRESS_TRIALS=100 pytest tests/outputs/test_file_kill_trials.py``."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .file_trials import run_trial, stress_trials


@pytest.mark.parametrize("engine", ["c", "python"])
@pytest.mark.parametrize("containers", [1, 2])
def test_file_outputs_are_exact_after_kill_9_and_restart(
    engine: str, containers: int, tmp_path: Path
) -> None:
    rng = random.Random(f"eo-files-{engine}-{containers}-37")
    trials = stress_trials(3)
    mid = 0
    for trial in range(trials):
        landed, errors = run_trial(tmp_path / f"t{trial}", engine, containers, rng)
        assert not errors, (trial, errors)
        mid += landed
    assert mid >= trials, f"only {mid} kills landed mid-run: the trials prove little"


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_chained_pair_of_jobs_ends_exact_after_kills_of_either(engine: str, tmp_path: Path) -> None:
    rng = random.Random(f"eo-chained-{engine}-37")
    for trial in range(stress_trials(1)):
        landed, errors = run_trial(tmp_path / f"t{trial}", engine, 2, rng, chained=True)
        assert not errors, (trial, errors)
        assert landed >= 1
