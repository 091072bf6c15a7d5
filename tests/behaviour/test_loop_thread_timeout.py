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

from tailrace import CallbackTimeoutError, StreamTask

from .helpers import bounded, run_job


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
