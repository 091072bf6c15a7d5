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


RANGE_READER = """
import gc, sys
import tailrace
from tailrace.interfaces import PartitionReader, Producer, System

class Msg:
    pass

MSGS = [Msg() for _ in range(10)]

class Reader(PartitionReader):
    def start(self, after, wakeup):
        pass
    def poll(self, n):
        return []
    def at_end(self):
        return False
    def _tailrace_poll_range(self, n):
        # a fresh list each call (the eager path), one element short of `end`
        return list(MSGS[:9]), None, 0, 10

class P(Producer):
    def partitions(self, stream):
        return 1
    def send(self, *a):
        pass

class Sys(System):
    def __init__(self):
        super().__init__("ls")
    def partitions(self, stream):
        return 1
    def reader(self, ssp):
        return Reader(ssp)
    def producer(self):
        return P()

class T(tailrace.StreamTask):
    def process(self, e, c, co):
        pass

gc.collect()
before = [sys.getrefcount(m) for m in MSGS]
try:
    tailrace.Container(T, inputs=["ls.in"], systems=[Sys()], engine="c").run()
    print("no error")
except Exception as e:
    print("raised:", type(e).__name__, e)
gc.collect()
after = [sys.getrefcount(m) for m in MSGS]
print("deltas", [a - b for a, b in zip(after, before)])
"""


def test_range_reader_short_list_raises_naming_reader_and_leaks_nothing() -> None:
    # defect 3: _refill_range's eager fallback indexed the reader's lists up to `end` without
    # bounds checks in exactly the case the lazy path's length check rejected: SIGSEGV
    proc = run_child(RANGE_READER)
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr}"
    assert "raised:" in proc.stdout, proc.stdout
    assert "ls.in" in proc.stdout and "partition 0" in proc.stdout, proc.stdout
    assert "only 9 messages" in proc.stdout, proc.stdout
    assert "deltas [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]" in proc.stdout, proc.stdout
