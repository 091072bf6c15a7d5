"""Seeded kill -9 trials with bad messages under ``task.error.policy = dead-letter`` (issue 36's
Tests; rules 20, 26, 39, 40), both engines: outputs plus dead letters cover every input message,
the committed state is the fold of the good messages exactly, every bad message is in the dead
letters, and copies beyond the first are only those a kill past the last commit allows.
Stress mode: ``TAILRACE_BAD_MESSAGE_TRIALS=300 python -m pytest tests/jobs/test_bad_message_kills.py``
(trials per engine; see bad_trials.py)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from .bad_trials import bad_trial

TRIALS = int(os.environ.get("TAILRACE_BAD_MESSAGE_TRIALS", "6"))  # per engine: 12 in CI


@pytest.mark.timeout(max(120, 10 * TRIALS))  # the stress mode's hundreds of trials too
def test_dead_letters_and_state_are_exact_after_kill_9_and_restart(engine: str, tmp_path: Path) -> None:
    rng = random.Random(f"{engine}-bad-messages-36")
    kills = mid = duplicates = 0
    failures = []
    for trial in range(TRIALS):
        r = bad_trial(tmp_path / f"t{trial}", engine, rng)
        if r.errors:
            failures.append((trial, r.errors))
        kills += r.kills
        mid += r.mid_run_kills
        duplicates += r.duplicates
    assert not failures, failures[:5]
    assert mid >= min(TRIALS, 3), f"only {mid} of {kills} kills landed mid-run: the trials prove little"
