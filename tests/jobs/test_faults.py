"""Fault tests with real processes: kill -9 at random points, SIGTERM, kill during a
checkpoint write; each followed by a restart and a check for loss, duplicates and order."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from tailrace.sqlite import connect, lock_path

from .faults import CheckerJob, kill_trial, verify, wait_exit

TRIALS = 20


def test_kill_9_at_random_points_then_restart(engine: str, tmp_path: Path) -> None:
    # rule 20: a hard kill loses nothing; duplicates are exactly what ran after the last commit
    rng = random.Random(20240611)
    mid_run_kills = 0
    for trial in range(TRIALS):
        job = CheckerJob(tmp_path / f"trial-{trial}", partitions=2, records=300)
        r = kill_trial(job, engine, rng)
        where = f"trial {trial} (killed after {r.killed_after_lines} output lines)"
        assert r.verdict.lost == 0, where
        assert not r.verdict.order_errors, (where, r.verdict.order_errors)
        assert not r.replay_errors, (where, r.replay_errors)  # rule 13: resume right after the commit
        assert r.verdict.duplicates == r.beyond_commit, where
        mid_run_kills += 0 < r.killed_after_lines < 600
    assert mid_run_kills >= TRIALS // 2, "too few kills landed mid-run to mean anything"


def test_sigterm_then_restart_loses_and_repeats_nothing(engine: str, tmp_path: Path) -> None:
    # rule 19: a graceful stop commits the low watermark, so a restart replays nothing
    job = CheckerJob(tmp_path, partitions=2, records=1500, commit_ms=50)
    env = {"CHECKER_DELAY_MS": "0.5"}
    proc = job.start(engine, env)
    deadline = time.monotonic() + 30
    while job.output_lines() < 300 and time.monotonic() < deadline:
        assert proc.poll() is None, wait_exit(proc)
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    rc, err = wait_exit(proc)
    assert rc == 0, err
    assert "stopping gracefully" in err
    stopped_at = job.output_lines()
    assert stopped_at < 3000, "the job finished before the stop: the test proves nothing"
    committed = job.committed_seqs()
    outputs = job.outputs()
    for p in range(2):  # the final checkpoint covers exactly what was output
        assert outputs[p] == list(range(committed[p] + 1))
    rc, err = wait_exit(job.start(engine, env))
    assert rc == 0, err
    v = verify(job)
    assert (v.lost, v.duplicates, v.order_errors) == (0, 0, [])


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_checkpoint(engine: str, tmp_path: Path) -> None:
    job = CheckerJob(tmp_path, partitions=2, records=400, commit_ms=10)
    marker = tmp_path / "stalled"
    env = {
        "CHECKER_DELAY_MS": "0.2",
        "TAILRACE_TEST_SQLITE_STALL_AFTER": "3",
        "TAILRACE_TEST_SQLITE_STALL_MARKER": str(marker),
    }
    proc = job.start(engine, env)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, wait_exit(proc)
            assert time.monotonic() < deadline, "the store never reached the stall hook"
            time.sleep(0.005)
        # the transaction is open: readers still see the previous checkpoint
        before = job.committed_seqs()
        assert any(s >= 0 for s in before.values())
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        wait_exit(proc)
    connect(job.store, create=False).close()  # intact (integrity check passes)
    assert job.committed_seqs() == before
    outputs = job.outputs()
    for p in range(2):
        assert outputs[p][: before[p] + 1] == list(range(before[p] + 1))
    rc, err = wait_exit(job.start(engine, {"CHECKER_DELAY_MS": "0"}))
    assert rc == 0, err
    v = verify(job)
    assert v.lost == 0 and not v.order_errors, v
    assert v.duplicates == sum(sum(1 for s in outputs[p] if s > before[p]) for p in range(2))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_second_container_is_refused_while_one_runs(engine: str, tmp_path: Path, signum: int) -> None:
    job = CheckerJob(tmp_path, partitions=1, records=5000, commit_ms=60000)
    proc = job.start(engine, {"CHECKER_DELAY_MS": "1"})
    try:
        deadline = time.monotonic() + 30
        lock = lock_path(job.store, "checker")
        while not (lock.exists() and lock.read_text().strip() == str(proc.pid)):
            assert proc.poll() is None, wait_exit(proc)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        rc, err = wait_exit(job.start(engine))
        assert rc == 1
        assert "is in use by another container for job 'checker'" in err
        proc.send_signal(signum)
        rc, err = wait_exit(proc)
        assert rc == 0, err
    finally:
        proc.kill()
        proc.wait()
