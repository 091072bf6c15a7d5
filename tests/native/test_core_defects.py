"""Regression tests for the core defects of issue 13 that only the C engine had.

Each job runs in a child process with a deadline: a hang with the GIL held
cannot be timed out from a thread of the same interpreter, and a crash must
fail the test, not the test run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

DEADLINE_S = 90.0


def run_child(code: str, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; fail naming the hang if it passes ``timeout``."""
    script = "import faulthandler, sys\nfaulthandler.dump_traceback_later(%r, exit=True)\n" % (
        timeout - 5
    ) + textwrap.dedent(code)
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"child hung for {timeout} s: {e.stderr!r}") from None


def test_pool_wide_window_many_partitions_does_not_hang() -> None:
    # defect 1: the completion queue's bound (loop.h) held only on paper; a sync task on the
    # pool with task.max.concurrency 1000 over several partitions filled it, and a worker
    # spun on it holding the GIL that the loop thread (its only consumer) waited for
    proc = run_child(
        """
        import tailrace

        class Noop(tailrace.StreamTask):
            def process(self, envelope, collector, coordinator):
                pass

        mem = tailrace.MemorySystem("mem")
        inputs = []
        for s in range(7):
            mem.add_stream(f"s{s}", [list(range(100_000))])
            inputs.append(f"mem.s{s}")
        cfg = {"task.max.concurrency": 1000, "job.container.thread.pool.size": 1,
               "task.commit.ms": 1, "task.async.commit": True}
        res = tailrace.Container(Noop, inputs=inputs, systems=[mem], config=cfg, engine="c").run()
        print("processed", res.processed)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "processed 700000" in proc.stdout
