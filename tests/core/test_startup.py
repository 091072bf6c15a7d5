"""Start-up cost: a sync job never imports asyncio (about a third of ``import tailrace``
before it was made lazy); an ``async def process`` task still runs on it."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import tailrace
from tailrace import Container, MemorySystem

class Sync(tailrace.StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("mem.out", envelope.message)

class Async(tailrace.AsyncStreamTask):
    async def process(self, envelope, collector, coordinator):
        collector.send("mem.out", envelope.message)

def run(task):
    mem = MemorySystem("mem").add_stream("in", [[1, 2, 3]])
    Container(task, inputs=["mem.in"], systems=[mem]).run()
    return mem.messages("out")

print(run(Sync), "asyncio" in sys.modules)
print(run(Async), "asyncio" in sys.modules)
"""


def test_a_sync_job_does_not_import_asyncio_and_an_async_one_does() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[1, 2, 3] False", "[1, 2, 3] True"]
