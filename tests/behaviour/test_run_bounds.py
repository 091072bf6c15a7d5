"""A due barrier or a stop ends a run of buffered messages (rules 8, 9, 19, 23; issue 13, 14).

Both engines used to hand a sync task a run of buffered messages (the C loop up to
64 on the loop thread, 128 ahead on a pool worker; the reference engine read the
clock once per 256 dispatches) and only looked at the clock afterwards. With slow
``process`` calls, windows and commits came several times later than configured
and a stop let dozens of calls start after it. Once a window, commit or timer is
due, or a stop is requested, at most the message in progress may still start.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tailrace import StreamTask

from .helpers import bounded, run_job, start, wait_until

SLOW_S = 0.010
WINDOW_MS = 100


@pytest.mark.parametrize("pool", [0, 1])
def test_window_comes_on_time_between_slow_messages(engine: str, pool: int) -> None:
    # rule 8: a due window waits at most for the message in progress
    stamps: list[float] = []

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            time.sleep(SLOW_S)

        def window(self, collector: Any, coordinator: Any) -> None:
            stamps.append(time.monotonic())

    t0 = time.monotonic()
    run_job(
        engine,
        Task,
        bounded([list(range(60))]),
        **{"task.window.ms": WINDOW_MS, "job.container.thread.pool.size": pool},
    )
    gaps = [b - a for a, b in zip([t0, *stamps], stamps)]
    assert len(stamps) >= 3, f"windows at {gaps}"
    # a window is due every 100 ms and may wait for one 10 ms message: allow scheduling noise
    assert max(gaps) < (WINDOW_MS / 1000 + SLOW_S) * 1.6, f"gaps between windows: {gaps}"


@pytest.mark.parametrize("pool", [0, 1])
def test_stop_lets_at_most_the_message_in_progress_start(engine: str, pool: int) -> None:
    # rule 19: after stop() returns, at most the process call in progress may still start
    started: list[float] = []
    lock = threading.Lock()

    class Task(StreamTask):
        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            with lock:
                started.append(time.monotonic())
            time.sleep(SLOW_S)

    bg, _store = start(engine, Task, bounded([list(range(1000))]), **{"job.container.thread.pool.size": pool})
    wait_until(lambda: len(started) >= 5, what="five process calls")
    bg.container.stop()
    stopped_at = time.monotonic()
    bg.join()
    with lock:
        late = [s for s in started if s > stopped_at]
    assert len(late) <= 1, f"{len(late)} process calls started after stop()"
