"""The C engine formats nothing for a message that succeeds.

Error messages name the task, the partition and the offset; building one costs
thousands of instructions (an SSP made and formatted, the offset's repr), so it
must be built only when the C call it describes has failed. The pool path once
built its completion message for every message, success or not: 5x the cost per
message of the thread pool. An offset type that counts its reprs pins this on
every path a message takes through the C engine.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_refcounts import _ListSystem  # prebuilt envelopes with any offsets (this directory)

from tailrace import AsyncStreamTask, Container, StreamTask
from tailrace._core import Envelope


class CountedOffset(str):
    """A string offset that counts how often it is formatted."""

    formatted = 0

    def __repr__(self) -> str:
        CountedOffset.formatted += 1
        return super().__repr__()

    def __str__(self) -> str:
        CountedOffset.formatted += 1
        return super().__str__()

    def __format__(self, spec: str) -> str:
        CountedOffset.formatted += 1
        return super().__format__(spec)


SEEN: list[int] = []  # CountedOffset.formatted as each process call found it


class Sync(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        SEEN.append(CountedOffset.formatted)


class InlineAsync(AsyncStreamTask):
    def process_async(self, envelope: Any, collector: Any, coordinator: Any, callback: Any) -> None:
        SEEN.append(CountedOffset.formatted)
        callback.complete()


@pytest.mark.parametrize(
    ("task", "config"),
    [
        (Sync, {}),  # runs of messages (_run_sync)
        (Sync, {"task.max.concurrency": 4}),  # one message at a time (PROCESS ops)
        (Sync, {"job.container.thread.pool.size": 2}),  # the thread pool (pool_done)
        (InlineAsync, {}),  # callbacks completed inline (_run_async)
        (InlineAsync, {"task.max.concurrency": 8}),
    ],
    ids=["runs", "process-ops", "pool", "async-runs", "async-c8"],
)
def test_a_successful_message_formats_no_offset(task: type, config: dict[str, Any]) -> None:
    n = 300
    SEEN.clear()
    CountedOffset.formatted = 0
    system = _ListSystem(
        [[Envelope("ls", "in", p, CountedOffset(f"{i:08d}"), None, i) for i in range(n)] for p in range(2)]
    )
    result = Container(task, inputs=["ls.in"], systems=[system], config=config, engine="c").run()
    assert result.processed == 2 * n
    assert len(SEEN) == 2 * n
    # formatted between two messages would show in a later call's count
    assert max(SEEN) == 0, f"offsets formatted while messages succeeded: {max(SEEN)} times"
