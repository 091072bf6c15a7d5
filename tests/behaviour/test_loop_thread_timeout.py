"""A sync ``process`` on the loop thread is timed out too (rules 3, 16; issue 13, defect 15).

On the pool a call past ``task.callback.timeout.ms`` fails the container with
``CallbackTimeoutError``; on the loop thread the same call used to be accepted on
both engines. Now it fails when it returns, and while it still runs a warning names
the task, partition and offset with the stack of the stuck call.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from tailrace import CallbackTimeoutError, MemorySystem, StreamTask

from .helpers import bounded, run_job, start


def test_slow_sync_call_on_loop_thread_fails_and_warns_while_running(
    engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    processed: list[int] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            if envelope.offset == 2:
                time.sleep(0.8)  # a stuck call: four times the limit
            processed.append(envelope.offset)

    with caplog.at_level(logging.WARNING, logger="tailrace"):
        with pytest.raises(CallbackTimeoutError) as info:
            run_job(engine, Task, bounded([list(range(10))]), **{"task.callback.timeout.ms": 200})
    err = info.value
    assert err.offset == 2, err
    assert "task.callback.timeout.ms=200" in str(err)
    assert processed[:3] == [0, 1, 2]
    assert 3 not in processed  # nothing after the late call (rule 18: the task halts there)
    warnings = [r.getMessage() for r in caplog.records if "has been running for" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    text = warnings[0]
    assert "mem.in[0]" in text and "offset 2" in text, text  # names partition and offset
    assert "in process" in text and "time.sleep" in text, text  # the stack of the stuck call


def test_fast_sync_calls_with_a_timeout_pass(engine: str) -> None:
    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            pass

    result, _ = run_job(engine, Task, bounded([list(range(500))]), **{"task.callback.timeout.ms": 5000})
    assert result.processed == 500


def test_time_queued_for_a_pool_thread_counts_toward_the_timeout(engine: str) -> None:
    """docs/running-jobs.md: the deadline counts from hand-out (rule 16, as Samza), so a
    message that waits behind a slow call for the one pool thread times out although its
    own call is short."""
    ran: list[tuple[int, float]] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            took = {0: 0.7, 1: 0.5}.get(envelope.offset, 0.0)
            time.sleep(took)
            ran.append((envelope.offset, took))

    with pytest.raises(CallbackTimeoutError) as info:
        run_job(
            engine,
            Task,
            bounded([list(range(4))]),
            **{
                "task.callback.timeout.ms": 1000,
                "job.container.thread.pool.size": 1,
                "task.max.concurrency": 2,
            },
        )
    assert info.value.offset == 1, info.value  # 0.7 s queued + 0.5 s of its own: past 1 s
    assert ran[:1] == [(0, 0.7)]  # offset 1 was still in its call at its deadline


def test_a_call_that_completed_in_time_is_not_timed_out_behind_a_later_one(engine: str) -> None:
    """Rule 16 on the pool: offset 0 completes at 0.6 s (timeout 1 s); offset 1, handed
    out at ~0.4 s, runs on the same pool thread until ~1.1 s, inside its own deadline
    (~1.4 s). Nothing times out. (The C pool buffered offset 0's completion behind the
    second call, so the loop saw it unfinished at its deadline and failed the run.)"""
    system = MemorySystem().add_live_stream("in", 1)

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            time.sleep({0: 0.6, 1: 0.5}.get(envelope.offset, 0.0))

    bg, _ = start(
        engine,
        Task,
        system,
        **{
            "task.callback.timeout.ms": 1000,
            "job.container.thread.pool.size": 1,
            "task.max.concurrency": 2,
        },
    )
    system.append("in", 0, "a")
    time.sleep(0.4)
    system.append("in", 0, "b")
    system.end("in")
    assert bg.join().processed == 2
